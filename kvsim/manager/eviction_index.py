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

The reservoir is kept in eviction order with each page's key, and only the reported pages are
re-checked and re-keyed: a page of the reservoir that nobody reported is as it was when it was
keyed. That holds because every change of a page's evictability (its holders, lockers, node or
level) or of its key (priority, LRU tick, depth) while it could be a candidate is reported: the
storage's discipline (:meth:`kvsim.manager.storage.Storage.changed`), which the evictable counts
rely on too. A locked page's LRU tick may change unreported (an ACTIVE cache's commits); it is not
a candidate, and whatever unlocks it reports it. What a selection counts as ranked (the pages it
would re-check were it to re-check the whole reservoir: the CPU model prices them) is the same
either way.

The index is derived data: it never changes the manager's state and may be dropped at any time.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager.evictable_counts import EvictableCounts
from kvsim.manager.eviction import eviction_keys, first_in_order
from kvsim.manager.pages import PAGE_IDS, PageTable
from kvsim.manager.slots import SlotAllocator
from kvsim.manager.unique_ids import DistinctIds

RESERVOIR_PAGES = 4096
# A reservoir whose reported pages pile up past this many is dropped (rebuilt on next use): by
# then a scan is about as cheap as merging the reports.
MAX_PENDING_PAGES = 65536


class _Reservoir:
    """One (level, pool group)'s candidates in eviction order: ``ids`` with their
    ``keys``, sorted by (key, page id); ``member`` flags them by page id."""

    __slots__ = ("ids", "keys", "member", "bound_key", "bound_id", "complete", "pending",
                 "pending_pages")

    def __init__(self, ids: np.ndarray, keys: np.ndarray, capacity: int, bound_key: int,
                 bound_id: int, complete: bool) -> None:
        self.ids = ids
        self.keys = keys
        self.member = np.zeros(capacity, dtype=bool)
        self.member[ids] = True
        self.bound_key = bound_key
        self.bound_id = bound_id
        self.complete = complete  # every evictable page was in it when built: no bound
        self.pending: list[np.ndarray] = []
        self.pending_pages = 0  # the reported pages that count towards MAX_PENDING_PAGES


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
        self.selections = 0  # select() calls
        self.rebuilds = 0  # of which answered by a full scan
        self._distinct = DistinctIds()

    def changed(self, ids: np.ndarray | list[int], copy: bool = True, counted: bool = True) -> None:
        """Report pages whose evictability, level or eviction key may have changed (``copy``
        False: ``ids`` is a 1-D array of page ids nobody writes again). ``counted`` False: pages
        reported again soon (locked for a call that reports them when it is done), which do
        not count towards dropping a reservoir."""
        if not self._reservoirs:
            return
        if copy:
            ids = np.array(ids, dtype=PAGE_IDS).ravel()  # callers may reuse their array
        if ids.size == 0:
            return
        for res in self._reservoirs.values():
            res.pending.append(ids)
        if counted:
            self.passed_over(ids.size)

    def passed_over(self, num_pages: int) -> None:
        """Count pages towards dropping each reservoir (past MAX_PENDING_PAGES): the counted
        reports, and pages that changed but need none (new pages, held and locked: not
        candidates), so that reservoirs are dropped, and selections rank, exactly as if those
        had been reported."""
        for where, res in list(self._reservoirs.items()):
            res.pending_pages += num_pages
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
        least ``n``), and ``ranked`` is how many pages were ranked to decide (the reservoir and
        the reported pages that are candidates now).
        """
        self.selections += 1
        res = self._reservoirs.get((level, group))
        if res is not None:
            if res.pending:
                ranked = self._merge_reported(res, level, group)
            else:
                ranked, res.pending_pages = res.ids.size, 0  # pages passed over, if any
            size = res.ids.size
            if size >= n:
                return res.ids[:n].copy(), size, ranked
            if res.complete:
                return None, size, ranked
        return self._rebuild(level, group, n)

    def _merge_reported(self, res: _Reservoir, level: int, group: int) -> int:
        """Re-check and re-key the pages reported since the last selection and put those that
        rank within the bound into the reservoir, in order. Returns the candidates ranked."""
        pending = res.pending
        reported = np.concatenate(pending) if len(pending) > 1 else pending[0]  # with repeats
        res.pending, res.pending_pages = [], 0
        member = res.member
        if member.size < self.pages.capacity:  # the page table grew
            member = res.member = np.concatenate(
                [member, np.zeros(self.pages.capacity - member.size, dtype=bool)])
        out = reported[member.take(reported)]
        if out.size:  # they leave, and come back below if they still rank within the bound
            member[out] = False
            kept = member.take(res.ids)
            res.ids, res.keys = res.ids[kept], res.keys[kept]
        # Each candidate once (most reported pages are not candidates: de-duplicated after).
        here = self._distinct(reported[self._here(reported, level, group)], self.pages.capacity)
        ranked = res.ids.size + here.size
        if here.size:
            keys = eviction_keys(self.pages, here)
            if not res.complete:
                inside = (keys < res.bound_key) | ((keys == res.bound_key) &
                                                   (here <= res.bound_id))
                here, keys = here[inside], keys[inside]
            if here.size:
                _insert(res, here, keys)
        return ranked

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
        capacity = self.pages.capacity
        if cand.size <= size:
            order = np.lexsort((cand, keys))
            cand, keys = cand[order], keys[order]
            self._reservoirs[(level, group)] = _Reservoir(cand, keys, capacity, 0, 0,
                                                          complete=True)
            if cand.size < n:
                return None, ranked, ranked
            return cand[:n].copy(), ranked, ranked
        kept = first_in_order(cand, keys, size)  # in eviction order: the last one is the bound
        kept_keys = eviction_keys(self.pages, kept)
        self._reservoirs[(level, group)] = _Reservoir(kept, kept_keys, capacity,
                                                      int(kept_keys[-1]), int(kept[-1]),
                                                      complete=False)
        return kept[:n].copy(), ranked, ranked


def _insert(res: _Reservoir, ids: np.ndarray, keys: np.ndarray) -> None:
    """Put pages ``ids`` (none of them in the reservoir) with their ``keys`` into ``res``'s
    (key, page id) order."""
    order = np.lexsort((ids, keys))
    ids, keys = ids[order], keys[order]
    at = np.searchsorted(res.keys, keys, side="left")
    end = np.searchsorted(res.keys, keys, side="right")
    for i in (end > at).nonzero()[0].tolist():  # equal keys (rare): the page ids decide
        lo = int(at[i])
        at[i] = lo + int(np.searchsorted(res.ids[lo:end[i]], ids[i]))
    res.ids = np.insert(res.ids, at, ids)
    res.keys = np.insert(res.keys, at, keys)
    res.member[ids] = True
