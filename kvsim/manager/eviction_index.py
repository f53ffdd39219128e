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

The reservoir keeps each page's key: a page not reported since it was ranked still has that key
and is still evictable there (every change to its evictability, level or key is reported), so a
selection ranks only the reported pages, not the whole reservoir again. Reported pages in
the reservoir leave it and come back ranked afresh if they still qualify.

The index is derived data: it never changes the manager's state and may be dropped at any time.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager.evictable_counts import EvictableCounts
from kvsim.manager.eviction import eviction_keys, first_in_order
from kvsim.manager.pages import PageTable
from kvsim.manager.slots import SlotAllocator
from kvsim.manager.unique_ids import unique_ids

RESERVOIR_PAGES = 4096
# A reservoir whose reported pages pile up past this many is dropped (rebuilt on next use): by
# then a scan is about as cheap as merging the reports.
MAX_PENDING_PAGES = 65536


class _Reservoir:
    __slots__ = ("ids", "keys", "bound_key", "bound_id", "complete", "pending", "pending_pages")

    def __init__(self, ids: np.ndarray, keys: np.ndarray, bound_key: int, bound_id: int,
                 complete: bool) -> None:
        self.ids = ids  # evictable pages of the cell when last ranked (any order)
        self.keys = keys  # their eviction keys then
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
        # re-checks the reported pages with one gather of their cells instead of seven of the
        # page table: the same pages, as long as every change is reported (the counts'
        # discipline).
        self.counts = counts
        self._reservoirs: dict[tuple[int, int], _Reservoir] = {}
        self._mark = np.zeros(0, dtype=bool)  # scratch, all False between calls
        self.selections = 0  # select() calls
        self.rebuilds = 0  # of which answered by a full scan

    def changed(self, ids: np.ndarray | list[int]) -> None:
        """Report pages whose evictability, level or eviction key may have changed."""
        if not self._reservoirs:
            return
        ids = np.array(ids, dtype=np.int32).ravel()  # a copy: callers may reuse their array
        if ids.size == 0:
            return
        for where, res in list(self._reservoirs.items()):
            res.pending.append(ids)
            res.pending_pages += ids.size
            if res.pending_pages > MAX_PENDING_PAGES:
                del self._reservoirs[where]

    def locked(self, ids: np.ndarray) -> None:
        """Pages just locked: out of every reservoir now (they cannot be candidates until a
        report unlocks them). Not a report: the reservoirs' pending counts do not grow."""
        for res in self._reservoirs.values():
            if res.ids.size:
                keep = ~self._among(res.ids, ids)
                res.ids, res.keys = res.ids[keep], res.keys[keep]

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
            cand, keys = res.ids, res.keys
            ranked = int(cand.size)
            if res.pending:
                reported = unique_ids(np.concatenate(res.pending))
                res.pending, res.pending_pages = [], 0
                stale = self._among(cand, reported)
                if stale.any():
                    cand, keys = cand[~stale], keys[~stale]
                fresh = reported[self._here(reported, level, group)]
                fresh_keys = eviction_keys(self.pages, fresh)
                # ranked: the reservoir's pages and the reported ones that are evictable here
                ranked = int(cand.size + fresh.size)
                if not res.complete:
                    inside = (fresh_keys < res.bound_key) | \
                        ((fresh_keys == res.bound_key) & (fresh <= res.bound_id))
                    fresh, fresh_keys = fresh[inside], fresh_keys[inside]
                cand = np.concatenate([cand, fresh])
                keys = np.concatenate([keys, fresh_keys])
                res.ids, res.keys = cand, keys
            if cand.size >= n:
                return first_in_order(cand, keys, n), int(cand.size), ranked
            if res.complete:
                return None, int(cand.size), ranked
        return self._rebuild(level, group, n)

    def _among(self, ids: np.ndarray, reported: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are in ``reported`` (one mark per page row, cleared after)."""
        mark = self._mark
        if mark.size < self.pages.capacity:
            mark = self._mark = np.zeros(self.pages.capacity, dtype=bool)
        mark[reported] = True
        found = mark[ids]
        mark[reported] = False
        return found

    def _here(self, ids: np.ndarray, level: int, group: int) -> np.ndarray:
        """Which of ``ids`` are live pages of ``(level, group)`` that may be evicted now."""
        ids = ids.astype(np.intp, copy=False)
        if self.counts is not None:
            return self.counts.inside(ids, level, group)
        p = self.pages
        return (np.take(p.level, ids) == level) & (np.take(p.pool_group, ids) == group) & \
            p.evictable(ids, self.last_level)

    def _rebuild(self, level: int, group: int, n: int) -> tuple[np.ndarray | None, int, int]:
        self.rebuilds += 1
        cand = self.scan(level, group) if self.counts is None else self.counts.members(level, group)
        keys = eviction_keys(self.pages, cand)
        ranked = int(cand.size)
        size = max(RESERVOIR_PAGES, 2 * n)
        if cand.size <= size:
            self._reservoirs[(level, group)] = _Reservoir(cand, keys, 0, 0, complete=True)
            if cand.size < n:
                return None, ranked, ranked
            return first_in_order(cand, keys, n), ranked, ranked
        kept = first_in_order(cand, keys, size)  # in eviction order: the last one is the bound
        kept_keys = eviction_keys(self.pages, kept)
        self._reservoirs[(level, group)] = _Reservoir(kept, kept_keys, int(kept_keys[-1]),
                                                      int(kept[-1]), complete=False)
        return kept[:n], ranked, ranked
