"""Pick the copy path for each batch from calibration data (a HardwareSpec), and log the choice.

For a batch (direction, the pool slot sizes of its pool group, number of pages, alignment), every
candidate path is priced with :func:`kvsim.model.copy_paths.estimate` -- the same model the
simulator uses, fed by a hardware JSON fitted to measurements (for example the ``h200-sxm``
preset, or ``kvsim detect --write-hardware`` on top of one) -- and the path with the least
``device seconds + host submission seconds`` wins. The link kind alone decides nothing (KVCM2's
``default_path`` does that; this selector does not).

Pricing follows what :class:`hw.pools.HostDevicePools` executes: each pool of the group is a
separate copy of ``pool_slot_bytes[p]``-byte pages (one kernel launch, or one descriptor / one
``cudaMemcpyAsync`` per page and pool), so a batch's estimate is the sum over its pools, with one
``cudaMemcpyBatchAsync`` call for all of them. For the kernel, the CTA counts tried are the powers
of two up to the SM count and the SM count (the counts ``hw.bench_plan_batches`` measures, so every
pick can be judged against measurements); KVCM2's grid policy (``grid_ctas``) is not consulted.

The price of a candidate is its end-to-end time (submission start to last byte, objective
"total"; device time alone with objective "device") plus what its CTAs take from compute:
``sm_weight * (SMs taken / SM count) * device seconds``. ``sm_weight`` is the knob: 0 treats SMs
as free (the GPU has nothing else to run, as in a copy benchmark), 1 prices an SM-second taken from
the model's compute as dearly as a second of copy time. The default, :data:`DEFAULT_SM_WEIGHT`,
only breaks near-ties: a CTA count wins over a smaller one only if it saves more than 5 % of its
share of the GPU's time, so the selector stops at the kernel's knee rather than taking every SM
for a fraction of a percent.

``host_speed`` is the second knob: the host's speed in this run relative to the host the
preset's host figures were fitted on (:func:`kvsim.model.copy_paths.with_host_speed`; one number,
or one per path; default 1.0). A faster host (factor below 1) uncovers device time that a slower
one hides behind the submission, so the pick can change with it: a 1-4 CTA kernel that ties with
8-132 CTAs behind a slow submission is behind them on a fast one.

Intra-level batches are outside the link model: on the GPU level the kernel is chosen and priced at
``device_copy_gbps``; on the host level ``ce-batch`` is chosen and priced at the link's
bidirectional rate (the data crosses the link twice). Both say so in the log.

The choice is logged on logger ``kvsim.hw`` at INFO, with every candidate's prediction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvsim.hardware.spec import HardwareSpec
from kvsim.manager.plan import COPY_INTRA, CopyBatch
from kvsim.model.copy_paths import (
    GB,
    PATHS,
    CopyEstimate,
    CopyRequest,
    batch_lead,
    estimate,
    overlap_of,
    with_host_speed,
)

log = logging.getLogger("kvsim.hw")
DEFAULT_SM_WEIGHT = 0.05  # see the module doc: breaks near-ties toward fewer SMs


@dataclass(frozen=True)
class Selection:
    """The chosen path, its combined estimate, and every candidate's (path, ctas, cost seconds)."""

    path: str
    estimate: CopyEstimate  # summed over the group's pools
    candidates: tuple[tuple[str, int | None, float], ...]

    @property
    def total_seconds(self) -> float:
        """Submission start to last byte landed."""
        return self.estimate.end_to_end_seconds


def _combine(hw: HardwareSpec, path: str, direction: str, parts: Sequence[CopyEstimate],
             num_bytes: int, descriptors: int, host_adjust_s: float = 0.0) -> CopyEstimate:
    seconds = sum(p.seconds for p in parts)
    host = sum(p.host_seconds for p in parts) + host_adjust_s
    # the pools run one after another on the device, from the first one's start; one
    # cudaMemcpyBatchAsync call holds every pool's descriptors: the device starts once the call
    # has taken its first batch_lead_descriptors of them (all of them when that is 0)
    first = parts[0]
    if path == "ce-batch":
        lead = batch_lead(hw, host, descriptors)
    else:
        lead = host if first.lead_seconds is None else first.lead_seconds
    return CopyEstimate(
        path=path, direction=direction, seconds=seconds,
        gbps=num_bytes / seconds / GB if seconds > 0 else math.inf,
        host_seconds=host,
        fixed_seconds=sum(p.fixed_seconds for p in parts),
        rate_gbps=min(p.rate_gbps for p in parts), ctas=parts[0].ctas, sms=parts[0].sms,
        aligned=all(p.aligned for p in parts), overlap_seconds=overlap_of(host, lead, seconds),
        lead_seconds=lead)


