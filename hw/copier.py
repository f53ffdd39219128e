"""PoolCopier: the hardware executor's copies, on a CUDA stream, timed with CUDA events.

``submit`` enqueues one manager :class:`~kvsim.manager.plan.CopyBatch` on the copier's stream
through the chosen path (``auto``: :mod:`hw.copy_select` picks per batch from the hardware
spec; or a fixed path) between two CUDA events, and returns its :class:`CopyRecord`. At
``finish`` the stream is synchronised and each record's start and end are read from its events,
placed on the executor's ``perf_counter`` timeline through a base event recorded at the start.

``--verify``: every page gets a signature derived from its identity (page row and generation)
when first seen; after each call's copies the copier synchronises and checks every destination
slot against the signature of the page the manager now keeps there (a partial-reuse copy takes
its source's signature). Any mismatch raises :class:`hw.pools.IntegrityError` naming the pages.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch
from kvsim.sim.records import CopyRecord

log = logging.getLogger("kvsim.hw")


class PoolCopier:
    name = "cuda"

    def __init__(self, pools: Any, hardware: Any, path: str = "auto", ctas: int | None = None,
                 inflight_bytes: int | None = None, verify: bool = False) -> None:
        import cupy

        self.cp = cupy
        self.pools = pools
        self.hardware = hardware
        self.path = path
        self.ctas = ctas
        self.inflight_bytes = inflight_bytes
        self.verify_enabled = verify
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.records: list[CopyRecord] = []
        self._events: list[tuple[CopyRecord, Any, Any]] = []
        self._base_event = None
        self._base_host = 0.0
        self._key: dict[int, int] = {}  # page row -> signature key (verify mode)
        self.pages_verified = 0
        self.pages_signed = 0

    def start(self, t0: float) -> None:
        """Mark the run's start on the device timeline (``t0`` is the executor's perf_counter)."""
        self._base_event = self.cp.cuda.Event()
        self._base_event.record(self.stream)
        self._base_host = time.perf_counter() - t0

    def _choose(self, batch: CopyBatch) -> str:
        if batch.kind == "intra":
            return "kernel" if self.path == "auto" else self.path
        if self.path != "auto":
            return self.path
        from hw.copy_select import select_path

        path, _estimate = select_path(self.hardware, batch.kind, batch.page_bytes, batch.num_pages)
        return path

    def submit(self, batch: CopyBatch, thread: str, api: str, now: float) -> CopyRecord:
        path = self._choose(batch)
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record(self.stream)
        done = self.pools.copy_batch(batch, path, self.stream, ctas=self.ctas,
                                     inflight_bytes=self.inflight_bytes)
        end.record(self.stream)
        rec = CopyRecord("cuda", thread, api, batch.kind, path, batch.num_pages, batch.page_bytes,
                         batch.num_bytes, done.ctas, done.ctas or 0, now)
        self.records.append(rec)
        self._events.append((rec, start, end))
        log.debug("%s %s: %d x %d B via %s", api, batch.kind, batch.num_pages, batch.page_bytes, path)
        return rec

    def wait(self, records: list[CopyRecord]) -> None:
        self.stream.synchronize()

    def finish(self) -> None:
        self.stream.synchronize()
        if self._base_event is None:
            return
        for rec, start, end in self._events:
            rec.started = self._base_host + self.cp.cuda.get_elapsed_time(self._base_event, start) / 1e3
            rec.finished = self._base_host + self.cp.cuda.get_elapsed_time(self._base_event, end) / 1e3

    # -- --verify ---------------------------------------------------------------------------------
    # _key[page] = (generation, signature key) of the bytes now in that page's slot.

    def _fresh_key(self, manager: KVCacheManager, page: int) -> tuple[int, int]:
        gen = int(manager.storage.pages.generation[page])
        return gen, (gen << 32) | page

    def sign_all(self, manager: KVCacheManager) -> None:
        """Write every live page's signature (at the start: setup ran without real copies)."""
        if self.verify_enabled:
            self._key.clear()
            self._sign_new(manager)

    def check_call(self, manager: KVCacheManager, batches: list[CopyBatch]) -> None:
        """Verify this call's copies landed intact, then sign its new pages. Runs under the lock."""
        if not self.verify_enabled:
            return
        self.stream.synchronize()
        storage = manager.storage
        p = storage.pages
        for b in batches:
            dst_pages = storage.allocators[b.dst_level][b.pool_group].slot_to_page[b.dst_slots]
            if b.kind == "intra":
                # A partial-reuse copy: the new page holds its source page's bytes.
                src_pages = storage.allocators[b.src_level][b.pool_group].slot_to_page[b.src_slots]
                for s, d in zip(src_pages.tolist(), dst_pages.tolist()):
                    self._key[d] = (int(p.generation[d]), self._key[s][1])
            keys = np.array([self._key[d][1] for d in dst_pages.tolist()], dtype=np.uint64)
            result = self.pools.verify(b.dst_level, b.pool_group, b.dst_slots, keys)
            result.raise_if_bad(f"verify after {b.kind} {b.src_level}->{b.dst_level}")
            self.pages_verified += result.pages
        self._sign_new(manager)

    def _sign_new(self, manager: KVCacheManager) -> None:
        p = manager.storage.pages
        live = p.live_ids().tolist()
        alive = set(live)
        for page in [k for k in self._key if k not in alive]:
            del self._key[page]  # freed; its row may come back as a new page
        fresh: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for page in live:
            known = self._key.get(page)
            if known is not None and known[0] == int(p.generation[page]):
                continue
            self._key[page] = self._fresh_key(manager, page)
            fresh.setdefault((int(p.level[page]), int(p.pool_group[page])), []).append(
                (int(p.slot[page]), self._key[page][1]))
        for (level, group), items in fresh.items():
            self.pools.fill_signature(level, group, np.array([s for s, _ in items], dtype=np.int64),
                                      np.array([k for _, k in items], dtype=np.uint64))
            self.pages_signed += len(items)
        if fresh:
            self.cp.cuda.runtime.deviceSynchronize()
