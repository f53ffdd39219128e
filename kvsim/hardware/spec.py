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
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from kvsim.errors import ConfigError
from kvsim.validation import Bool, FloatRange, IntRange, OneOf, Str, dotted, schema, validate

PRESET_DIR = Path(__file__).with_name("presets")
Number = FloatRange(-1e18, 1e18)  # a finite number (every one names its source)


def _curve(points: Any) -> tuple[tuple[float, float], ...]:
    """Ascending ``[page_bytes, gbps]`` pairs, all positive."""
    try:
        pts = tuple((float(a), float(b)) for a, b in points)
    except (TypeError, ValueError):
        pts = ()
    if not pts or any(b <= 0 or a <= 0 for a, b in pts) or list(pts) != sorted(pts):
        raise PydanticCustomError("kvsim_curve", "needs ascending [page_bytes, gbps] pairs, "
                                  "all positive")
    return pts


Curve = Annotated[tuple[tuple[float, float], ...], BeforeValidator(_curve)]


def PerDirectionMap(item: Any) -> Any:  # noqa: N802 - a type
    """A mapping with exactly the keys ``offload`` and ``onboard``."""
    def check(value: Any) -> Any:
        if not isinstance(value, dict) or set(value) != set(DIRECTIONS):
            raise PydanticCustomError("kvsim_directions", "needs exactly 'offload' and 'onboard'")
        return value
    return Annotated[dict[str, item], BeforeValidator(check)]
DIRECTIONS = ("offload", "onboard")  # offload = GPU -> host (D2H), onboard = host -> GPU (H2D)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


@schema
@dataclass(frozen=True)
class PerDirection:
    offload: Number
    onboard: Number

    def __getitem__(self, direction: str) -> float:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'offload' or 'onboard', got {direction!r}")
        return self.offload if direction == "offload" else self.onboard


@schema
@dataclass(frozen=True)
class LinkSpec:
    """The CPU-GPU link. ``per_direction_gbps`` is what one direction moves alone."""

    kind: OneOf("pcie", "c2c")
    coherent: Bool
    detected_gbps: Number  # what topology detection reports; the grid policy's input
    per_direction_gbps: PerDirection  # achievable by one direction alone (GB/s = 1e9 B/s)
    # Each direction's share of its solo bandwidth while the other direction is busy too.
    bidirectional_factor: FloatRange(0.0, 1.0, lo_open=True)


@schema
@dataclass(frozen=True)
class CopyEngineSpec:
    """Copy engines (DMA): ``cudaMemcpyAsync`` per page and ``cudaMemcpyBatchAsync``."""

    count: IntRange(0, 64)  # asyncEngineCount
    plateau_gbps: PerDirection  # large contiguous copies
    per_copy_device_us: PerDirection  # fixed device time of one cudaMemcpyAsync
    per_call_host_us: Number  # host time to issue one cudaMemcpyAsync
    batch_call_host_us: Number  # host time of one cudaMemcpyBatchAsync call ...
    batch_descriptor_host_us: PerDirection  # ... plus this per descriptor ...
    # ... plus this per KiB of a page smaller than batch_small_copy_max_bytes (small copies cost
    # the host more per descriptor, onboard; measured by the plan-shaped batches).
    batch_small_copy_host_us_per_kib: PerDirection
    batch_small_copy_max_bytes: Number
    # Batched-copy throughput by page size: [[page_bytes, gbps], ...] per direction, ascending;
    # interpolated in log(page_bytes), clamped at the ends. Captures the small-copy cliff.
    batch_curve: PerDirectionMap(Curve)
    # The device starts on a cudaMemcpyBatchAsync batch once the call has taken this many
    # descriptors (the driver hands the batch over in pieces while the host still builds it):
    # lead = batch_call_host_us + (host time of the descriptors) x min(1, this / descriptors).
    # 0: only after the whole call.
    batch_lead_descriptors: FloatRange(0.0, 1e12)


