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
``cudaMemcpyBatchAsync`` call for all of them. For the kernel, two CTA counts are tried: KVCM2's
grid policy (``grid_ctas``) and the fewest (even) CTAs whose modelled rate reaches
``cta_plateau_fraction`` of the rate with every SM; the faster wins, fewer CTAs on a tie.

Intra-level batches are outside the link model: on the GPU level the kernel is chosen and priced at
``device_copy_gbps``; on the host level ``ce-batch`` is chosen and priced at the link's
bidirectional rate (the data crosses the link twice). Both say so in the log.

The choice is logged on logger ``kvsim.hw`` at INFO, with every candidate's prediction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.hardware.spec import HardwareSpec
from kvsim.manager.plan import COPY_INTRA, CopyBatch
from kvsim.model.copy_paths import (
    GB,
    PATHS,
    CopyEstimate,
    CopyRequest,
    estimate,
    grid_ctas,
    kernel_rate_gbps,
)

log = logging.getLogger("kvsim.hw")


@dataclass(frozen=True)
class Selection:
    """The chosen path, its combined estimate, and every candidate's (path, ctas, total seconds)."""

    path: str
    estimate: CopyEstimate  # summed over the group's pools
    candidates: tuple[tuple[str, int | None, float], ...]

    @property
    def total_seconds(self) -> float:
        return self.estimate.seconds + self.estimate.host_seconds


def plateau_ctas(hw: HardwareSpec, direction: str, fraction: float = 0.95,
                 inflight_bytes: int | None = None, page_bytes: int | None = None) -> int:
    """Fewest even CTAs (>= 2) whose modelled kernel rate reaches ``fraction`` of the all-SM rate
    (for pages of ``page_bytes``, when given)."""
    sms = max(2, hw.kernel.sm_count)
    target = fraction * kernel_rate_gbps(hw, direction, sms, inflight_bytes, page_bytes)
    for n in range(2, sms + 1, 2):
        if kernel_rate_gbps(hw, direction, n, inflight_bytes, page_bytes) >= target:
            return n
    return sms


def _combine(path: str, direction: str, parts: Sequence[CopyEstimate], num_bytes: int,
             host_adjust_s: float = 0.0) -> CopyEstimate:
    seconds = sum(p.seconds for p in parts)
    return CopyEstimate(
        path=path, direction=direction, seconds=seconds,
        gbps=num_bytes / seconds / GB if seconds > 0 else math.inf,
        host_seconds=sum(p.host_seconds for p in parts) + host_adjust_s,
        fixed_seconds=sum(p.fixed_seconds for p in parts),
        rate_gbps=min(p.rate_gbps for p in parts), ctas=parts[0].ctas, sms=parts[0].sms,
        aligned=all(p.aligned for p in parts))


class CopySelector:
    """Chooses a path per batch from ``hw``; ``paths`` limits the candidates."""

    def __init__(self, hw: HardwareSpec, paths: Sequence[str] = PATHS,
                 cta_plateau_fraction: float = 0.95, bidirectional: bool = False,
                 objective: str = "total") -> None:
        """``objective``: "total" minimises device plus host submission time (what a caller that
        submits and waits sees); "device" minimises device time alone (link throughput)."""
        if objective not in ("total", "device"):
            raise ValueError(f"objective must be 'total' or 'device', got {objective!r}")
        self.objective = objective
        unknown = [p for p in paths if p not in PATHS]
        if unknown or not paths:
            raise ValueError(f"paths must be a non-empty subset of {', '.join(PATHS)}, got {list(paths)}")
        self.hw = hw
        self.paths = tuple(paths)
        self.fraction = float(cta_plateau_fraction)
        self.bidirectional = bool(bidirectional)

    def kernel_cta_options(self, direction: str, page_bytes: int | None = None) -> list[int]:
        opts = {grid_ctas(self.hw, direction),
                plateau_ctas(self.hw, direction, self.fraction, page_bytes=page_bytes)}
        if self.objective == "device":  # more CTAs than the model's knee buy margin
            opts |= {8, 16, 32}
        return sorted(o for o in opts if o <= self.hw.kernel.sm_count)

    def price(self, path: str, direction: str, pool_slot_bytes: Sequence[int], pages: int,
              aligned: bool = True, ctas: int | None = None) -> CopyEstimate:
        """Estimate for one batch of ``pages`` pages (all pools of the group) on ``path``, as
        this project's copier submits it (its per-batch costs counted once, with the first pool)."""
        parts = [estimate(self.hw, CopyRequest(path, direction, int(sb), int(pages), ctas=ctas,
                                               bidirectional=self.bidirectional, aligned=aligned,
                                               via_copier=i == 0))
                 for i, sb in enumerate(pool_slot_bytes)]
        adjust = 0.0
        if path == "ce-batch":  # one cudaMemcpyBatchAsync call for every pool, not one per pool
            adjust = -(len(parts) - 1) * self.hw.copy_engine.batch_call_host_us * 1e-6
        return _combine(path, direction, parts, pages * sum(pool_slot_bytes), adjust)

    def choose(self, direction: str, pool_slot_bytes: Sequence[int], pages: int,
               aligned: bool = True) -> Selection:
        """The fastest path (device + host seconds) for a link batch ('offload' or 'onboard')."""
        cands: list[tuple[float, int, str, CopyEstimate]] = []
        for path in self.paths:
            options = (self.kernel_cta_options(direction, min(pool_slot_bytes))
                       if path == "kernel" else [None])
            for ctas in options:
                est = self.price(path, direction, pool_slot_bytes, pages, aligned, ctas)
                cost = est.seconds + (est.host_seconds if self.objective == "total" else 0.0)
                cands.append((cost, ctas or 0, path, est))
        cands.sort(key=lambda c: (c[0], c[1]))
        best = cands[0]
        sel = Selection(best[2], best[3], tuple((c[2], c[3].ctas, c[0]) for c in cands))
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
                    + pages * len(pool_slot_bytes) * hw.copy_engine.batch_descriptor_host_us) * 1e-6
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
