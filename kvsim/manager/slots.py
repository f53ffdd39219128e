"""Slot allocator: the slots of one pool group on one cache level.

A slot is where a page lives on a level. ``slot_to_page`` maps each slot to the page in it (or -1)
and a stack of free slots hands out the most recently freed slot first (initially the lowest), so
layouts are deterministic and allocation and release are O(n) in the pages moved.
"""

from __future__ import annotations

import numpy as np

from kvsim.errors import OutOfPagesError


class SlotAllocator:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slot_to_page = np.full(num_slots, -1, dtype=np.int32)
        self._free = np.arange(num_slots - 1, -1, -1, dtype=np.int32)  # top = end = lowest slot
        self._num_free = num_slots

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_slots - self._num_free

    def free_slots(self) -> np.ndarray:
        return self._free[: self._num_free]

    def used_pages(self) -> np.ndarray:
        """Pages in this allocator's slots, in slot order."""
        return self.slot_to_page[self.slot_to_page >= 0]

    def allocate(self, pages: np.ndarray) -> np.ndarray:
        """Give each page a free slot; returns the slots in the same order."""
        n = pages.size
        if n > self._num_free:
            raise OutOfPagesError(f"need {n} slots, {self._num_free} free")
        top = self._num_free
        slots = self._free[top - n : top][::-1].copy()
        self._num_free = top - n
        self.slot_to_page[slots] = pages
        return slots

    def release(self, slots: np.ndarray) -> None:
        if slots.size == 0:
            return
        self.slot_to_page[slots] = -1
        top = self._num_free
        # Pushed reversed, so the next allocate() hands them back in the order given here.
        self._free[top : top + slots.size] = slots[::-1]
        self._num_free = top + slots.size

    def resize(self, num_slots: int) -> None:
        """Change the slot count; every slot at or above ``num_slots`` must be free."""
        if num_slots < self.num_slots and (self.slot_to_page[num_slots:] >= 0).any():
            raise RuntimeError("cannot shrink a slot allocator over used slots")
        s2p = np.full(num_slots, -1, dtype=np.int32)
        keep = min(num_slots, self.num_slots)
        s2p[:keep] = self.slot_to_page[:keep]
        self.slot_to_page = s2p
        self.num_slots = num_slots
        free = np.flatnonzero(s2p < 0)[::-1].astype(np.int32)
        self._free = np.empty(num_slots, dtype=np.int32)  # room for every slot to be freed
        self._free[: free.size] = free
        self._num_free = free.size
