"""Invariant checker: the manager's state, verified from scratch.

Usable from tests (after every step of a property test) and from the executors (after every
call, when checking is on). ``find_violations`` lists every broken rule; ``check_invariants``
raises :class:`~kvsim.errors.InvariantViolation` with all of them.

Rules:
* every live page sits in exactly one slot of one level, and that slot names it back; free slot
  lists hold no duplicates and no used slot (no page lost or double-owned across tiers);
* slot usage stays within each level's quota; the evictable counts agree with a full scan;
* refcounts are never negative and equal what the open caches hold; LOCKED pages are on the GPU;
* every committed page is reachable: its node points back to it and the node hangs from a live root;
* every live page is owned by a cache or by the tree (nothing leaks);
* each cache keeps ``committed <= history <= capacity`` and has a page exactly for its live blocks;
  the pages it holds aside are uncommitted, of out-of-window blocks it has not committed yet.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from kvsim.errors import InvariantViolation
from kvsim.manager.eviction import rank_of
from kvsim.manager.kv_cache import CacheStatus
from kvsim.manager.pages import NO_PAGE, PAGE_IDS

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager


def _count(ids: list[np.ndarray], capacity: int) -> np.ndarray:
    """How many times each page id in ``[0, capacity)`` occurs in ``ids``."""
    if not ids:
        return np.zeros(capacity, dtype=np.int64)
    return np.bincount(np.concatenate(ids).astype(np.intp, copy=False), minlength=capacity)


def _check_storage(mgr: KVCacheManager, out: list[str]) -> None:
    p = mgr.storage.pages
    live = p.live_ids()
    in_slots: list[np.ndarray] = []  # every used slot's page, counted in one go below
    for lv, row in enumerate(mgr.storage.allocators):
        for g, alloc in enumerate(row):
            where = f"level {lv} pool group {g}"
            used_slots = np.flatnonzero(alloc.slot_to_page >= 0)
            ids = alloc.slot_to_page[used_slots]
            if alloc.num_used + alloc.num_free != alloc.num_slots or alloc.num_used != ids.size:
                out.append(f"{where}: {ids.size} used + {alloc.num_free} free != {alloc.num_slots} slots")
            free = alloc.free_slots()
            if free.size and (free.min() < 0 or free.max() >= alloc.num_slots):
                out.append(f"{where}: free list holds slots outside [0, {alloc.num_slots})")
                continue
            # (a count per slot: linear, where de-duplicating by a sort was most of the check)
            if free.size > 1 and _count([free], alloc.num_slots).max() > 1:
                out.append(f"{where}: duplicate slots in the free list")
            if (alloc.slot_to_page[free] >= 0).any():
                out.append(f"{where}: a slot in the free list holds a page")
            bad = (p.level[ids] != lv) | (p.pool_group[ids] != g) | (p.slot[ids] != used_slots)
            if bad.any():
                out.append(f"{where}: slots {used_slots[bad][:5].tolist()} name pages that do "
                           "not name them back")
            in_slots.append(ids)
    seen = _count(in_slots, p.capacity)
    if (seen[live] != 1).any():
        out.append(f"pages in {sorted(set(seen[live].tolist()))} slots, expected exactly 1: "
                   f"{live[seen[live] != 1][:5].tolist()}")
    if (seen[p.level < 0] != 0).any():
        out.append("a free page row is still in a slot")
    if (p.rank[live] != rank_of(p.priority[live], p.depth[live])).any():
        out.append("a page's eviction rank disagrees with its priority and depth")
    kept = mgr.storage.counts.table()
    for lv in range(mgr.layout.num_levels):
        for g in range(mgr.layout.num_pool_groups):
            scanned = mgr.storage.evictable_at(lv, g).size
            if kept[lv, g] != scanned:
                out.append(f"level {lv} pool group {g}: {kept[lv, g]} evictable pages counted, "
                           f"a scan finds {scanned} (a change not reported to storage.changed)")


def _check_ownership(mgr: KVCacheManager, out: list[str]) -> None:
    p = mgr.storage.pages
    held: list[np.ndarray] = []  # pages held, one entry per holding (counted in one go below)
    locked: list[np.ndarray] = []
    tpb = mgr.layout.tokens_per_block
    for cache in mgr.open_caches():
        name = f"cache {cache.cache_id!r}"
        if not cache.num_committed_tokens <= cache.history_length <= cache.capacity:
            out.append(f"{name}: committed {cache.num_committed_tokens} <= history "
                       f"{cache.history_length} <= capacity {cache.capacity} broken")
        num_blocks = math.ceil(cache.capacity / tpb)
        for lc in mgr.layout.life_cycles:
            table = cache._pages[lc.index]
            if table.size != num_blocks:
                out.append(f"{name} life cycle {lc.index}: {table.size} blocks, expected {num_blocks}")
                continue
            live_block = np.ones(num_blocks, dtype=bool)
            begin, end = lc.stale_range(cache.history_length, tpb)
            live_block[begin:end] = False
            has = table >= 0
            if (has != live_block).any():
                out.append(f"{name} life cycle {lc.index}: pages present for blocks "
                           f"{np.flatnonzero(has != live_block)[:5].tolist()} disagree with the "
                           f"live blocks (stale range [{begin}, {end}))")
            ids = table[has]
            if (p.level[ids] < 0).any():
                out.append(f"{name} life cycle {lc.index}: holds freed pages")
                continue
            if (p.life_cycle[ids] != lc.index).any() or \
                    (p.depth[ids] != np.flatnonzero(has)).any():
                out.append(f"{name} life cycle {lc.index}: pages of another life cycle or block")
            held.append(ids)
            if cache.status is CacheStatus.ACTIVE:
                locked.append(ids)
            aside = cache._held_stale[lc.index]
            if aside:
                ords = np.fromiter(aside, dtype=np.int64)
                pages = np.fromiter(aside.values(), dtype=PAGE_IDS)
                if not ((begin <= ords) & (ords < end)).all() or \
                        (ords < cache._committed_blocks).any() or cache._stopped_committing:
                    out.append(f"{name} life cycle {lc.index}: pages held aside for blocks "
                               f"{ords.tolist()} that are not uncommitted out-of-window blocks "
                               f"(stale range [{begin}, {end}))")
                if (p.level[pages] < 0).any() or (p.node[pages] >= 0).any() or \
                        (p.life_cycle[pages] != lc.index).any() or (p.depth[pages] != ords).any():
                    out.append(f"{name} life cycle {lc.index}: pages held aside are freed, "
                               "committed, or of another life cycle or block")
                held.append(pages)
    holders, lockers = _count(held, p.capacity), _count(locked, p.capacity)
    if (p.holders < 0).any() or (p.lockers < 0).any() or (p.planned_drops < 0).any():
        out.append("negative refcount")
    if (holders != p.holders).any():
        bad = np.flatnonzero(holders != p.holders)[:5]
        out.append(f"holder counts of pages {bad.tolist()} are {p.holders[bad].tolist()}, "
                   f"the open caches hold {holders[bad].tolist()}")
    if (lockers != p.lockers).any():
        bad = np.flatnonzero(lockers != p.lockers)[:5]
        out.append(f"locker counts of pages {bad.tolist()} are {p.lockers[bad].tolist()}, "
                   f"the ACTIVE caches lock {lockers[bad].tolist()}")
    locked_off_gpu = (p.lockers > 0) & (p.level != 0)
    if locked_off_gpu.any():
        out.append(f"LOCKED pages off the GPU level: {np.flatnonzero(locked_off_gpu)[:5].tolist()}")
    live = p.live_ids()
    orphan = live[(p.holders[live] == 0) & (p.node[live] < 0)]
    if orphan.size:
        out.append(f"pages owned by nobody (leaked): {orphan[:5].tolist()}")


def _check_tree(mgr: KVCacheManager, out: list[str]) -> None:
    p = mgr.storage.pages
    tree = mgr.tree
    nodes = list(tree.nodes.values())
    # The page back-pointers of every node, and every committed page's node, checked as arrays
    # (a per-page loop of numpy scalar reads dominated the checker on long chains); the
    # messages come out in the same order as a loop over the nodes would give them.
    ids = np.fromiter((n.node_id for n in nodes), dtype=np.int64, count=len(nodes))
    width = mgr.layout.num_life_cycles
    page_lists = [n.pages for n in nodes]
    if any(len(pages) != width for pages in page_lists):
        out.append(f"radix tree: a node without exactly {width} pages (one per life cycle)")
        return
    table = np.fromiter(chain.from_iterable(page_lists), dtype=np.int64,
                        count=len(nodes) * width).reshape(len(nodes), width)
    has = table != NO_PAGE
    rows = np.where(has, table, 0)
    bad_page = has & ((p.level[rows] < 0) | (p.node[rows] != ids[:, None])
                      | (p.life_cycle[rows] != np.arange(width)))
    bad_rows = set(np.flatnonzero(bad_page.any(axis=1)).tolist())
    for i, node in enumerate(nodes):
        node_id = node.node_id
        root = tree.roots.get(node.root.scope)
        if root is not node.root:
            out.append(f"node {node_id}: not reachable from its root")
            continue
        # Linear: each node checks only its parent (alive, one block shallower); by induction
        # every chain reaches a root.
        parent = node.parent
        if parent is None:
            if node.depth != 0 or root.child(node.raw) is not node:
                out.append(f"node {node_id}: a top-level node at depth {node.depth} or not a root child")
        elif tree.nodes.get(parent.node_id) is not parent:
            out.append(f"node {node_id}: parent {parent.node_id} was removed")
        elif parent.depth + 1 != node.depth or parent.child(node.raw) is not node:
            out.append(f"node {node_id}: depth {node.depth} under parent of depth {parent.depth}, "
                       "or not among its parent's children")
        for child in node.child_nodes():
            if tree.nodes.get(child.node_id) is not child:
                out.append(f"node {node_id}: child {child.node_id} was removed")
        if i in bad_rows:
            for lc in np.flatnonzero(bad_page[i]).tolist():
                out.append(f"node {node_id}: page {int(table[i, lc])} of life cycle {lc} does "
                           "not point back")
    per_root = Counter(id(n.root) for n in nodes)
    for root in tree.roots.values():
        if any(tree.nodes.get(n.node_id) is not n for n in root.child_nodes()):
            out.append(f"root {root.scope!r}: maps a removed node")
        if root.num_nodes != per_root[id(root)]:
            out.append(f"root {root.scope!r}: counts {root.num_nodes} nodes, has {per_root[id(root)]}")
    committed = np.flatnonzero(p.node >= 0)
    row_of = np.full(max(tree._next_node_id, int(p.node.max(initial=-1)) + 1), -1, dtype=np.int64)
    row_of[ids] = np.arange(ids.size)
    row = row_of[p.node[committed]]
    found = row >= 0
    back = np.zeros(committed.size, dtype=bool)
    back[found] = table[row[found], p.life_cycle[committed[found]]] == committed[found]
    for page in committed[~back].tolist():
        out.append(f"committed page {page} is not reachable from the tree")


def find_violations(mgr: KVCacheManager) -> list[str]:
    out: list[str] = []
    _check_storage(mgr, out)
    _check_ownership(mgr, out)
    _check_tree(mgr, out)
    return out


def check_invariants(mgr: KVCacheManager) -> None:
    problems = find_violations(mgr)
    if problems:
        raise InvariantViolation("manager invariants broken:\n  " + "\n  ".join(problems))