@schema
@dataclass(frozen=True)
class KernelSpec:
    """The LDGSTS (cp.async) paged copy kernel: Little's law per CTA up to a plateau.

    One CTA with ``b`` bytes in flight moves ``lambda(b) = b / (latency + b / per_cta_max)``
    (a round trip of ``latency`` per window of ``b`` bytes, and at most ``per_cta_max`` however
    deep the window; None = no such limit). N CTAs approach the plateau ``Xmax`` as
    ``min(N*lambda, Xmax)`` (``knee_p`` None) or ``Xmax * (1 - exp(-(N*lambda/Xmax)**p))**(1/p)``
    (``knee_form`` "exp") or ``N*lambda / (1 + (N*lambda/Xmax)**p)**(1/p)`` ("hyperbolic").
    """

    sm_count: IntRange(1, 4096)
    threads_per_cta: IntRange(1, 4096)
    tile_bytes: IntRange(1)  # bytes one CTA moves per tile; pages are packed into or split
    default_inflight_bytes: PerDirection  # bytes in flight per CTA when a run does not say
    latency_us: PerDirection
    per_cta_max_gbps: PerDirectionMap(Number | None)
    plateau_gbps: PerDirection  # Xmax
    knee_p: PerDirectionMap(Number | None)
    bidirectional_factor: Number  # fraction of each direction's plateau kept while both run
    launch_host_us: Number
    unaligned_efficiency: PerDirection  # alignment-agnostic kernel throughput / fast kernel
    # Extra time per page in each CTA's window (the page's slot-index load before its chunks can
    # be addressed): lambda(b) = b / (latency + b / per_cta_max + (b / page_bytes) * this).
    page_latency_us: PerDirection
    # How N CTAs' demand D = N*lambda approaches the plateau when knee_p is set: "exp",
    # Xmax * (1 - exp(-(D/Xmax)**p))**(1/p); or "hyperbolic", D / (1 + (D/Xmax)**p)**(1/p), whose
    # approach is slower (on the H200, 8 CTAs of 8 KiB pages reach 95-99 % of the plateau, not
    # 99.9 %: reports/validation-h200/plan-batches/README.md, section 5). Presets without the
    # key: "exp".
    knee_form: OneOf("exp", "hyperbolic") = "exp"


@schema
@dataclass(frozen=True)
class CopierSpec:
    """What this project's hardware copier (:class:`hw.executor_copies.PlanCopier`) adds to a
    kernel-path batch on this machine, beyond the kernel launches: device time before the first
    launch runs (the slot-index upload) and host time to submit (path selection, CUDA events,
    index upload), per batch and per page, and what it adds to a per-page copy-engine batch; and
    the extra device time of a batch that starts after the copy stream has been idle for at least
    ``idle_after_ms``."""

    batch_device_us: PerDirection
    submit_batch_host_us: Number
    submit_page_host_us: Number
    # Host time the copier adds to a per-page copy-engine batch (its Python around the calls).
    submit_copy_engine_host_us: Number
    # The part of submit_batch_host_us after the kernel's launch (it runs beside the kernel).
    submit_after_launch_host_us: PerDirection
    idle_wake_us: PerDirection
    idle_after_ms: Number


@schema
@dataclass(frozen=True)
class GridPolicy:
    """KVCM2's CTA sizing: cap = efficiency x link (coherent: <= host sustained); Little's law."""

    per_cta_gbps: Number  # kPerCtaGBs
    link_efficiency: Number  # kLinkEfficiency
    host_sustained_gbps: Number  # kHostSustainedGBs (coherent links only)
    grid_mult: PerDirection  # kOffloadGridMult, kOnboardGridMult


@schema
@dataclass(frozen=True)
class HardwareSpec:
    name: Str
    description: Str
    gpu: Str
    link: LinkSpec
    copy_engine: CopyEngineSpec
    kernel: KernelSpec
    grid_policy: GridPolicy
    copier: CopierSpec
    device_copy_gbps: Number  # copies within one level (partial-reuse and defragmentation)
    # Each number's source, by dotted field ("kernel.latency_us.offload": "the seed, ...").
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
    values = _strip_sources(data, "", sources, where)
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: must be a JSON object")
    values = {"description": "", **values, "sources": sources}
    return validate(HardwareSpec, values,
                    lambda loc, message: ConfigError(f"{where}: {dotted(loc)}: {message}"))
