"""Victim selection without ranking every page of a level on every call.

Ranking all evictable pages of a level (:func:`kvsim.manager.eviction.select_victims` over a scan)
costs O(pages on the level) per call, which dominates long replays where each decode step evicts a
page or two out of ~100K. This index keeps, per (level, pool group), a **reservoir**: the pages
that were the K first in eviction order when it was built, with the last one's (key, page id) as
its **bound**. Every change that can make a page evictable or lower its key is reported with
:meth:`EvictionIndex.changed`; a page neither in the reservoir nor reported since is unchanged, so
it still ranks after the bound. Hence the first ``n`` pages in eviction order are the first ``n``
among (reservoir + reported pages, re-checked and re-keyed now) that rank within the bound, as long
as there are ``n`` of them; otherwise the reservoir is rebuilt from a full scan. Selection results
are exactly those of the full scan (``Storage.check_eviction_index`` asserts it in the tests).

The index is derived data: it never changes the manager's state and may be dropped at any time.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager.evictable_counts import EvictableCounts
from kvsim.manager.eviction import eviction_keys, first_in_order
from kvsim.manager.pages import PageTable
from kvsim.manager.slots import SlotAllocator
from kvsim.manager.unique_ids import unique_union

RESERVOIR_PAGES = 4096
# A reservoir whose reported pages pile up past this many is dropped (rebuilt on next use): by
# then a scan is about as cheap as merging the reports.
MAX_PENDING_PAGES = 65536


class _Reservoir:
    __slots__ = ("ids", "bound_key", "bound_id", "complete", "pending", "pending_pages")

    def __init__(self, ids: np.ndarray, bound_key: int, bound_id: int, complete: bool) -> None:
        self.ids = ids
        self.bound_key = bound_key
        self.bound_id = bound_id
        self.complete = complete  # every evictable page was in it when built: no bound
        self.pending: list[np.ndarray] = []
        self.pending_pages = 0


class EvictionIndex:
    """Reservoirs of eviction candidates for each (level, pool group) of one storage."""

    def __init__(self, pages: PageTable, allocators: list[list[SlotAllocator]],
                 last_level: int, counts: EvictableCounts | None = None) -> None:
        self.pages = pages
        self.allocators = allocators
        self.last_level = last_level
        # With the storage's evictable counts, a rebuild takes the evictable pages from their
        # cells (in page id order: the gathers that rank them run in memory order) instead of
        # scanning the level, 2-3x cheaper on a level of 100K-300K pages, and a selection
        # re-checks its candidates with one gather of their cells instead of seven of the page
        # table: the same pages, as long as every change is reported (the counts' discipline).
        self.counts = counts
        self._reservoirs: dict[tuple[int, int], _Reservoir] = {}
        self.selections = 0  # select() calls
        self.rebuilds = 0  # of which answered by a full scan

    def changed(self, ids: np.ndarray | list[int], copy: bool = True) -> None:
        """Report pages whose evictability, level or eviction key may have changed (``copy``
        False: ``ids`` is a 1-D int32 array nobody writes again)."""
        if not self._reservoirs:
            return
        if copy:
            ids = np.array(ids, dtype=np.int32).ravel()  # callers may reuse their array
        if ids.size == 0:
            return
        for where, res in list(self._reservoirs.items()):
            res.pending.append(ids)
            res.pending_pages += ids.size
            if res.pending_pages > MAX_PENDING_PAGES:
                del self._reservoirs[where]

    def clear(self) -> None:
        self._reservoirs.clear()

    def scan(self, level: int, group: int) -> np.ndarray:
        """Every evictable page at ``(level, group)``, in slot order (the full scan)."""
        used = self.allocators[level][group].used_pages()
        return used[self.pages.evictable(used, self.last_level)]

    def select(self, level: int, group: int, n: int) -> tuple[np.ndarray | None, int, int]:
        """The first ``n`` evictable pages at ``(level, group)`` in eviction order.

        Returns ``(victims, evictable, ranked)``: ``victims`` is None when fewer than ``n`` pages
        are evictable, ``evictable`` is then their exact number (otherwise a lower bound, at
        least ``n``), and ``ranked`` is how many pages were ranked to decide.
        """
        self.selections += 1
        res = self._reservoirs.get((level, group))
        if res is not None:
            cand = res.ids
            if res.pending:
                cand = unique_union(cand, res.pending)  # ids: sorted, but for a scanned one
                res.pending, res.pending_pages = [], 0
            # Re-checked even without reports: the reservoir itself need not be reported to.
            cand = cand[self._here(cand, level, group)]
            keys = eviction_keys(self.pages, cand)
            ranked = int(cand.size)
            if not res.complete:
                inside = (keys < res.bound_key) | ((keys == res.bound_key) & (cand <= res.bound_id))
                cand, keys = cand[inside], keys[inside]
            res.ids = cand
            if cand.size >= n:
                return first_in_order(cand, keys, n), int(cand.size), ranked
            if res.complete:
                return None, int(cand.size), ranked
        return self._rebuild(level, group, n)

    def _here(self, ids: np.ndarray, level: int, group: int) -> np.ndarray:
        """Which of ``ids`` are live pages of ``(level, group)`` that may be evicted now."""
        ids = ids.astype(np.intp, copy=False)
        if self.counts is not None:
            return self.counts.inside(ids, level, group)
        p = self.pages
        return (p.level.take(ids) == level) & (p.pool_group.take(ids) == group) & \
            p.evictable(ids, self.last_level)

    def _rebuild(self, level: int, group: int, n: int) -> tuple[np.ndarray | None, int, int]:
        self.rebuilds += 1
        cand = self.scan(level, group) if self.counts is None else self.counts.members(level, group)
        keys = eviction_keys(self.pages, cand)
        ranked = int(cand.size)
        size = max(RESERVOIR_PAGES, 2 * n)
        if cand.size <= size:
            self._reservoirs[(level, group)] = _Reservoir(cand, 0, 0, complete=True)
            if cand.size < n:
                return None, ranked, ranked
            return first_in_order(cand, keys, n), ranked, ranked
        kept = first_in_order(cand, keys, size)  # in eviction order: the last one is the bound
        last = int(kept[-1])
        bound_key = int(eviction_keys(self.pages, kept[-1:])[0])
        self._reservoirs[(level, group)] = _Reservoir(np.sort(kept), bound_key, last,
                                                      complete=False)
        return kept[:n], ranked, ranked
