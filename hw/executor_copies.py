"""Executing a plan's copies on the GPU, timed, and the ``--verify`` bookkeeping.

Two pieces for the hardware executor:

* :class:`PlanCopier` runs the :class:`~kvsim.manager.plan.CopyBatch` list of one manager plan on one
  CUDA stream, in plan order (a cascade's colder moves come first, so slots they free can be
  refilled by later batches of the same plan). Each batch gets a path from a
  :class:`~kvsim.model.copy_select.CopySelector` (or a fixed path), is bracketed by CUDA events, and yields
  a :class:`BatchRecord`: predicted device/host seconds next to the measured host submission time
  (``perf_counter``) and device time (events). When the stream is idle, a batch's event time
  includes the wait for its own submission (what a caller that issues and waits sees).
* :class:`SignatureTracker` keeps every live page of a manager signed: a page's block id is its
  page-table row and generation (both stable while the page lives, whatever level it moves to).
  :meth:`SignatureTracker.after_call` verifies every page signed earlier at its current (level,
  slot) -- nothing lost, nothing corrupted -- then signs the pages that appeared in the call. A page
  that received data by an intra-level copy into a *new* page (partial reuse) is signed afresh, so
  that copy's content is not checked here (the GPU tests check copies byte for byte).

Reads ``manager.storage.pages`` (level, slot, pool_group, generation, live_ids); nothing here
mutates the manager.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvsim.manager.plan import CopyBatch


@dataclass
class BatchRecord:
    """One executed copy batch: what it was, how it was copied, predicted vs measured."""

    kind: str
    src_level: int
    dst_level: int
    pool_group: int
    num_pages: int
    num_bytes: int
    path: str
    ctas: int | None
    calls: int
    predicted_device_s: float | None
    predicted_host_s: float | None
    host_submit_s: float  # perf_counter around the enqueue calls
    device_s: float | None = None  # CUDA events around the batch on the stream (after wait())
    # Start and end on the device since the origin event (see PlanCopier.set_origin), if any.
    device_start_s: float | None = None
    device_end_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class PlanCopier:
    """Runs copy batches on ``stream`` with ``pools`` (:class:`hw.pools.HostDevicePools`).

    ``selector``: a :class:`kvsim.model.copy_select.CopySelector`; or ``path`` to force one path for every
    batch (then nothing is predicted). ``stream``: a non-blocking CuPy stream (created if None).
    """

    def __init__(self, pools: Any, selector: Any = None, path: str | None = None,
                 stream: Any = None, ctas: int | None = None,
                 inflight_bytes: int | None = None) -> None:
        import cupy

        if (selector is None) == (path is None):
            raise ValueError("give exactly one of selector and path")
        self.pools = pools
        self.selector = selector
        self.path = path
        self._cp = cupy
        self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        self.ctas = ctas  # kernel CTAs / bytes in flight for a forced path (None: pool defaults)
        self.inflight_bytes = inflight_bytes
        self._pending: list[tuple[BatchRecord, Any, Any]] = []
        self._origin: Any = None

    def set_origin(self) -> None:
        """Record an origin event now; :meth:`wait` then places batches relative to it."""
        self._origin = self._cp.cuda.Event()
        self._origin.record(self.stream)

    def submit(self, copies: Sequence[CopyBatch]) -> list[BatchRecord]:
        """Enqueue every batch in order; returns records whose ``device_s`` :meth:`wait` fills."""
        records = []
        for batch in copies:
            if batch.num_pages == 0:
                continue
            ctas, inflight, pred = self.ctas, self.inflight_bytes, None
            path = self.path
            if self.selector is not None:
                aligned = self.pools.aligned(batch.src_level, batch.pool_group) and \
                    self.pools.aligned(batch.dst_level, batch.pool_group)
                path, pred = self.selector.choose_for_batch(batch, aligned)
                ctas = pred.ctas
                if batch.kind != "intra":
                    inflight = int(self.selector.hw.kernel.default_inflight_bytes[batch.kind])
            start, end = self._cp.cuda.Event(), self._cp.cuda.Event()
            start.record(self.stream)
            t0 = time.perf_counter()
            ex = self.pools.copy_batch(batch, path, self.stream, ctas=ctas, inflight_bytes=inflight)
            t1 = time.perf_counter()
            end.record(self.stream)
            rec = BatchRecord(batch.kind, batch.src_level, batch.dst_level, batch.pool_group,
                              batch.num_pages, batch.num_bytes, path, ex.ctas, ex.calls,
                              pred.seconds if pred else None, pred.host_seconds if pred else None,
                              t1 - t0)
            self._pending.append((rec, start, end))
            records.append(rec)
        return records

    def wait(self) -> None:
        """Synchronize the stream (surfacing asynchronous errors) and fill ``device_s``."""
        from hw.cuda_check import sync

        sync(self.stream, "PlanCopier.wait")
        elapsed = self._cp.cuda.get_elapsed_time
        for rec, start, end in self._pending:
            rec.device_s = elapsed(start, end) * 1e-3
            if self._origin is not None:
                rec.device_start_s = elapsed(self._origin, start) * 1e-3
                rec.device_end_s = elapsed(self._origin, end) * 1e-3
        self._pending.clear()

    def run(self, copies: Sequence[CopyBatch]) -> list[BatchRecord]:
        """:meth:`submit` then :meth:`wait`."""
        records = self.submit(copies)
        self.wait()
        return records


def _block_ids(pages: Any, ids: np.ndarray) -> np.ndarray:
    return (pages.generation[ids].astype(np.int64) << 32) | ids.astype(np.int64)


@dataclass(frozen=True)
class VerifySummary:
    pages_verified: int
    pages_signed: int
    pages_forgotten: int  # signed earlier, no longer alive (freed or dropped)


class SignatureTracker:
    """Keeps the live pages of ``manager`` signed in ``pools`` and checks them after each call."""

    def __init__(self, manager: Any, pools: Any) -> None:
        self.manager = manager
        self.pools = pools
        self._signed = np.empty(0, dtype=np.int64)  # block ids (generation << 32 | row)

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        pages = self.manager.storage.pages
        ids = pages.live_ids()
        return ids, _block_ids(pages, ids)

    def _by_cell(self, ids: np.ndarray):
        pages = self.manager.storage.pages
        levels, groups = pages.level[ids], pages.pool_group[ids]
        for lv in np.unique(levels).tolist():
            for g in np.unique(groups[levels == lv]).tolist():
                sel = ids[(levels == lv) & (groups == g)]
                yield lv, g, pages.slot[sel], _block_ids(pages, sel)

    def sign_new(self) -> int:
        """Sign every live page not signed yet; returns how many."""
        ids, blocks = self._live()
        new = ids[~np.isin(blocks, self._signed)]
        for lv, g, slots, b in self._by_cell(new):
            self.pools.fill_signature(lv, g, slots, b)
        self._signed = np.union1d(self._signed, blocks[~np.isin(blocks, self._signed)])
        return int(new.size)

    def verify(self, where: str = "verify") -> tuple[int, int]:
        """Check every signed page still alive at its current location; raise on damage.

        Returns (pages verified, signed pages no longer alive, which are forgotten).
        """
        ids, blocks = self._live()
        known = np.isin(blocks, self._signed)
        checked = 0
        for lv, g, slots, b in self._by_cell(ids[known]):
            res = self.pools.verify(lv, g, slots, b)
            res.raise_if_bad(f"{where}: level {lv} pool group {g}")
            checked += res.pages
        gone = int(self._signed.size - np.count_nonzero(known))
        self._signed = blocks[known]
        return checked, gone

    def after_call(self, where: str = "verify") -> VerifySummary:
        """After a call's copies completed: verify the signed pages, then sign the new ones."""
        checked, gone = self.verify(where)
        signed = self.sign_new()
        return VerifySummary(checked, signed, gone)
