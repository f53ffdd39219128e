"""Eviction order and the slot allocator, on hand-made page tables."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import OutOfPagesError
from kvsim.manager import eviction
from kvsim.manager.eviction import first_in_order, select_victims
from kvsim.manager.pages import PageTable
from kvsim.manager.slots import SlotAllocator
from kvsim.manager.unique_ids import DistinctIds, unique_ids


def table(priority, last_used, depth) -> tuple[PageTable, np.ndarray]:
    pages = PageTable(capacity=4)
    ids = pages.allocate(len(priority))
    pages.priority[ids] = priority
    pages.last_used[ids] = last_used
    pages.depth[ids] = depth
    pages.rank[ids] = eviction.rank_of(pages.priority[ids], pages.depth[ids])
    return pages, ids


def test_priority_then_lru_then_deepest_then_id():
    pages, ids = table(priority=[35, 10, 35, 35, 35, 35],
                       last_used=[5, 9, 3, 3, 3, 7],
                       depth=[0, 0, 1, 4, 4, 0])
    order = select_victims(pages, ids, ids.size)
    # priority 10 first; then tick 3 (deepest first; equal depth by page id); tick 5; tick 7
    assert order.tolist() == [ids[1], ids[3], ids[4], ids[2], ids[0], ids[5]]


def test_partial_selection_matches_the_full_order():
    rng = np.random.default_rng(7)
    n = 500
    pages, ids = table(rng.integers(0, 3, n), rng.integers(0, 20, n), rng.integers(0, 30, n))
    full = select_victims(pages, ids, n)
    for k in (1, 17, 250, 499):
        assert select_victims(pages, ids, k).tolist() == full[:k].tolist()
    with pytest.raises(ValueError):
        select_victims(pages, ids, n + 1)


def _by_key_then_id(candidates: np.ndarray, keys: np.ndarray, n: int) -> list[int]:
    return candidates[np.lexsort((candidates, keys))][:n].tolist()


def _narrows(keys: np.ndarray, n: int) -> bool:
    """Whether first_in_order's sampled estimate keeps at least n keys (else it uses them all)."""
    sample = np.sort(keys[::keys.size // eviction._SAMPLE])
    at = min(sample.size - 1, 2 * n * sample.size // keys.size + 8)
    return int(np.count_nonzero(keys <= sample[at])) >= n


@pytest.mark.parametrize("size", [eviction._NARROW_MIN, 9000, 90_000])
def test_many_candidates_give_the_full_orders_first_pages_whether_narrowed_or_not(size):
    """Among many candidates the selection is first narrowed by a key estimated from a sample:
    exact on random keys with many ties (narrowed), and on keys arranged so that the sample
    sees only the smallest ones (the estimate falls short and every candidate is ranked)."""
    rng = np.random.default_rng(size)
    candidates = np.sort(rng.choice(4 * size, size, replace=False)).astype(np.int32)
    tied = rng.integers(0, 40, size).astype(np.int64)  # ~size/40 candidates per key
    stride = size // eviction._SAMPLE
    fooled = np.full(size, 10**6, dtype=np.int64)
    fooled[::stride] = np.arange(fooled[::stride].size)  # small keys only where sampled
    many = size // eviction._NARROW_RATIO
    for keys in (tied, fooled):
        for n in (1, 7, 100, many):
            assert first_in_order(candidates, keys, n).tolist() == _by_key_then_id(candidates, keys, n)
    assert _narrows(tied, 100) and _narrows(tied, many)
    # A sample of every 2nd key always keeps enough; from every 3rd on it can fall short.
    assert _narrows(fooled, many) == (stride < 3)


def test_unique_ids_is_np_unique():
    """np.unique's answer: reported pages with repeats, unsorted, and empty batches."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        every = rng.integers(0, 500, int(rng.integers(0, 100))).astype(np.int32)
        got = unique_ids(every)
        assert got.dtype == np.int32 and got.tolist() == np.unique(every).tolist()


def test_distinct_ids_keeps_each_id_once_in_the_order_of_one_occurrence():
    """np.unique's values, unsorted: each value once, the result a subsequence of the batch,
    over batches that grow the scratch table, reuse it with stale cells, and are empty or of
    one id; a copy (a manager's snapshot) carries no scratch table."""
    import copy

    rng = np.random.default_rng(5)
    distinct = DistinctIds()
    for bound in (10, 500, 40, 3000):
        for _ in range(200):
            every = rng.integers(0, bound, int(rng.integers(0, 120))).astype(np.intp)
            got = distinct(every, bound)
            assert got.dtype == every.dtype
            assert sorted(got.tolist()) == np.unique(every).tolist()
            rest = iter(every.tolist())
            assert all(v in rest for v in got.tolist())  # in the batch's order
    twin = copy.deepcopy(distinct)
    assert twin._stamp.size == 0 and distinct._stamp.size == 3000
    assert twin(np.array([3, 3, 1]), 4).tolist() == [3, 1]


def test_page_rows_are_reused_and_generation_bumps():
    pages = PageTable(capacity=2)
    a = pages.allocate(3)  # grows
    assert pages.capacity >= 3 and sorted(a.tolist()) == [0, 1, 2]
    pages.level[a] = 0
    gen = pages.generation[a[0]]
    pages.free(a[:1])
    assert pages.level[a[0]] == -1 and pages.generation[a[0]] == gen + 1
    assert pages.allocate(1).tolist() == [a[0]]


def test_slot_allocator_hands_out_lowest_first_and_refuses_overflow():
    alloc = SlotAllocator(4)
    slots = alloc.allocate(np.array([10, 11], dtype=np.int32))
    assert slots.tolist() == [0, 1] and alloc.num_free == 2
    alloc.release(np.array([0], dtype=np.int32))
    assert alloc.allocate(np.array([12], dtype=np.int32)).tolist() == [0]
    with pytest.raises(OutOfPagesError):
        alloc.allocate(np.arange(5, dtype=np.int32))
    alloc.resize(8)
    assert alloc.num_free == 6 and alloc.slot_to_page[:2].tolist() == [12, 11]
    with pytest.raises(RuntimeError):
        alloc.resize(1)
