"""A disk tier's drives as data: sequential bandwidth and typical latency, each with its source.

A :class:`DiskSpec` prices copies to and from the disk level (level 2) in the simulator
(:mod:`kvsim.sim.stream`): each batch waits the drive's typical latency once (its pages are
issued together, as parallel I/Os), then moves its bytes on a fluid link of ``drives`` x the
sequential rates (reads onboard, writes offload). While reads and writes run at once each gets
half its rate: a drive's reads and writes share its flash and controller (a modelling choice:
no published mixed read/write figure was found). A copy between the disk and the GPU moves the
bytes over the disk and the CPU-GPU link at once, at the slower of the two: a pipelined bounce
through host memory and GPUDirect Storage deliver the same bandwidth on one drive (Solidigm,
"Accelerating AI With High Performance Storage": 6.64 GiB/s through the CPU against 6.59 GiB/s
with GDS at 1 MiB I/Os, https://www.solidigm.com/products/technology/accelerating-ai-with-high-performance-storage.html),
so kvsim models one path for both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError

DISKS_DIR = Path(__file__).resolve().parent / "disks"
# Reads and writes at once: each direction's share of its solo rate (see the module doc).
MIXED_FACTOR = 0.5


@dataclass(frozen=True)
class DiskSpec:
    name: str
    read_gbps: float
    write_gbps: float
    read_latency_us: float
    write_latency_us: float
    drives: int = 1

    @property
    def per_direction_gbps(self) -> dict[str, float]:
        """Striped over ``drives``: reads onboard, writes offload."""
        return {"onboard": self.read_gbps * self.drives, "offload": self.write_gbps * self.drives}

    def latency_s(self, direction: str) -> float:
        return (self.read_latency_us if direction == "onboard" else self.write_latency_us) * 1e-6


def known_disks() -> list[str]:
    return sorted(p.stem for p in DISKS_DIR.glob("*.json"))


def load_disk(name_or_path: str, drives: int = 1) -> DiskSpec:
    """A shipped disk preset by name, or a JSON file of the same fields."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = DISKS_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ConfigError(f"unknown disk {name_or_path!r} (shipped: {', '.join(known_disks())})")
    doc = json.loads(path.read_text())
    fields = ("read_gbps", "write_gbps", "read_latency_us", "write_latency_us")
    bad = [f for f in fields if not isinstance(doc.get(f), (int, float)) or doc[f] < 0
           or (f.endswith("gbps") and doc[f] == 0)]
    if bad:
        raise ConfigError(f"{path}: {', '.join(bad)} must be numbers (bandwidths > 0, "
                          "latencies >= 0)")
    return DiskSpec(str(doc.get("name", path.stem)), *(float(doc[f]) for f in fields),
                    drives=drives)
