"""A byte-exact fingerprint of the manager's state.

Used to prove that read-only calls (``probe_reuse``) change nothing and that failed calls leave
the manager as it was. Covers the page table, every slot allocator, the radix tree, the pending
root erasures, the open caches (their pending statistics too), the statistics and the LRU
clock.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager


def state_of(mgr: KVCacheManager) -> dict:
    """The manager's state as plain, comparable data."""
    tree = mgr.tree
    return {
        "pages": {k: v.tobytes() for k, v in mgr.storage.pages.snapshot().items()},
        "slots": [[(a.num_slots, a.slot_to_page.tobytes(), a.free_slots().tobytes())
                   for a in row] for row in mgr.storage.allocators],
        "roots": {repr(scope): sorted((n.node_id, n.key) for n in root.nodes_by_key.values())
                  for scope, root in tree.roots.items()},
        "nodes": {nid: (n.key, None if n.parent is None else n.parent.node_id, n.depth,
                        n.tokens.tobytes(), tuple(n.pages), sorted(n.children))
                  for nid, n in tree.nodes.items()},
        "pending_root_erasures": [repr(s) for s in tree.pending_root_erasures],
        "next_node_id": tree._next_node_id,
        "caches": {repr(cid): (c.status.value, c.capacity, c.history_length,
                               c._tokens.tobytes(), c._committed_blocks, c._tail_key,
                               c._stopped_committing, [t.tobytes() for t in c._pages],
                               [sorted(h.items()) for h in c._held_stale], c._never_resumed,
                               c._generation_ready,
                               {k: v.tobytes() for k, v in c._pending.delta.items()},
                               c._pending.by_level.tobytes(), repr(c._pending.segments))
                   for cid, c in mgr._caches.items()},
        "stats": ({k: v.tobytes() for k, v in mgr.stats.iteration.items()},
                  {k: v.tobytes() for k, v in mgr.stats.cumulative.items()},
                  mgr.stats.iteration_by_level.tobytes(), mgr.stats.cumulative_by_level.tobytes(),
                  None if mgr.stats.peaks is None else mgr.stats.peaks.tobytes()),
        "tick": mgr._tick,
        "next_cache_id": mgr._next_cache_id,
        "shut_down": mgr._is_shut_down,
    }


def fingerprint(mgr: KVCacheManager) -> str:
    """SHA-256 of :func:`state_of`; equal fingerprints mean byte-identical state."""
    return hashlib.sha256(pickle.dumps(state_of(mgr), protocol=4)).hexdigest()


def state_digest(mgr: KVCacheManager) -> dict[str, object]:
    """A cheap digest of the shared state, one entry per component, for the lock-discipline
    checker (run around every call that does not hold the lock exclusively).

    Not byte-exact like :func:`fingerprint` (array sums can miss a swap), but any creation,
    deletion, move or refcount change of a page, slot, node, root or queued erasure shows.
    """
    p = mgr.storage.pages
    tree = mgr.tree
    return {
        "page table": (p.num_live, int(p.holders.sum()), int(p.lockers.sum()), int(p.node.sum()),
                       int(p.level.sum()), int(p.slot.sum()), int(p.last_used.sum()),
                       int(p.planned_drops.sum())),
        "slot allocators": tuple((a.num_free, int(a.slot_to_page.sum()))
                                 for row in mgr.storage.allocators for a in row),
        "radix tree roots": tuple(sorted(map(repr, tree.roots))),
        "radix tree nodes": (len(tree.nodes), tree._next_node_id),
        "root-erase queue": tuple(map(repr, tree.pending_root_erasures)),
        "living caches": tuple(sorted((repr(k), c.status.value) for k, c in mgr._caches.items())),
        "statistics": (None if mgr.stats.peaks is None else mgr.stats.peaks.tobytes(),
                       tuple(int(v.sum()) for v in mgr.stats.iteration.values())),
    }