class CopySelector:
    """Chooses a path per batch from ``hw``; ``paths`` limits the candidates."""

    def __init__(self, hw: HardwareSpec, paths: Sequence[str] = PATHS,
                 bidirectional: bool = False,
                 objective: str = "total", sm_weight: float = DEFAULT_SM_WEIGHT,
                 host_speed: float | Mapping[str, float] = 1.0) -> None:
        """``objective``: "total" minimises the end-to-end time (what a caller that submits and
        waits sees); "device" minimises device time alone (link throughput). ``sm_weight``: the
        price of SMs taken from compute; ``host_speed``: this run's host speed factor, one
        number or one per path (module doc). ``self.hw`` is ``hw`` with the factor applied."""
        if objective not in ("total", "device"):
            raise ValueError(f"objective must be 'total' or 'device', got {objective!r}")
        if isinstance(sm_weight, bool) or not isinstance(sm_weight, (int, float)) \
                or not math.isfinite(sm_weight) or sm_weight < 0:
            raise ValueError(f"sm_weight must be a number >= 0, got {sm_weight!r}")
        self.objective = objective
        unknown = [p for p in paths if p not in PATHS]
        if unknown or not paths:
            raise ValueError(f"paths must be a non-empty subset of {', '.join(PATHS)}, got {list(paths)}")
        self.hw = with_host_speed(hw, host_speed)
        self.host_speed = host_speed
        self.paths = tuple(paths)
        self.bidirectional = bool(bidirectional)
        self.sm_weight = float(sm_weight)
        self._chosen: dict[tuple, Selection] = {}  # the simulator asks for the same shapes often

    def kernel_cta_options(self) -> list[int]:
        """The CTA counts priced for the kernel (module doc): powers of two and the SM count."""
        sms = self.hw.kernel.sm_count
        return sorted({1 << k for k in range(sms.bit_length()) if 1 << k <= sms} | {sms})

    def cost(self, est: CopyEstimate) -> float:
        """What the selector minimises for one candidate (module doc)."""
        base = est.end_to_end_seconds if self.objective == "total" else est.seconds
        return base + self.sm_weight * est.sms / self.hw.kernel.sm_count * est.seconds

    def price(self, path: str, direction: str, pool_slot_bytes: Sequence[int], pages: int,
              aligned: bool = True, ctas: int | None = None) -> CopyEstimate:
        """Estimate for one batch of ``pages`` pages (all pools of the group) on ``path``, as
        this project's copier submits it (its per-batch costs counted once, with the first pool)."""
        parts, seen = [], {}  # pools of one slot size price alike (all but the first's costs)
        for i, sb in enumerate(pool_slot_bytes):
            key = (int(sb), i == 0)
            est = seen.get(key)
            if est is None:
                est = seen[key] = estimate(self.hw, CopyRequest(
                    path, direction, int(sb), int(pages), ctas=ctas,
                    bidirectional=self.bidirectional, aligned=aligned, via_copier=i == 0))
            parts.append(est)
        adjust = 0.0
        if path == "ce-batch":  # one cudaMemcpyBatchAsync call for every pool, not one per pool
            adjust = -(len(parts) - 1) * self.hw.copy_engine.batch_call_host_us * 1e-6
        return _combine(self.hw, path, direction, parts, pages * sum(pool_slot_bytes),
                        pages * len(parts), adjust)

    def choose(self, direction: str, pool_slot_bytes: Sequence[int], pages: int,
               aligned: bool = True) -> Selection:
        """The cheapest path (and CTA count) for a link batch ('offload' or 'onboard')."""
        key = (direction, tuple(pool_slot_bytes), pages, aligned)
        sel = self._chosen.get(key)
        if sel is not None:
            return sel
        cands: list[tuple[float, int, str, CopyEstimate]] = []
        for path in self.paths:
            options = self.kernel_cta_options() if path == "kernel" else [None]
            for ctas in options:
                est = self.price(path, direction, pool_slot_bytes, pages, aligned, ctas)
                cands.append((self.cost(est), ctas or 0, path, est))
        cands.sort(key=lambda c: (c[0], c[1]))
        best = cands[0]
        sel = Selection(best[2], best[3], tuple((c[2], c[3].ctas, c[0]) for c in cands))
        self._chosen[key] = sel
        if log.isEnabledFor(logging.INFO):
            log.info("copy path %s for %s of %d pages x %s B%s: %s", sel.path, direction, pages,
                     "+".join(str(b) for b in pool_slot_bytes), "" if aligned else " (unaligned)",
                     "; ".join(f"{p}{f' {c} CTAs' if c else ''} {t * 1e3:.3f} ms"
                               for p, c, t in sel.candidates))
        return sel

    def choose_intra(self, level: int, pool_slot_bytes: Sequence[int], pages: int) -> Selection:
        """Intra-level batches: kernel on the GPU level, ce-batch on host levels (see module doc)."""
        num_bytes = pages * sum(pool_slot_bytes)
        hw = self.hw
        if level == 0:
            path = "kernel" if "kernel" in self.paths else self.paths[0]
            rate = hw.device_copy_gbps
            host = len(pool_slot_bytes) * hw.kernel.launch_host_us * 1e-6
            ctas = hw.kernel.sm_count if path == "kernel" else None
            why = "device_copy_gbps"
        else:
            path = "ce-batch" if "ce-batch" in self.paths else self.paths[0]
            rate = min(hw.link.per_direction_gbps.offload, hw.link.per_direction_gbps.onboard) \
                * hw.link.bidirectional_factor
            host = (hw.copy_engine.batch_call_host_us
                    + pages * len(pool_slot_bytes)
                    * hw.copy_engine.batch_descriptor_host_us.offload) * 1e-6  # host to host
            ctas = None
            why = "link bidirectional rate (host-to-host crosses the link twice)"
        seconds = num_bytes / (rate * GB)
        est = CopyEstimate(path=path, direction=COPY_INTRA, seconds=seconds, gbps=rate,
                           host_seconds=host, fixed_seconds=0.0, rate_gbps=rate, ctas=ctas,
                           sms=min(ctas or 0, hw.kernel.sm_count), aligned=True)
        log.info("copy path %s for intra-level (level %d) copy of %d pages x %s B: not in the link "
                 "model; priced at %s, %.3f ms", path, level, pages,
                 "+".join(str(b) for b in pool_slot_bytes), why, (seconds + host) * 1e3)
        return Selection(path, est, ((path, ctas, seconds + host),))

    def choose_for_batch(self, batch: CopyBatch, aligned: bool = True) -> tuple[str, CopyEstimate]:
        """``(path, predicted estimate)`` for one manager copy batch."""
        if batch.kind == COPY_INTRA:
            sel = self.choose_intra(batch.src_level, batch.pool_slot_bytes, max(1, batch.num_pages))
        else:
            sel = self.choose(batch.kind, batch.pool_slot_bytes, max(1, batch.num_pages), aligned)
        return sel.path, sel.estimate


def select_path(hw: HardwareSpec, direction: str, page_bytes: int | Sequence[int], pages: int,
                aligned: bool = True, level: int = 0) -> tuple[str, CopyEstimate]:
    """``(path, predicted estimate)`` for one batch; ``page_bytes`` is one int (one pool) or the
    pool slot sizes of the group; ``level`` matters only for ``direction='intra'``."""
    sizes = (int(page_bytes),) if isinstance(page_bytes, int) else tuple(int(b) for b in page_bytes)
    sel = CopySelector(hw)
    if direction == COPY_INTRA:
        s = sel.choose_intra(level, sizes, max(1, int(pages)))
    else:
        s = sel.choose(direction, sizes, max(1, int(pages)), aligned)
    return s.path, s.estimate
