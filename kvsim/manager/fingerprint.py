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

import numpy as np

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager


def state_of(mgr: KVCacheManager) -> dict:
    """The manager's state as plain, comparable data."""
    tree = mgr.tree
    scope_of = {id(root): repr(scope) for scope, root in tree.roots.items()}
    return {
        "pages": mgr.storage.pages.snapshot_bytes(),
        "slots": [[(a.num_slots, a.slot_to_page.tobytes(), a.free_slots().tobytes())
                   for a in row] for row in mgr.storage.allocators],
        "roots": {repr(scope): (root.num_nodes, [n.node_id for n in root.child_nodes()],
                                {-1 if parent is None else parent.node_id: [n.node_id for n in ns]
                                 for parent, ns in root.partials.items()})
                  for scope, root in tree.roots.items()},
        "nodes": {nid: (scope_of.get(id(n.root)) or repr(n.root.scope),
                        None if n.parent is None else n.parent.node_id, n.depth, n.raw,
                        tuple(n.pages), [c.node_id for c in n.child_nodes()])
                  for nid, n in tree.nodes.items()},
        "pending_root_erasures": [repr(s) for s in tree.pending_root_erasures],
        "next_node_id": tree._next_node_id,
        "caches": {repr(cid): (c.status.value, c.capacity, c.history_length,
                               c._tokens.tobytes(), c._committed_blocks,
                               None if c._tail_node is None else c._tail_node.node_id,
                               c._stopped_committing, [t.tobytes() for t in c._pages],
                               [sorted(h.items()) for h in c._held_stale], c._never_resumed,
                               c._generation_ready,
                               c._pending.delta.tobytes(),
                               c._pending.by_level.tobytes(), repr(c._pending.segments))
                   for cid, c in mgr._caches.items()},
        "stats": (mgr.stats.iteration.tobytes(), mgr.stats.cumulative.tobytes(),
                  mgr.stats.iteration_by_level.tobytes(), mgr.stats.cumulative_by_level.tobytes(),
                  None if mgr.stats.peaks is None else mgr.stats.peaks.tobytes()),
        "tick": mgr._tick,
        "next_cache_id": mgr._next_cache_id,
        "shut_down": mgr._is_shut_down,
    }


def fingerprint(mgr: KVCacheManager) -> str:
    """SHA-256 of :func:`state_of`; equal fingerprints mean byte-identical state."""
    return hashlib.sha256(pickle.dumps(state_of(mgr), protocol=4)).hexdigest()


_add = np.add.reduce


def checksum(values: np.ndarray) -> int:
    """A sum of ``values`` that any change of one element alters: the array's bytes summed as
    64-bit words (wrapping) when they come in whole words, else its elements. Summing words
    instead of small integers spares numpy the widening to 64 bits, 3-10x faster on the page
    table's columns, which :func:`state_digest` sums around every call."""
    if values.nbytes % 8 == 0 and values.flags.c_contiguous:
        return int(_add(values.view(np.uint64)))
    return int(_add(values))


def state_digest(mgr: KVCacheManager) -> dict[str, object]:
    """A cheap digest of the shared state, one entry per component, for the lock-discipline
    checker (run around every call that does not hold the lock exclusively).

    Not byte-exact like :func:`fingerprint` (sums can miss a swap or changes that cancel), but
    any creation, deletion, move or refcount change of a page, slot, node, root or queued
    erasure shows.
    """
    p = mgr.storage.pages
    tree = mgr.tree
    return {
        "page table": (p.num_live, checksum(p.holders), checksum(p.lockers), checksum(p.node),
                       checksum(p.level), checksum(p.slot), checksum(p.last_used),
                       checksum(p.planned_drops)),
        "slot allocators": tuple((a.num_free, checksum(a.slot_to_page))
                                 for row in mgr.storage.allocators for a in row),
        # Sets and tuples of the scopes and cache ids themselves (hashable: they key dicts), not
        # of their sorted reprs: the same comparison for a tenth of the cost.
        "radix tree roots": frozenset(tree.roots),
        "radix tree nodes": (len(tree.nodes), tree._next_node_id),
        "root-erase queue": tuple(tree.pending_root_erasures),
        "living caches": frozenset((k, c.status) for k, c in mgr._caches.items()),
        "statistics": (None if mgr.stats.peaks is None else mgr.stats.peaks.tobytes(),
                       mgr.stats.iteration.tobytes()),
    }
