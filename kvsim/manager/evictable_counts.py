"""How many pages each (level, pool group) could evict now: kept up to date instead of scanned.

The statistics re-sample every (level, pool group) cell on each commit, and ``resume()``'s gate
reads the GPU's evictable pages; a scan of a level's pages each time costs O(pages) and dominated
long replays. Instead each page row remembers the cell it is counted in (``level * groups +
group`` while it is evictable, -1 otherwise) and each cell its count. Reported rows are
re-evaluated lazily, on the next read, so a report may come before or after the change it
announces, as long as it comes before the read: the discipline the eviction index already asks
for (:meth:`kvsim.manager.storage.Storage.changed`). ``Storage.check_eviction_index`` compares
every read with a full scan in the tests, and the invariant checker does too.

Derived data: it never changes the manager's state and is rebuilt from scratch on demand.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager.pages import PAGE_IDS, PageTable
from kvsim.manager.unique_ids import DistinctIds


class EvictableCounts:
    """Evictable pages per (level, pool group) of one storage."""

    def __init__(self, pages: PageTable, num_levels: int, num_groups: int,
                 last_level: int) -> None:
        self.pages = pages
        self.num_levels = num_levels
        self.num_groups = num_groups
        self.last_level = last_level
        self.counts = np.zeros(num_levels * num_groups, dtype=np.int64)
        self.cell = np.full(pages.capacity, -1, dtype=np.int32)
        self._pending: list[np.ndarray] = []
        self._distinct = DistinctIds()

    def changed(self, ids: np.ndarray | list[int], copy: bool = True) -> None:
        """Rows whose evictability, level or pool group may have changed (or will, before the
        next read); ``copy`` False: ``ids`` is a 1-D array of page ids nobody writes again."""
        if copy:
            ids = np.array(ids, dtype=PAGE_IDS).ravel()  # callers may reuse their array
        if ids.size:
            self._pending.append(ids)

    def _flush(self) -> None:
        # Runs on most reads (tens of thousands of times in a long replay), mostly for a few
        # dozen rows: few numpy calls, and the counts touched only for rows whose cell changed.
        pending = self._pending
        if not pending:
            return
        ids = np.concatenate(pending) if len(pending) > 1 else pending[0]
        self._pending = []
        p = self.pages
        if self.cell.size < p.capacity:
            grown = np.full(p.capacity, -1, dtype=np.int32)
            grown[:self.cell.size] = self.cell
            self.cell = grown
        ids = self._distinct(ids, p.capacity)  # each row once: a duplicate would count twice
        levels = p.level.take(ids)
        # each row's cell now: its (level, pool group), or -1 when it is not evictable (a freed
        # row is not)
        new = levels.astype(np.int32)
        if self.num_groups > 1:
            new = new * self.num_groups + p.pool_group.take(ids)
        new[~p.evictable(ids, self.last_level, levels)] = -1
        old = self.cell.take(ids)
        moved = old != new
        if not np.count_nonzero(moved):
            return
        old, new = old[moved], new[moved]
        size = self.counts.size
        self.counts += np.bincount(new[new >= 0], minlength=size)
        self.counts -= np.bincount(old[old >= 0], minlength=size)
        self.cell[ids[moved]] = new

    def count(self, level: int, group: int) -> int:
        self._flush()
        return int(self.counts[level * self.num_groups + group])

    def inside(self, ids: np.ndarray, level: int, group: int) -> np.ndarray:
        """Which of ``ids`` are evictable pages at ``(level, group)`` now: one gather of their
        cells (see :meth:`kvsim.manager.eviction_index.EvictionIndex.select`)."""
        self._flush()
        return self.cell.take(ids) == level * self.num_groups + group

    def members(self, level: int, group: int) -> np.ndarray:
        """The evictable pages at ``(level, group)``, in page id order: one pass over the
        rows' cells instead of a scan of the level's pages (see
        :meth:`kvsim.manager.eviction_index.EvictionIndex.select`)."""
        self._flush()
        return (self.cell == level * self.num_groups + group).nonzero()[0]

    def table(self) -> np.ndarray:
        """(levels, pool groups) evictable counts."""
        self._flush()
        return self.counts.reshape(self.num_levels, self.num_groups).copy()
