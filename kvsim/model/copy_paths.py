"""Copy-path models: how long one copy batch takes, by path, direction and page size.

Pure functions of a :class:`~kvsim.hardware.spec.HardwareSpec`; the simulator feeds their output
to the link model, and ``kvsim copy-model`` prints it for one batch alone on the link.

Paths and formulas (B = pages x page_bytes bytes; ``link`` = one direction's bandwidth, times the
bidirectional factor when the other direction is busy):

* ``ce-page``  -- one ``cudaMemcpyAsync`` per page on one stream, the device copying while the host
  still submits: a copy takes ``d = per_copy_device_us + page_bytes / min(ce_plateau, link)`` on
  the device and ``h = per_call_host_us`` on the host, so the device starts after the first call
  and then runs at the slower of the two: device span ``t = d + (pages - 1) * max(h, d)``;
  host ``pages * h``, of which all but the first call overlaps the device (``overlap_seconds``):
  end to end ``h + t``.
* ``ce-batch`` -- one ``cudaMemcpyBatchAsync``: ``t = B / min(batch_curve(page_bytes), ce_plateau,
  link)``, the curve holding the small-copy cliff; host: ``batch_call_host_us +
  pages * batch_descriptor_host_us`` (plus the small-copy term); the device starts once the call
  has taken ``batch_lead_descriptors`` descriptors (:func:`batch_lead`; 0: after the whole call).
* ``kernel``   -- the LDGSTS kernel on N CTAs with b bytes in flight each: Little's law per CTA,
  ``lambda = b / (latency + b / per_cta_max)``; ``X(N) = min(N*lambda, Xmax)`` (hard clamp) or
  ``Xmax * (1 - exp(-(N*lambda/Xmax)**p))**(1/p)`` (soft knee, ``kernel.knee_form`` "exp") or
  ``N*lambda / (1 + (N*lambda/Xmax)**p)**(1/p)`` ("hyperbolic", a slower approach); times the
  tiling efficiency of the page size, times ``unaligned_efficiency`` for the alignment-agnostic
  kernel, times the kernel's ``bidirectional_factor`` while the other direction runs too;
  ``t = B / min(X, link)``; host: ``launch_host_us``. N defaults to KVCM2's grid policy
  (``grid_ctas``), b to the preset's default depth. With small pages each CTA window also waits
  ``page_latency`` per page it spans:
  ``lambda = b / (latency + b / per_cta_max + (b / page_bytes) * page_latency)``.

A request ``via_copier`` is one submitted by this project's hardware copier
(:class:`hw.executor_copies.PlanCopier`); on the kernel path it adds the copier's measured costs
per batch: ``copier.batch_device_us`` before the launch runs (the slot-index upload), and
``copier.submit_batch_host_us + pages * copier.submit_page_host_us`` on the host, of which
``copier.submit_after_launch_host_us`` comes after the launch and runs beside the kernel; on the
``ce-page`` path it adds ``copier.submit_copy_engine_host_us`` on the host, before the first call.

End to end (submission start to last byte, what a caller that submits and waits sees) is
``max(host_seconds, lead_seconds + seconds)`` = ``host_seconds + seconds - overlap_seconds``: the
device starts ``lead_seconds`` into the submission (:func:`lead_seconds`): ``ce-batch`` once its
call is done (or its first ``batch_lead_descriptors`` descriptors), ``ce-page`` after its first
call (as above), the copier's kernel after its launch.

**Host speed.** Every host-time figure above was timed on one host on one day; the host's speed
moves (on the H200 VM by up to 1.65x between runs and in spells of seconds within one:
reports/validation-h200/plan-batches/README.md, section 4). :func:`with_host_speed` returns the
spec with each path's host figures (:data:`HOST_TERMS`) multiplied by a factor: one number for
every path, or one per path (the paths' host work moved by different factors between the H200
runs). 1.0 is the host the figures were fitted on. The factor is a measurement of the run, not a
fitted constant: ``hw.bench_plan_batches`` takes a short host probe per path before every pass
over a batch's points and the judge divides it by the fit run's probe
(:mod:`kvsim.calibration.plan_batch_fit`, PROTOCOL-3.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvsim.hardware.spec import DIRECTIONS, HardwareSpec, PerDirection
from kvsim.model.path_names import PATHS

GB = 1e9
# The host-time figures of each path (section, field): what with_host_speed scales.
HOST_TERMS: dict[str, tuple[tuple[str, str], ...]] = {
    "ce-page": (("copy_engine", "per_call_host_us"), ("copier", "submit_copy_engine_host_us")),
    "ce-batch": (("copy_engine", "batch_call_host_us"), ("copy_engine", "batch_descriptor_host_us"),
                 ("copy_engine", "batch_small_copy_host_us_per_kib")),
    "kernel": (("kernel", "launch_host_us"), ("copier", "submit_batch_host_us"),
               ("copier", "submit_page_host_us"), ("copier", "submit_after_launch_host_us")),
}


@dataclass(frozen=True)
class CopyRequest:
    path: str
    direction: str
    page_bytes: int
    pages: int
    ctas: int | None = None
    inflight_bytes: int | None = None
    bidirectional: bool = False
    aligned: bool = True
    via_copier: bool = False

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {self.path!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be offload or onboard, got {self.direction!r}")
        for name in ("page_bytes", "pages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("ctas", "inflight_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class CopyEstimate:
    """One batch: device seconds, achieved GB/s, host submission seconds, CTAs and SMs used."""

    path: str
    direction: str
    seconds: float  # from start on the device to the last byte landed
    gbps: float  # bytes / seconds / 1e9
    host_seconds: float  # host time to submit the batch
    fixed_seconds: float  # device time not spent moving bytes (per-copy overheads)
    rate_gbps: float  # the byte rate while moving (before link sharing with other transfers)
    ctas: int | None
    sms: int  # SMs taken by copy CTAs (0 for copy engines)
    aligned: bool
    overlap_seconds: float = 0.0  # device time that runs while the host is still submitting
    lead_seconds: float | None = None  # host time before the device starts (None: all of it)

    @property
    def end_to_end_seconds(self) -> float:
        """Submission start to last byte landed."""
        return self.host_seconds + self.seconds - self.overlap_seconds

    def to_dict(self) -> dict:
        return asdict(self)


def host_speeds(speed: float | Mapping[str, float]) -> dict[str, float]:
    """``{path: factor}`` of a host speed: one number for every path, or a mapping naming some
    of :data:`PATHS` (the others 1.0). Each factor must be a finite number > 0."""
    if isinstance(speed, Mapping):
        unknown = [p for p in speed if p not in PATHS]
        if unknown:
            raise ValueError(f"host_speed: unknown paths {unknown}; paths are {', '.join(PATHS)}")
        out = {p: speed.get(p, 1.0) for p in PATHS}
    else:
        out = {p: speed for p in PATHS}
    for p, f in out.items():
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ValueError(f"host_speed of {p} must be a finite number > 0, got {f!r}")
    return {p: float(f) for p, f in out.items()}


def with_host_speed(hw: HardwareSpec, speed: float | Mapping[str, float]) -> HardwareSpec:
    """``hw`` with each path's host figures (:data:`HOST_TERMS`) multiplied by its factor of
    ``speed`` (:func:`host_speeds`): 2.0 = a host that takes twice as long to submit as the one
    the figures were fitted on. Device figures are untouched. ``hw`` itself when every factor is
    1.0."""
    factors = host_speeds(speed)
    if all(f == 1.0 for f in factors.values()):
        return hw
    parts: dict[str, Any] = {}
    for path, terms in HOST_TERMS.items():
        f = factors[path]
        for section, field in terms:
            part = parts.get(section, getattr(hw, section))
            v = getattr(part, field)
            if isinstance(v, PerDirection):
                v = PerDirection(offload=v.offload * f, onboard=v.onboard * f)
            else:
                v = v * f
            parts[section] = replace(part, **{field: v})
    return replace(hw, **parts)


def grid_ctas(hw: HardwareSpec, direction: str) -> int:
    """KVCM2's CTA count: ``2 * round(mult * cap / kPerCtaGBs / 2)``, clamped to [2, SMs].

    ``cap = link_efficiency * detected link bandwidth``, and on coherent links at most the host's
    sustained bandwidth.
    """
    gp = hw.grid_policy
    cap = gp.link_efficiency * hw.link.detected_gbps
    if hw.link.coherent:
        cap = min(cap, gp.host_sustained_gbps)
    target = gp.grid_mult[direction] * cap / gp.per_cta_gbps
    ctas = 2 * int(math.floor(target / 2.0 + 0.5))  # std::lround: halves away from zero
    return max(2, min(ctas, max(2, hw.kernel.sm_count)))


def kernel_inflight(hw: HardwareSpec, direction: str, inflight_bytes: int | None) -> int:
    return int(inflight_bytes or hw.kernel.default_inflight_bytes[direction])


def per_cta_gbps(hw: HardwareSpec, direction: str, inflight_bytes: int | None = None,
                 page_bytes: int | None = None) -> float:
    """Little's law for one CTA: bytes in flight over the time one window takes (plus the
    per-page latency of the pages a window spans, when ``page_bytes`` is given)."""
    b = kernel_inflight(hw, direction, inflight_bytes)
    seconds = hw.kernel.latency_us[direction] * 1e-6
    cap = hw.kernel.per_cta_max_gbps[direction]
    if cap:
        seconds += b / (cap * GB)
    if page_bytes:
        seconds += b / page_bytes * hw.kernel.page_latency_us[direction] * 1e-6
    return b / seconds / GB


def kernel_rate_gbps(hw: HardwareSpec, direction: str, ctas: int,
                     inflight_bytes: int | None = None, page_bytes: int | None = None) -> float:
    """X(N) of the kernel for full tiles (no tiling, alignment or bidirectional losses); with
    ``page_bytes``, each window's per-page latency counts."""
    xmax = hw.kernel.plateau_gbps[direction]
    demand = ctas * per_cta_gbps(hw, direction, inflight_bytes, page_bytes)
    p = hw.kernel.knee_p[direction]
    if p is None:
        return min(demand, xmax)
    if hw.kernel.knee_form == "hyperbolic":
        return demand / (1.0 + (demand / xmax) ** p) ** (1.0 / p)
    return xmax * (1.0 - math.exp(-((demand / xmax) ** p))) ** (1.0 / p)


