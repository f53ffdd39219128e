"""Storage: slot allocators per (level, pool group), the page table and the eviction cascade.

Making room is split in two so that a failed call changes nothing: :meth:`Storage.plan_room`
decides every victim of the cascade without touching state (or raises ``OutOfPagesError``), and
:meth:`Storage.apply_eviction` carries the decided steps out, coldest level first, so each move
finds its destination slots already free.

Victims of a level go one level colder, which makes room in turn; victims of the last level are
dropped. When the colder level cannot take them all, the victims no cache holds are dropped
instead of moved, without being recorded (KVCM2's ``_prepare_free_slots``: only pages held by a
suspended cache must find room); which of them move is kvsim's choice: the ones latest in
eviction order (the most valuable) move, the first ones are dropped.

Whether a migration or drop is recorded in the statistics is the caller's to say (``record``):
KVCM2 records what a cache's own calls cause, not what ``KVCacheManager.resize`` or a prefetch
causes; and of migrations it records only those leaving or reaching the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.errors import OutOfPagesError
from kvsim.manager.config import StorageLayout
from kvsim.manager.evictable_counts import EvictableCounts
from kvsim.manager.eviction import rank_of, select_victims
from kvsim.manager.eviction_index import EvictionIndex
from kvsim.manager.pages import PAGE_IDS, PageTable
from kvsim.manager.plan import CopyBatch, Plan
from kvsim.manager.slots import SlotAllocator
from kvsim.manager.stats import Statistics
from kvsim.manager.unique_ids import unique_ids


@dataclass(frozen=True, slots=True)
class EvictionStep:
    """Move ``victims`` from ``level`` to ``dst_level``, or drop them when ``dst_level`` is None
    (``overflow``: dropped above the last level because the colder level had no room; never
    recorded)."""

    level: int
    pool_group: int
    victims: np.ndarray
    dst_level: int | None
    overflow: bool = False


class Storage:
    # Tests set this: every victim selection through the index is checked against a full scan.
    check_eviction_index = False

    def __init__(self, layout: StorageLayout, stats: Statistics | None = None) -> None:
        self.layout = layout
        self.pages = PageTable()
        self.allocators = [[SlotAllocator(n) for n in level] for level in layout.level_slots]
        self.last_level = layout.num_levels - 1
        self.counts = EvictableCounts(self.pages, layout.num_levels, layout.num_pool_groups,
                                      self.last_level)
        self.index = EvictionIndex(self.pages, self.allocators, self.last_level, self.counts)
        self.stats = stats
        # Called with the ids of committed pages about to be dropped, so the radix tree can
        # forget them before their rows are freed.
        self.on_drop: Callable[[np.ndarray, Plan], None] | None = None

    # -- queries ------------------------------------------------------------------------------
    def num_slots(self, level: int, group: int) -> int:
        return self.allocators[level][group].num_slots

    def evictable_at(self, level: int, group: int) -> np.ndarray:
        """Every evictable page at ``(level, group)`` (a full scan)."""
        return self.index.scan(level, group)

    def evictable_count(self, level: int, group: int) -> int:
        """How many pages at ``(level, group)`` are evictable (kept up to date, no scan)."""
        n = self.counts.count(level, group)
        if self.check_eviction_index and n != self.evictable_at(level, group).size:
            raise AssertionError(f"evictable count at level {level} group {group} is {n}; a "
                                 f"full scan finds {self.evictable_at(level, group).size}")
        return n

    def changed(self, ids: np.ndarray | list[int], counted: bool = True) -> None:
        """Callers report every page whose holders, lockers, node, level or LRU tick they
        change (before the next read), so the eviction index and the evictable counts stay
        exact (see :mod:`kvsim.manager.eviction_index`, :mod:`~kvsim.manager.evictable_counts`).
        ``counted``: as :meth:`EvictionIndex.changed <kvsim.manager.eviction_index.EvictionIndex.changed>`."""
        ids = np.array(ids, dtype=PAGE_IDS).ravel()  # one copy for both: callers may reuse theirs
        self.index.changed(ids, copy=False, counted=counted)
        self.counts.changed(ids, copy=False)

    def locked(self, ids: np.ndarray) -> None:
        """Report pages a call has just locked and will report again before it returns
        (``resume``, ``prefetch``): they stop being candidates for the room it makes meanwhile,
        without counting twice towards an eviction reservoir's drop."""
        self.changed(ids, counted=False)

    def block_stats(self) -> np.ndarray:
        """(levels, pool groups, 3): available, unavailable and evictable blocks per cell."""
        out = np.zeros((self.layout.num_levels, self.layout.num_pool_groups, 3), dtype=np.int64)
        evictable = self.counts.table()
        for lv, row in enumerate(self.allocators):
            for g, alloc in enumerate(row):
                n = int(evictable[lv, g])
                if self.check_eviction_index:
                    self.evictable_count(lv, g)
                available = alloc.num_free + n
                out[lv, g] = (available, alloc.num_slots - available, n)
        return out

    # -- making room --------------------------------------------------------------------------
    def plan_room(self, level: int, group: int, num_pages: int, plan: Plan,
                  extra_free: int = 0) -> list[EvictionStep]:
        """Steps that leave ``num_pages`` free slots at ``(level, group)``; mutates nothing.

        ``extra_free`` counts slots the caller will free itself before applying the steps.
        Victims of a non-last level go one level colder (recursively making room there);
        victims of the last level are dropped. Raises ``OutOfPagesError`` when impossible.
        """
        short = num_pages - self.allocators[level][group].num_free - extra_free
        if short <= 0:
            return []
        victims, evictable, ranked = self.index.select(level, group, short)
        plan.counts.eviction_rounds += 1
        plan.counts.eviction_candidates += ranked
        if self.check_eviction_index:
            self._check_index(level, group, short, victims)
        if victims is None:
            raise OutOfPagesError(
                f"level {self.layout.level_names[level]!r} pool group {group}: need {short} more "
                f"slots, only {evictable} evictable pages"
            )
        if level == self.last_level:
            return [EvictionStep(level, group, victims, None)]
        try:
            colder = self.plan_room(level + 1, group, short, plan)
            return colder + [EvictionStep(level, group, victims, level + 1)]
        except OutOfPagesError:
            pass
        # The colder level cannot take every victim: those held by a cache must move, the rest
        # may be dropped. Move as many as the colder level can make room for.
        held = self.pages.holders[victims] > 0
        must = int(held.sum())
        below = self.allocators[level + 1][group]
        _, colder_evictable, _ = self.index.select(level + 1, group, below.num_slots + 1)
        for k in range(min(victims.size - 1, below.num_free + colder_evictable), must - 1, -1):
            try:
                colder = self.plan_room(level + 1, group, k, plan) if k else []
            except OutOfPagesError:
                continue
            droppable = victims[~held]
            keep = droppable.size - (k - must)
            moved = np.concatenate([victims[held], droppable[keep:]])
            steps = colder + [EvictionStep(level, group, droppable[:keep], None, overflow=True)]
            return steps + ([EvictionStep(level, group, moved, level + 1)] if moved.size else [])
        raise OutOfPagesError(
            f"level {self.layout.level_names[level]!r} pool group {group}: {must} pages held by "
            f"suspended caches must move to level {self.layout.level_names[level + 1]!r}, "
            "which has no room for them")

    def _check_index(self, level: int, group: int, n: int, victims: np.ndarray | None) -> None:
        scanned = self.evictable_at(level, group)
        expected = None if scanned.size < n else select_victims(self.pages, scanned, n)
        got = None if victims is None else victims.tolist()
        if got != (None if expected is None else expected.tolist()):
            raise AssertionError(f"eviction index at level {level} group {group} chose {got} "
                                 f"for {n} victims; a full scan chooses "
                                 f"{None if expected is None else expected.tolist()}")

    def apply_eviction(self, steps: list[EvictionStep], plan: Plan, record: bool) -> None:
        """Carry out planned steps; ``record``: the statistics count them (a cache's call)."""
        p = self.pages
        for step in steps:
            # A dropped full-attention page takes the blocks below it out of the tree, and
            # their unowned pages are freed with it: skip victims freed by an earlier step.
            victims = step.victims[p.level[step.victims] == step.level]
            if step.dst_level is None:
                self.drop(victims, plan, record and not step.overflow)
            else:
                self.move(victims, step.level, step.dst_level, step.pool_group, plan, record)

    # -- primitive mutations --------------------------------------------------------------------
    def move(self, ids: np.ndarray, src: int, dst: int, group: int, plan: Plan,
             record: bool) -> None:
        """Migrate pages of one pool group from ``src`` to ``dst`` as one copy batch; when
        ``record``, a move off the GPU counts as offload and one onto it as onboard."""
        if ids.size == 0:
            return
        pages = self.pages
        src_slots = pages.slot[ids].copy()
        dst_slots = self.allocators[dst][group].allocate(ids)
        self.allocators[src][group].release(src_slots)
        pages.level[ids] = dst
        pages.slot[ids] = dst_slots
        self.changed(ids)
        pg = self.layout.pool_groups[group]
        batch = CopyBatch(src, dst, group, src_slots, dst_slots, pg.pool_slot_bytes)
        plan.copies.append(batch)
        c = plan.counts
        c.pages_migrated += ids.size
        c.pages_touched += ids.size
        c.slots_allocated += ids.size
        c.slots_freed += ids.size
        if self.stats is not None and record and (src == 0) != (dst == 0):
            self.stats.record_migration(batch.kind, pages.life_cycle[ids], c)

    def move_to(self, ids: np.ndarray, dst: int, plan: Plan, record: bool) -> None:
        """:meth:`move` pages from any levels and pool groups to level ``dst``: one copy batch
        per (source level, pool group), in level order, then group order."""
        p = self.pages
        levels = p.level[ids]
        for level in unique_ids(levels).tolist():
            for g in unique_ids(p.pool_group[ids[levels == level]]).tolist():
                self.move(ids[(levels == level) & (p.pool_group[ids] == g)], level, dst, g, plan,
                          record)

    def copy_pages(self, src_ids: np.ndarray, dst_ids: np.ndarray, group: int,
                   plan: Plan) -> None:
        """Copy the data of pages ``src_ids`` (all on one level) into pages ``dst_ids``."""
        if src_ids.size == 0:
            return
        p = self.pages
        src_level, dst_level = int(p.level[src_ids[0]]), int(p.level[dst_ids[0]])
        batch = CopyBatch(src_level, dst_level, group, p.slot[src_ids].copy(),
                          p.slot[dst_ids].copy(), self.layout.pool_groups[group].pool_slot_bytes)
        plan.copies.append(batch)
        plan.counts.pages_touched += src_ids.size + dst_ids.size
        if self.stats is not None:
            self.stats.record_migration(batch.kind, p.life_cycle[src_ids], plan.counts)

    def compact(self, level: int, group: int, num_slots: int, plan: Plan) -> None:
        """Shrink or grow ``(level, group)`` to ``num_slots``, moving pages out of cut slots.

        The caller has already evicted enough pages for the rest to fit.
        """
        alloc = self.allocators[level][group]
        if num_slots < alloc.num_slots:
            ids = alloc.slot_to_page[num_slots:]
            ids = ids[ids >= 0]
            if ids.size:
                free_low = np.sort(alloc.free_slots())
                free_low = free_low[free_low < num_slots][: ids.size]
                src = self.pages.slot[ids].copy()
                alloc.slot_to_page[src] = -1
                alloc.slot_to_page[free_low] = ids
                self.pages.slot[ids] = free_low
                plan.copies.append(CopyBatch(level, level, group, src, free_low,
                                             self.layout.pool_groups[group].pool_slot_bytes))
                plan.counts.pages_migrated += ids.size
                plan.counts.pages_touched += ids.size
        alloc.resize(num_slots)

    def allocate(self, level: int, group: int, life_cycles: np.ndarray, depths: np.ndarray,
                 priorities: np.ndarray, tick: int, plan: Plan) -> np.ndarray:
        """New pages at ``level`` (slots must be free), held and locked by the one cache they
        are allocated for; returns their ids."""
        ids = self.pages.allocate(life_cycles.size)
        slots = self.allocators[level][group].allocate(ids)
        p = self.pages
        p.holders[ids] = 1
        p.lockers[ids] = 1
        p.level[ids] = level
        p.slot[ids] = slots
        p.pool_group[ids] = group
        p.life_cycle[ids] = life_cycles
        p.depth[ids] = depths
        p.priority[ids] = priorities
        p.rank[ids] = rank_of(priorities, depths)
        p.last_used[ids] = tick
        # Not reported: a held and locked page is neither evictable nor a candidate, and the
        # row's last change before (its free) was reported. The index still counts them.
        self.index.passed_over(ids.size)
        plan.counts.pages_allocated += ids.size
        plan.counts.slots_allocated += ids.size
        plan.counts.pages_touched += ids.size
        return ids

    def free(self, ids: np.ndarray, plan: Plan) -> None:
        """Release the slots and rows of pages nobody references any more."""
        if ids.size == 0:
            return
        p = self.pages
        levels, groups, slots = p.level[ids], p.pool_group[ids], p.slot[ids]
        for lv in unique_ids(levels).tolist():
            for g in unique_ids(groups[levels == lv]).tolist():
                sel = (levels == lv) & (groups == g)
                self.allocators[lv][g].release(slots[sel])
        p.free(ids)
        self.changed(ids)
        plan.counts.pages_freed += ids.size
        plan.counts.slots_freed += ids.size

    def drop(self, ids: np.ndarray, plan: Plan, record: bool) -> None:
        """Drop committed, unowned pages: the tree forgets them, then their rows are freed.

        ``record``: count them as host-dropped (KVCM2 counts every last-level drop a cache's
        call causes as a host drop, whatever the level).
        """
        if ids.size == 0:
            return
        if self.stats is not None and record:
            self.stats.record_migration("drop", self.pages.life_cycle[ids], plan.counts)
        if self.on_drop is not None:
            self.on_drop(ids, plan)
        plan.counts.pages_dropped += ids.size
        self.free(ids, plan)
