"""Eviction order and the slot allocator, on hand-made page tables."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import OutOfPagesError
from kvsim.manager.eviction import select_victims
from kvsim.manager.pages import PageTable
from kvsim.manager.slots import SlotAllocator


def table(priority, last_used, depth) -> tuple[PageTable, np.ndarray]:
    pages = PageTable(capacity=4)
    ids = pages.allocate(len(priority))
    pages.priority[ids] = priority
    pages.last_used[ids] = last_used
    pages.depth[ids] = depth
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
