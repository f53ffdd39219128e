"""The page table: one row per live page, as parallel numpy arrays.

A page is one block of one life cycle. Its identity (the row index) survives migration between
levels; only ``level`` and ``slot`` change. Keeping the attributes in flat arrays lets eviction of
thousands of pages run as a handful of vectorised operations instead of per-page objects.

Status is derived, never stored:
* LOCKED     -- ``lockers > 0`` (used by an ACTIVE cache; must be on the GPU level);
* HELD       -- ``holders > 0 and lockers == 0`` (owned by suspended caches only);
* DROPPABLE  -- ``holders == 0`` (no owner; committed ones stay reusable via the radix tree).
A page is committed when a radix-tree node points to it (``node >= 0``).
"""

from __future__ import annotations

import numpy as np

NO_PAGE = -1
# The dtype of every array of page ids: numpy's own index type. A gather or scatter indexed
# with int32 ids converts them first, every time: 2-4x the cost of one with native indices
# (measured on the 2-core machine, numpy 2: 371 ids, a scatter 3.2 against 1.3 us).
PAGE_IDS = np.intp


class PageTable:
    """Rows of page attributes plus a free list of row ids."""

    _INT_FIELDS = (
        ("level", np.int8, -1),
        ("slot", np.int32, -1),
        ("pool_group", np.int16, -1),
        ("life_cycle", np.int16, -1),
        ("node", np.int32, -1),
        ("holders", np.int32, 0),
        ("lockers", np.int32, 0),
        ("priority", np.int16, 0),
        ("last_used", np.int64, 0),
        ("depth", np.int32, 0),
        ("planned_drops", np.int32, 0),
        # priority and depth as the eviction key lays them out (kvsim.manager.eviction.rank_of),
        # written with them: a key is then two gathers, not three and five more passes
        ("rank", np.int64, 0),
    )

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = 0
        for name, dtype, _ in self._INT_FIELDS:
            setattr(self, name, np.empty(0, dtype=dtype))
        # Bumped each time a row is freed, so a stale reference to a reused row is detectable.
        self.generation = np.empty(0, dtype=np.int64)
        self._free_ids = np.empty(0, dtype=PAGE_IDS)  # stack; the top is the end
        self._num_free = 0
        self._grow(capacity)

    # -- row ids ---------------------------------------------------------------------------
    def _grow(self, new_capacity: int) -> None:
        old = self.capacity
        for name, dtype, fill in self._INT_FIELDS:
            arr = np.full(new_capacity, fill, dtype=dtype)
            arr[:old] = getattr(self, name)
            setattr(self, name, arr)
        generation = np.zeros(new_capacity, dtype=np.int64)
        generation[:old] = self.generation
        self.generation = generation
        # New ids go below the existing free ids so the lowest id is handed out first.
        fresh = np.arange(new_capacity - 1, old - 1, -1, dtype=PAGE_IDS)
        free = np.empty(new_capacity, dtype=PAGE_IDS)
        free[: fresh.size] = fresh
        free[fresh.size : fresh.size + self._num_free] = self._free_ids[: self._num_free]
        self._free_ids = free
        self._num_free += fresh.size
        self.capacity = new_capacity

    def allocate(self, n: int) -> np.ndarray:
        """Take ``n`` fresh row ids (attributes at their defaults)."""
        if n > self._num_free:
            self._grow(max(self.capacity * 2, self.capacity + n - self._num_free))
        top = self._num_free
        ids = self._free_ids[top - n : top][::-1].copy()
        self._num_free = top - n
        return ids

    def free(self, ids: np.ndarray) -> None:
        """Return rows to the free list and reset their attributes."""
        if ids.size == 0:
            return
        for name, _, fill in self._INT_FIELDS:
            getattr(self, name)[ids] = fill
        self.generation[ids] += 1
        top = self._num_free
        self._free_ids[top : top + ids.size] = ids[::-1]
        self._num_free = top + ids.size

    @property
    def num_live(self) -> int:
        return self.capacity - self._num_free

    def live_ids(self) -> np.ndarray:
        return np.flatnonzero(self.level >= 0)

    def free_id_list(self) -> np.ndarray:
        return self._free_ids[: self._num_free]

    # -- derived status ----------------------------------------------------------------------
    def evictable(self, ids: np.ndarray, last_level: int,
                  levels: np.ndarray | None = None) -> np.ndarray:
        """Evictable = (DROPPABLE and committed) or (HELD and not on the last level).
        ``levels``: the rows' levels, when the caller has them already."""
        ids = ids.astype(np.intp, copy=False)  # take with native indices: the fast gather
        # Holder and locker counts are never negative (the invariant checker's rule), so a
        # count's zero test is a logical not: numpy 2 compares with a Python scalar at about
        # twice the cost of an operation on arrays alone, on the few rows of most calls.
        unheld = np.logical_not(self.holders.take(ids))
        droppable_committed = unheld & (self.node.take(ids) >= 0)
        if levels is None:
            levels = self.level.take(ids)
        held_unlocked = ~(unheld | self.lockers.take(ids).astype(bool))
        return droppable_committed | (held_unlocked & (levels != last_level))

    def _arrays(self) -> dict[str, np.ndarray]:
        """Every array of the table by name (the arrays themselves, not copies)."""
        arrays = {name: getattr(self, name) for name, _, _ in self._INT_FIELDS}
        arrays["generation"] = self.generation
        arrays["free_ids"] = self.free_id_list()
        return arrays

    def snapshot(self) -> dict[str, np.ndarray]:
        """A copy of every array, for byte-for-byte comparisons in tests."""
        return {name: a.copy() for name, a in self._arrays().items()}

    def snapshot_bytes(self) -> dict[str, bytes]:
        """:meth:`snapshot` as the arrays' bytes (taken without copying the arrays first)."""
        return {name: a.tobytes() for name, a in self._arrays().items()}
