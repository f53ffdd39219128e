"""Hardware specs: links, copy engines, the copy kernel and KVCM2's grid policy, as data.

A spec is a JSON file in which every number is ``{"value": ..., "source": "..."}``: the seed, a
datasheet or a measurement file in this repository. ``load_hardware`` accepts a preset name
(``h100-pcie``, ``h200-sxm``, ``gh200``, ``gb200``, ``b200``) or a path, checks that every
number names its source, and returns a frozen :class:`HardwareSpec` plus the source of each field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

PRESET_DIR = Path(__file__).with_name("presets")
DIRECTIONS = ("offload", "onboard")  # offload = GPU -> host (D2H), onboard = host -> GPU (H2D)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


@dataclass(frozen=True)
class PerDirection:
    offload: float
    onboard: float

    def __getitem__(self, direction: str) -> float:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'offload' or 'onboard', got {direction!r}")
        return self.offload if direction == "offload" else self.onboard


@dataclass(frozen=True)
class LinkSpec:
    """The CPU-GPU link. ``per_direction_gbps`` is what one direction moves alone."""

    kind: str  # "pcie" | "c2c"
    coherent: bool
    detected_gbps: float  # what topology detection reports; the grid policy's input
    per_direction_gbps: PerDirection  # achievable by one direction alone (GB/s = 1e9 B/s)
    # Each direction's share of its solo bandwidth while the other direction is busy too.
    bidirectional_factor: float


@dataclass(frozen=True)
class CopyEngineSpec:
    """Copy engines (DMA): ``cudaMemcpyAsync`` per page and ``cudaMemcpyBatchAsync``."""

    count: int  # asyncEngineCount
    plateau_gbps: PerDirection  # large contiguous copies
    per_copy_device_us: PerDirection  # fixed device time of one cudaMemcpyAsync
    per_call_host_us: float  # host time to issue one cudaMemcpyAsync
    batch_call_host_us: float  # host time of one cudaMemcpyBatchAsync call ...
    batch_descriptor_host_us: float  # ... plus this per descriptor
    # Batched-copy throughput by page size: [[page_bytes, gbps], ...] per direction, ascending;
    # interpolated in log(page_bytes), clamped at the ends. Captures the small-copy cliff.
    batch_curve: dict[str, tuple[tuple[float, float], ...]]


@dataclass(frozen=True)
class KernelSpec:
    """The LDGSTS (cp.async) paged copy kernel: Little's law per CTA up to a plateau.

    One CTA with ``b`` bytes in flight moves ``lambda(b) = b / (latency + b / per_cta_max)``
    (a round trip of ``latency`` per window of ``b`` bytes, and at most ``per_cta_max`` however
    deep the window; None = no such limit). N CTAs approach the plateau ``Xmax`` as
    ``min(N*lambda, Xmax)`` (``knee_p`` None) or ``Xmax * (1 - exp(-(N*lambda/Xmax)**p))**(1/p)``.
    """

    sm_count: int
    threads_per_cta: int
    tile_bytes: int  # bytes one CTA moves per tile; pages are packed into or split across tiles
    default_inflight_bytes: PerDirection  # bytes in flight per CTA when a run does not say
    latency_us: PerDirection
    per_cta_max_gbps: dict[str, float | None]
    plateau_gbps: PerDirection  # Xmax
    knee_p: dict[str, float | None]
    bidirectional_factor: float  # fraction of each direction's plateau kept while both run
    launch_host_us: float
    unaligned_efficiency: PerDirection  # alignment-agnostic kernel throughput / fast kernel
    # Extra time per page in each CTA's window (the page's slot-index load before its chunks can
    # be addressed): lambda(b) = b / (latency + b / per_cta_max + (b / page_bytes) * this).
    page_latency_us: PerDirection


@dataclass(frozen=True)
class CopierSpec:
    """What this project's hardware copier (:class:`hw.executor_copies.PlanCopier`) adds to a
    kernel-path batch on this machine, beyond the kernel launches: device time before the first
    launch runs (the slot-index upload) and host time to submit (path selection, CUDA events,
    index upload), per batch and per page; and the extra device time of a batch that starts
    after the copy stream has been idle for at least ``idle_after_ms``."""

    batch_device_us: PerDirection
    submit_batch_host_us: float
    submit_page_host_us: float
    idle_wake_us: PerDirection
    idle_after_ms: float


@dataclass(frozen=True)
class GridPolicy:
    """KVCM2's CTA sizing: cap = efficiency x link (coherent: <= host sustained); Little's law."""

    per_cta_gbps: float  # kPerCtaGBs
    link_efficiency: float  # kLinkEfficiency
    host_sustained_gbps: float  # kHostSustainedGBs (coherent links only)
    grid_mult: PerDirection  # kOffloadGridMult, kOnboardGridMult


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    description: str
    gpu: str
    link: LinkSpec
    copy_engine: CopyEngineSpec
    kernel: KernelSpec
    grid_policy: GridPolicy
    copier: CopierSpec
    device_copy_gbps: float  # copies within one level (partial-reuse and defragmentation copies)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def default_path(self) -> str:
        """KVCM2's choice: the kernel on coherent links, batched copy engine on PCIe."""
        return "kernel" if self.link.coherent else "ce-batch"