def tiling_efficiency(hw: HardwareSpec, page_bytes: int) -> float:
    """Fraction of each tile the kernel fills: whole small pages packed per tile, or a ragged
    last tile per large page."""
    tile = hw.kernel.tile_bytes
    if page_bytes < tile:
        per_tile = tile // page_bytes
        return per_tile * page_bytes / tile
    return page_bytes / (math.ceil(page_bytes / tile) * tile)


def batch_curve_gbps(hw: HardwareSpec, direction: str, page_bytes: int) -> float:
    pts = hw.copy_engine.batch_curve[direction]
    if page_bytes <= pts[0][0]:
        return pts[0][1]
    if page_bytes >= pts[-1][0]:
        return pts[-1][1]
    x = math.log(page_bytes)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= page_bytes <= x1:
            f = (x - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + f * (y1 - y0)
    raise AssertionError("unreachable")


def link_gbps(hw: HardwareSpec, direction: str, bidirectional: bool) -> float:
    solo = hw.link.per_direction_gbps[direction]
    return solo * hw.link.bidirectional_factor if bidirectional else solo


@dataclass(frozen=True)
class DeviceWork:
    """What a batch asks of the device: a fixed delay, then bytes at up to ``cap_gbps``
    (``cap_both_gbps`` while the other direction is busy too)."""

    fixed_seconds: float
    num_bytes: int
    cap_gbps: float
    cap_both_gbps: float
    ctas: int | None
    sms: int


def _ce_page_span(hw: HardwareSpec, req: CopyRequest, rate_gbps: float) -> float:
    """Device span of a per-page batch whose bytes move at ``rate_gbps``: the device paced by
    the host's calls (module doc)."""
    h = hw.copy_engine.per_call_host_us * 1e-6
    d = hw.copy_engine.per_copy_device_us[req.direction] * 1e-6 + req.page_bytes / (rate_gbps * GB)
    return d + (req.pages - 1) * max(h, d)


def lead_seconds(hw: HardwareSpec, req: CopyRequest, host: float | None = None) -> float:
    """Host time of the submission after which the device can start on the batch: per-page
    copies after the copier's own work and the first call; the copier's kernel after its launch
    (what the copier does after the launch runs beside the kernel); otherwise the whole
    submission. ``host``: the request's :func:`host_seconds`, when the caller has it."""
    if host is None:
        host = host_seconds(hw, req)
    if req.path == "ce-page":
        return host - (req.pages - 1) * hw.copy_engine.per_call_host_us * 1e-6
    if req.path == "kernel" and req.via_copier:
        return max(0.0, host - hw.copier.submit_after_launch_host_us[req.direction] * 1e-6)
    if req.path == "ce-batch":
        return batch_lead(hw, host, req.pages)
    return host


def batch_lead(hw: HardwareSpec, host: float, descriptors: int) -> float:
    """Host time into a ``cudaMemcpyBatchAsync`` call of ``host`` seconds and ``descriptors``
    descriptors after which the device starts: the call's fixed cost, then the share of the
    descriptors' host time up to ``copy_engine.batch_lead_descriptors`` (0: the whole call)."""
    first = hw.copy_engine.batch_lead_descriptors
    if not first or descriptors <= first:
        return host
    call = min(host, hw.copy_engine.batch_call_host_us * 1e-6)
    return call + (host - call) * first / descriptors


def device_work(hw: HardwareSpec, req: CopyRequest) -> DeviceWork:
    """The batch's own limits, before it shares the link with anything else."""
    n_bytes = req.pages * req.page_bytes
    ce = hw.copy_engine
    if req.path == "ce-page":
        cap = ce.plateau_gbps[req.direction]
        span = _ce_page_span(hw, req, min(cap, hw.link.per_direction_gbps[req.direction]))
        fixed = max(0.0, span - n_bytes / (cap * GB))
        return DeviceWork(fixed, n_bytes, cap, cap, None, 0)
    if req.path == "ce-batch":
        cap = min(batch_curve_gbps(hw, req.direction, req.page_bytes), ce.plateau_gbps[req.direction])
        return DeviceWork(0.0, n_bytes, cap, cap, None, 0)
    ctas = req.ctas or grid_ctas(hw, req.direction)
    cap = kernel_rate_gbps(hw, req.direction, ctas, req.inflight_bytes, req.page_bytes)
    cap *= tiling_efficiency(hw, req.page_bytes)
    if not req.aligned:
        cap *= hw.kernel.unaligned_efficiency[req.direction]
    cap_both = min(cap, hw.kernel.plateau_gbps[req.direction] * hw.kernel.bidirectional_factor)
    fixed = hw.copier.batch_device_us[req.direction] * 1e-6 if req.via_copier else 0.0
    return DeviceWork(fixed, n_bytes, cap, cap_both, ctas, min(ctas, hw.kernel.sm_count))


def host_seconds(hw: HardwareSpec, req: CopyRequest) -> float:
    ce = hw.copy_engine
    if req.path == "ce-page":
        seconds = req.pages * ce.per_call_host_us * 1e-6
        return seconds + (hw.copier.submit_copy_engine_host_us * 1e-6 if req.via_copier else 0.0)
    if req.path == "ce-batch":
        per_page = ce.batch_descriptor_host_us[req.direction]
        if req.page_bytes < ce.batch_small_copy_max_bytes:
            per_page += req.page_bytes / 1024 * ce.batch_small_copy_host_us_per_kib[req.direction]
        return (ce.batch_call_host_us + req.pages * per_page) * 1e-6
    seconds = hw.kernel.launch_host_us * 1e-6
    if req.via_copier:
        seconds += (hw.copier.submit_batch_host_us + req.pages * hw.copier.submit_page_host_us) * 1e-6
    return seconds


def estimate(hw: HardwareSpec, req: CopyRequest) -> CopyEstimate:
    """One batch alone on the link (or against a busy opposite direction)."""
    work = device_work(hw, req)
    cap = work.cap_both_gbps if req.bidirectional else work.cap_gbps
    rate = min(cap, link_gbps(hw, req.direction, req.bidirectional))
    host = host_seconds(hw, req)
    if req.path == "ce-page":
        seconds = _ce_page_span(hw, req, rate)
    else:
        seconds = work.fixed_seconds + work.num_bytes / (rate * GB)
    lead = lead_seconds(hw, req, host)
    return CopyEstimate(
        path=req.path,
        direction=req.direction,
        seconds=seconds,
        gbps=work.num_bytes / seconds / GB,
        host_seconds=host,
        fixed_seconds=work.fixed_seconds,
        rate_gbps=rate,
        ctas=work.ctas,
        sms=work.sms,
        aligned=req.aligned,
        overlap_seconds=overlap_of(host, lead, seconds),
        lead_seconds=lead,
    )


def overlap_of(host_s: float, lead_s: float, device_s: float) -> float:
    """Device time that runs while the host still submits: the device starts at ``lead_s`` into
    a submission of ``host_s``, so the batch ends at ``max(host_s, lead_s + device_s)``."""
    return host_s + device_s - max(host_s, lead_s + device_s)
