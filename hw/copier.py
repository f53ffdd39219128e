"""PoolCopier: the hardware executor's view of :class:`hw.executor_copies.PlanCopier`.

``submit`` enqueues one manager :class:`~kvsim.manager.plan.CopyBatch` on the copier's stream
(path: ``auto`` lets :class:`kvsim.model.copy_select.CopySelector` price every path on the hardware spec
and pick the fastest; or a fixed path) and returns the run's :class:`CopyRecord` for it. At
``finish`` the stream is synchronised and each record's start and end are read from its CUDA
events and placed on the executor's ``perf_counter`` timeline through an origin event recorded
when the run starts.

``--verify`` (:class:`hw.executor_copies.SignatureTracker`): every live page is signed with its
identity; after each call's copies every signed page still alive is checked at its current slot,
then the call's new pages are signed. Damage raises :class:`hw.pools.IntegrityError`.
"""

from __future__ import annotations

import time
from typing import Any

from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch
from kvsim.runtime.records import CopyRecord


class PoolCopier:
    name = "cuda"

    def __init__(self, pools: Any, hardware: Any, path: str = "auto", verify: bool = False,
                 ctas: int | None = None, inflight_bytes: int | None = None) -> None:
        from hw.executor_copies import PlanCopier
        from kvsim.model.copy_select import CopySelector

        auto = path in ("auto", "select")
        self.plan_copier = PlanCopier(pools, selector=CopySelector(hardware) if auto else None,
                                      path=None if auto else path, ctas=ctas,
                                      inflight_bytes=inflight_bytes)
        self.pools = pools
        self.verify_enabled = verify
        self.tracker: Any = None
        self.records: list[CopyRecord] = []
        self._pairs: list[tuple[CopyRecord, Any]] = []
        self._origin_host = 0.0
        self.pages_verified = 0
        self.pages_signed = 0
        self.busy_ms = 0.0
        self.sm_clock_mhz_at_start: int | None = None

    def warm_up(self, busy_ms: float = 0.0) -> None:
        """Run every path once per direction on one page (slot 0), so kernel compilation (NVRTC)
        and handle creation stay out of the measured calls, and the copier's own submission path
        once; grow CuPy's memory pool for the largest slot-index upload. Before signing: it
        overwrites slot 0.
        Then, with ``busy_ms``, spin every SM that long (:func:`hw.gpu_clocks.keep_busy`), so the
        measured phase starts on a GPU out of its idle clocks; the SM clock is read just after."""
        import numpy as np

        from hw.gpu_clocks import keep_busy, sm_clock_mhz

        layout = self.pools.layout
        if layout.num_levels < 2:
            return
        for pg in layout.pool_groups:
            if not all(layout.level_slots[lv][pg.index] for lv in (0, 1)):
                continue
            one = np.zeros(1, dtype=np.int32)
            for src, dst in ((0, 1), (1, 0)):
                batch = CopyBatch(src, dst, pg.index, one, one, pg.pool_slot_bytes)
                for path in ("kernel", "ce-batch", "ce-page"):
                    self.pools.copy_batch(batch, path, self.plan_copier.stream)
                # The submission path itself (path selection, events, records) once, too.
                self.plan_copier.submit([batch])
                self.plan_copier.wait()
        # Grow CuPy's memory pool to the largest slot-index upload a batch can need, so a run's
        # first large batch does not wait for a device allocation.
        import cupy

        most = max(n for level in layout.level_slots for n in level)
        grown = [cupy.empty(most, dtype=cupy.int32) for _ in range(2)]
        del grown
        self.plan_copier.stream.synchronize()
        self.busy_ms = busy_ms
        if busy_ms > 0:
            keep_busy(busy_ms, self.plan_copier.stream)
        self.sm_clock_mhz_at_start = sm_clock_mhz(self.pools.device)

    def sign_all(self, manager: KVCacheManager) -> None:
        """Before the run: sign every live page (setup ran without real copies)."""
        if self.verify_enabled:
            from hw.executor_copies import SignatureTracker

            self.tracker = SignatureTracker(manager, self.pools)
            self.pages_signed += self.tracker.sign_new()

    def start(self, t0: float) -> None:
        self.plan_copier.set_origin()
        self._origin_host = time.perf_counter() - t0

    def submit(self, batch: CopyBatch, thread: str, api: str, now: float) -> CopyRecord:
        (done,) = self.plan_copier.submit([batch])
        rec = CopyRecord("cuda", thread, api, batch.kind, done.path, batch.num_pages,
                         batch.page_bytes, batch.num_bytes, done.ctas, done.ctas or 0, now)
        self.records.append(rec)
        self._pairs.append((rec, done))
        return rec

    def wait(self, records: list[CopyRecord]) -> None:
        self.plan_copier.wait()

    def check_call(self, manager: KVCacheManager, batches: list[CopyBatch]) -> None:
        """--verify: wait for this call's copies, check every signed page, sign new ones."""
        if self.tracker is None:
            return
        self.plan_copier.wait()
        summary = self.tracker.after_call(f"verify after {len(batches)} copy batches")
        self.pages_verified += summary.pages_verified
        self.pages_signed += summary.pages_signed

    def finish(self) -> None:
        self.plan_copier.wait()
        for rec, done in self._pairs:
            if done.device_start_s is not None:
                rec.started = self._origin_host + done.device_start_s
                rec.finished = self._origin_host + done.device_end_s