def _strip_sources(node: Any, path: str, sources: dict[str, str], filename: str) -> Any:
    """Turn ``{"value": v, "source": s}`` leaves into ``v``; every number must have one."""
    if isinstance(node, dict):
        if set(node) == {"value", "source"}:
            if not isinstance(node["source"], str) or not node["source"].strip():
                raise ConfigError(f"{filename}: {path}: source must be a non-empty string")
            sources[path] = node["source"]
            return node["value"]
        return {k: _strip_sources(v, f"{path}.{k}" if path else k, sources, filename)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_strip_sources(v, f"{path}.{i}", sources, filename) for i, v in enumerate(node)]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        raise ConfigError(f"{filename}: {path}: the number {node} names no source; "
                          'write {"value": ..., "source": "..."}')
    return node


def _per_direction(d: dict, where: str) -> PerDirection:
    try:
        return PerDirection(float(d["offload"]), float(d["onboard"]))
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: needs numeric 'offload' and 'onboard'") from None


def _build(data: dict, sources: dict[str, str], filename: str) -> HardwareSpec:
    def need(d: dict, key: str, where: str) -> Any:
        if not isinstance(d, dict) or key not in d:
            raise ConfigError(f"{filename}: {where}.{key}: required field is missing")
        return d[key]

    link = need(data, "link", "")
    ce = need(data, "copy_engine", "")
    k = need(data, "kernel", "")
    gp = need(data, "grid_policy", "")
    cp = need(data, "copier", "")
    curve = {}
    for direction in DIRECTIONS:
        points = need(need(ce, "batch_curve", "copy_engine"), direction, "copy_engine.batch_curve")
        pts = tuple((float(a), float(b)) for a, b in points)
        if not pts or any(b <= 0 or a <= 0 for a, b in pts) or \
                list(pts) != sorted(pts):
            raise ConfigError(f"{filename}: copy_engine.batch_curve.{direction}: needs ascending "
                              "[page_bytes, gbps] pairs, all positive")
        curve[direction] = pts
    spec = HardwareSpec(
        name=str(need(data, "name", "")),
        description=str(data.get("description", "")),
        gpu=str(need(data, "gpu", "")),
        link=LinkSpec(
            kind=str(need(link, "kind", "link")),
            coherent=bool(need(link, "coherent", "link")),
            detected_gbps=float(need(link, "detected_gbps", "link")),
            per_direction_gbps=_per_direction(need(link, "per_direction_gbps", "link"),
                                              f"{filename}: link.per_direction_gbps"),
            bidirectional_factor=float(need(link, "bidirectional_factor", "link")),
        ),
        copy_engine=CopyEngineSpec(
            count=int(need(ce, "count", "copy_engine")),
            plateau_gbps=_per_direction(need(ce, "plateau_gbps", "copy_engine"),
                                        f"{filename}: copy_engine.plateau_gbps"),
            per_copy_device_us=_per_direction(need(ce, "per_copy_device_us", "copy_engine"),
                                              f"{filename}: copy_engine.per_copy_device_us"),
            per_call_host_us=float(need(ce, "per_call_host_us", "copy_engine")),
            batch_call_host_us=float(need(ce, "batch_call_host_us", "copy_engine")),
            batch_descriptor_host_us=float(need(ce, "batch_descriptor_host_us", "copy_engine")),
            batch_curve=curve,
        ),
        kernel=KernelSpec(
            sm_count=int(need(k, "sm_count", "kernel")),
            threads_per_cta=int(need(k, "threads_per_cta", "kernel")),
            tile_bytes=int(need(k, "tile_bytes", "kernel")),
            default_inflight_bytes=_per_direction(need(k, "default_inflight_bytes", "kernel"),
                                                  f"{filename}: kernel.default_inflight_bytes"),
            latency_us=_per_direction(need(k, "latency_us", "kernel"),
                                      f"{filename}: kernel.latency_us"),
            per_cta_max_gbps={d: need(need(k, "per_cta_max_gbps", "kernel"), d,
                                      "kernel.per_cta_max_gbps") for d in DIRECTIONS},
            plateau_gbps=_per_direction(need(k, "plateau_gbps", "kernel"),
                                        f"{filename}: kernel.plateau_gbps"),
            knee_p={d: need(need(k, "knee_p", "kernel"), d, "kernel.knee_p") for d in DIRECTIONS},
            bidirectional_factor=float(need(k, "bidirectional_factor", "kernel")),
            launch_host_us=float(need(k, "launch_host_us", "kernel")),
            unaligned_efficiency=_per_direction(need(k, "unaligned_efficiency", "kernel"),
                                                f"{filename}: kernel.unaligned_efficiency"),
            page_latency_us=_per_direction(need(k, "page_latency_us", "kernel"),
                                           f"{filename}: kernel.page_latency_us"),
        ),
        copier=CopierSpec(
            batch_device_us=_per_direction(need(cp, "batch_device_us", "copier"),
                                           f"{filename}: copier.batch_device_us"),
            submit_batch_host_us=float(need(cp, "submit_batch_host_us", "copier")),
            submit_page_host_us=float(need(cp, "submit_page_host_us", "copier")),
            idle_wake_us=_per_direction(need(cp, "idle_wake_us", "copier"),
                                        f"{filename}: copier.idle_wake_us"),
            idle_after_ms=float(need(cp, "idle_after_ms", "copier")),
        ),
        grid_policy=GridPolicy(
            per_cta_gbps=float(need(gp, "per_cta_gbps", "grid_policy")),
            link_efficiency=float(need(gp, "link_efficiency", "grid_policy")),
            host_sustained_gbps=float(need(gp, "host_sustained_gbps", "grid_policy")),
            grid_mult=_per_direction(need(gp, "grid_mult", "grid_policy"),
                                     f"{filename}: grid_policy.grid_mult"),
        ),
        device_copy_gbps=float(need(data, "device_copy_gbps", "")),
        sources=sources,
    )
    if spec.link.kind not in ("pcie", "c2c"):
        raise ConfigError(f"{filename}: link.kind must be 'pcie' or 'c2c', got {spec.link.kind!r}")
    if not 0 < spec.link.bidirectional_factor <= 1:
        raise ConfigError(f"{filename}: link.bidirectional_factor must be in (0, 1]")
    return spec


def load_preset_json(name_or_path: str | Path, preset_dir: Path, what: str) -> tuple[Path, Any]:
    """A preset by name from ``preset_dir``, or a JSON file by path: (path, parsed data).
    Errors name the file (and the line, for malformed JSON)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = preset_dir / f"{name_or_path}.json"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in preset_dir.glob("*.json")))
            raise ConfigError(f"unknown {what} preset {str(name_or_path)!r} "
                              f"(known: {known}; or give a JSON file path)")
    try:
        return path, json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: malformed JSON: {e.msg}") from None


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """A preset by name, or a hardware JSON file by path."""
    path, data = load_preset_json(name_or_path, PRESET_DIR, "hardware")
    return hardware_from_dict(data, str(path))


def hardware_from_dict(data: dict, where: str) -> HardwareSpec:
    """A hardware JSON already parsed; ``where`` names it in errors."""
    sources: dict[str, str] = {}
    return _build(_strip_sources(data, "", sources, where), sources, where)
