"""Sorted distinct ids, exactly what ``np.unique`` returns, by a sort.

numpy 2's ``np.unique`` of integers goes through a hash table and costs, on the page-id batches
the manager de-duplicates (tens to tens of thousands of int32), 15 to 30 times a plain sort and
a neighbour comparison (measured: 20,000 ids 1.6 ms against 57 us). The manager's hot paths
(eviction candidates, evictable counts, resume) call :func:`unique_ids` instead, and
:func:`unique_union` where most of the ids are already sorted.
"""

from __future__ import annotations

import numpy as np


def unique_ids(ids: np.ndarray) -> np.ndarray:
    """``np.unique(ids)`` for a 1-D integer array: sorted, each value once."""
    return _distinct(np.sort(ids))


def unique_union(sorted_ids: np.ndarray, more: list[np.ndarray]) -> np.ndarray:
    """``np.unique`` of ``sorted_ids`` and the arrays of ``more`` together, for ``sorted_ids``
    already sorted (an eviction reservoir, merged with the pages reported since): ``more`` is
    sorted alone, then the two sorted runs are merged by a stable sort (timsort merges runs).
    Measured: 3,000 + 1,300 ids 21 us against 51 us for :func:`unique_ids`; 30,000 + 40,000,
    1.1 ms against 1.5 ms. Correct for any ``sorted_ids``; fast when it is sorted."""
    extra = np.sort(np.concatenate(more))
    return _distinct(np.sort(np.concatenate([sorted_ids, extra]), kind="stable"))


def _distinct(s: np.ndarray) -> np.ndarray:
    """Each value of the sorted ``s`` once."""
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
