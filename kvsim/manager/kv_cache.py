"""One request's KV cache: a state machine over pages it holds in the manager's shared storage.

SUSPENDED --resume()--> ACTIVE --suspend()--> SUSPENDED; close() from any state -> CLOSED
(idempotent). Only an ACTIVE cache resizes and commits; its pages are LOCKED on the GPU level.
Every method validates first and mutates after, so a call that raises changes nothing.

A cache owns its own fields (tokens, capacity, history, page table, tail of its committed
blocks) and carries out its operations itself; what caches share (the page table and slots,
the radix tree, the statistics, the LRU clock) belongs to the manager, which it reaches through
``self._manager`` and its few shared helpers (``_release``, ``_priorities``, ``_emit``).

Invariant: ``num_committed_tokens <= history_length <= capacity``; the cache has
``ceil(capacity / tokens_per_block)`` blocks, each with one page per life cycle except the stale
blocks of sliding-window life cycles.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from kvsim.errors import InvalidArgumentError, InvalidStateError, OutOfPagesError
from kvsim.manager.calls import public_call
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.manager.pages import NO_PAGE
from kvsim.manager.plan import Plan
from kvsim.manager.radix_tree import Node, Root, block_key
from kvsim.manager.storage import EvictionStep

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager
    from kvsim.manager.matching import Match

PriorityCallback = Callable[[int, int], int]


class CacheStatus(Enum):
    SUSPENDED = "suspended"
    ACTIVE = "active"
    CLOSED = "closed"


def as_tokens(tokens: object, what: str = "tokens") -> np.ndarray:
    """Tokens as a 1-D uint32 array; rejects anything else with the rule it broke."""
    arr = np.asarray(tokens if tokens is not None else [])
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint32)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(f"{what} must be integer token ids, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= 1 << 32:
        raise InvalidArgumentError(f"{what} must be in [0, 2**32), got values in [{lo}, {hi}]")
    return arr.astype(np.uint32)


def require_size(name: str, value: object) -> int:
    """A token count: an integer in [0, MAX_SEQUENCE_TOKENS]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if not 0 <= value <= MAX_SEQUENCE_TOKENS:
        raise InvalidArgumentError(f"{name} must be in [0, {MAX_SEQUENCE_TOKENS}] tokens "
                                   f"(kvsim.manager.limits), got {value}")
    return int(value)


class KvCache:
    """A handle on one request's cache; create it with ``KVCacheManager.create_kv_cache``."""

    def __init__(self, manager: KVCacheManager, cache_id: Hashable, scope: Hashable,
                 priority_callback: PriorityCallback | None) -> None:
        self._manager = manager
        self.cache_id = cache_id
        self.scope = scope
        self.priority_callback = priority_callback
        self._status = CacheStatus.SUSPENDED
        self._tokens = np.zeros(0, dtype=np.uint32)  # committed tokens
        self._capacity = 0
        self._history = 0
        self._committed_blocks = 0  # full blocks committed into the radix tree
        self._tail_key = b""  # key of the last committed full block
        self._tail_node: Node | None = None
        self._stopped_committing = False
        n_lc = manager.layout.num_life_cycles
        self._pages = [np.zeros(0, dtype=np.int32) for _ in range(n_lc)]

    # -- accessors (no lock) ----------------------------------------------------------------------
    @property
    def status(self) -> CacheStatus:
        return self._status

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        """Like KVCM2's property: a resize that runs out of pages raises instead of returning."""
        if not self.resize(value):
            raise OutOfPagesError(f"cache {self.cache_id!r}: out of pages growing to {value} tokens")

    @property
    def history_length(self) -> int:
        return self._history

    @history_length.setter
    def history_length(self, value: int) -> None:
        if not self.resize(max(self._capacity, require_size("history_length", value)), value):
            raise OutOfPagesError(f"cache {self.cache_id!r}: out of pages for history {value}")

    @property
    def num_committed_tokens(self) -> int:
        return int(self._tokens.size)

    @property
    def num_blocks(self) -> int:
        return math.ceil(self._capacity / self._manager.layout.tokens_per_block)

    def page_ids(self, life_cycle: int) -> np.ndarray:
        """A copy of this cache's page ids for one life cycle (-1 where a block has no page)."""
        return self._pages[life_cycle].copy()

    def held_pages(self) -> np.ndarray:
        if not self._pages:
            return np.zeros(0, dtype=np.int32)
        allp = np.concatenate(self._pages)
        return allp[allp >= 0]

    # -- API ----------------------------------------------------------------------------------------
    @public_call("KvCache.resume")
    def resume(self, plan: Plan) -> bool:
        """Lock every page on the GPU, onboarding from colder levels.

        Returns False (and stays SUSPENDED) when GPU utilisation of a pool group would exceed
        ``max_util_for_resume`` or room cannot be made.
        """
        self._require(CacheStatus.SUSPENDED, "resume")
        m = self._manager
        storage = m.storage
        p = storage.pages
        ours = self.held_pages()
        groups = p.pool_group[ours]
        newly_locked = p.lockers[ours] == 0
        for pg in m.layout.pool_groups:
            g = pg.index
            total = storage.num_slots(0, g)
            used = storage.allocators[0][g].used_pages()
            locked = int((p.lockers[used] > 0).sum())
            need = int((newly_locked & (groups == g)).sum())
            if need and locked + need > m.config.max_util_for_resume * total:
                plan.ok = False
                return False
        p.lockers[ours] += 1  # locked pages are never eviction candidates
        onboard = ours[p.level[ours] > 0]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                n = int((p.pool_group[onboard] == pg.index).sum())
                steps += storage.plan_room(0, pg.index, n, plan)
        except OutOfPagesError:
            p.lockers[ours] -= 1
            storage.changed(ours)
            plan.ok = False
            return False
        storage.apply_eviction(steps, plan)
        levels = p.level[onboard]
        for level in np.unique(levels).tolist():
            for g in np.unique(p.pool_group[onboard[levels == level]]).tolist():
                sel = onboard[(levels == level) & (p.pool_group[onboard] == g)]
                storage.move(sel, level, 0, g, plan)
        if onboard.size:
            n_lc = m.layout.num_life_cycles
            onboarded = np.bincount(p.life_cycle[onboard], minlength=n_lc).astype(np.int64)
            m.stats.record(plan.counts, alloc_total_blocks=onboarded)
        p.last_used[ours] = m._now
        storage.changed(ours)
        plan.counts.pages_touched += ours.size
        self._status = CacheStatus.ACTIVE
        return True

    @public_call("KvCache.suspend")
    def suspend(self, plan: Plan) -> None:
        self._require(CacheStatus.ACTIVE, "suspend")
        m = self._manager
        p = m.storage.pages
        ours = self.held_pages()
        p.lockers[ours] -= 1
        p.last_used[ours] = m._now
        m.storage.changed(ours)
        plan.counts.pages_touched += ours.size
        self._status = CacheStatus.SUSPENDED

    @public_call("KvCache.close", skip_if=lambda c: c._status is CacheStatus.CLOSED
                 or c._manager._is_shut_down)
    def close(self, plan: Plan) -> None:
        """Release every page; closing a closed cache does nothing (not even a call)."""
        m = self._manager
        m._release(self.held_pages(), self._status is CacheStatus.ACTIVE, plan)
        self._pages = [np.zeros(0, dtype=np.int32) for _ in self._pages]
        self._status = CacheStatus.CLOSED
        m._caches.pop(self.cache_id, None)

    @public_call("KvCache.resize")
    def resize(self, plan: Plan, capacity: int, history_length: int | None = None) -> bool:
        """Grow or shrink to ``capacity`` tokens, optionally advancing the history.

        Needs ACTIVE. History never decreases and capacity never drops below it. Returns False,
        with nothing changed, when the GPU level cannot supply the pages.
        """
        self._require(CacheStatus.ACTIVE, "resize")
        capacity = require_size("capacity", capacity)
        history = self._history if history_length is None else require_size(
            "history_length", history_length)
        if history < self._history:
            raise InvalidArgumentError(
                f"history_length may not decrease: {history} < current {self._history}")
        if capacity < history:
            raise InvalidArgumentError(f"capacity {capacity} is below history_length {history}")
        return self._resize(capacity, history, plan)

    @public_call("KvCache.commit")
    def commit(self, plan: Plan, tokens: object) -> None:
        """Append committed tokens; every block that becomes full enters the radix tree."""
        self._require(CacheStatus.ACTIVE, "commit")
        if self._stopped_committing:
            raise InvalidStateError(f"cache {self.cache_id!r}: commit after stop_committing()")
        toks = as_tokens(tokens)
        total = self._tokens.size + toks.size
        if total > self._capacity:
            raise InvalidArgumentError(
                f"committing {toks.size} tokens would make {total} committed tokens, "
                f"above capacity {self._capacity}")
        self._commit(toks, plan)

    @public_call("KvCache.stop_committing")
    def stop_committing(self, plan: Plan) -> None:
        """Commit the partial tail block (if any); no commit may follow."""
        self._require(CacheStatus.ACTIVE, "stop_committing")
        if self._stopped_committing:
            return
        m = self._manager
        tpb = m.layout.tokens_per_block
        b = self._committed_blocks
        tail = self._tokens[b * tpb:]
        if tail.size:
            root = m.tree.root_for(self.scope)
            self._reattach(root, plan)
            self._commit_block(root, b, block_key(self._tail_key, tail), tail, plan)
        self._stopped_committing = True

    @public_call("KvCache.plan_committed_block_drop")
    def plan_committed_block_drop(self, plan: Plan) -> PlannedDrop | None:
        """Plan to drop the committed pages of sliding-window life cycles' current windows.

        Needs ``stop_committing()`` first. Returns None when nothing is committed or the tree no
        longer holds this cache's pages.
        """
        if not self._stopped_committing:
            raise InvalidStateError(
                f"cache {self.cache_id!r}: plan_committed_block_drop() needs stop_committing() first")
        return self._plan_drop(plan)

    def _require(self, status: CacheStatus, api: str) -> None:
        if self._status is not status:
            raise InvalidStateError(
                f"cache {self.cache_id!r}: {api}() needs a {status.value.upper()} cache, "
                f"this one is {self._status.value.upper()}")

    def __del__(self) -> None:
        # KVCM2 closes a cache from its destructor; the manager may already be gone.
        try:
            if self._status is not CacheStatus.CLOSED and not self._manager._is_shut_down:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a destructor
            pass

    def __repr__(self) -> str:
        return (f"KvCache(id={self.cache_id!r}, {self._status.value}, capacity={self._capacity}, "
                f"history={self._history}, committed={self._tokens.size})")

    # -- creation: taking over what a match found ---------------------------------------------------
    def _adopt(self, match: Match, toks: np.ndarray, plan: Plan, partial: Node | None,
               n_partial: int, partial_priorities: dict[int, np.ndarray] | None) -> None:
        """Start as a new cache holding ``match``'s pages (and a private copy of the partial
        block's), with committed tokens, history and capacity all equal to the match."""
        m = self._manager
        tpb = m.layout.tokens_per_block
        p = m.storage.pages
        nodes = match.nodes
        k = len(nodes)
        history = k * tpb + n_partial
        num_blocks = k + (1 if partial is not None else 0)
        plan.counts.tree_nodes_visited += num_blocks
        plan.counts.blocks_hashed += match.blocks_hashed
        input_blocks = math.ceil(toks.size / tpb)
        n_lc = m.layout.num_life_cycles
        reused = np.zeros(n_lc, dtype=np.int64)
        alloc_new = np.zeros(n_lc, dtype=np.int64)
        for lc in m.layout.life_cycles:
            arr = np.full(num_blocks, NO_PAGE, dtype=np.int32)
            begin, end = lc.stale_range(history, tpb)
            for b in list(range(0, min(begin, k))) + list(range(end, k)):
                arr[b] = nodes[b].pages[lc.index]
            self._pages[lc.index] = arr
            reused[lc.index] = int((arr >= 0).sum())
        held = self.held_pages()
        p.holders[held] += 1
        p.last_used[held] = m._now
        m.storage.changed(held)
        plan.counts.pages_touched += held.size
        if partial is not None:
            self._copy_partial(partial, k, partial_priorities, plan)
            alloc_new += 1
        missed = np.full(n_lc, max(0, input_blocks - num_blocks), dtype=np.int64)
        m.stats.record(plan.counts, reused_blocks=reused, missed_blocks=missed,
                       alloc_total_blocks=reused + alloc_new, alloc_new_blocks=alloc_new,
                       partial_reused_blocks=alloc_new)
        self._tokens = toks[:history].copy()
        self._capacity = self._history = history
        self._committed_blocks = k
        if k:
            self._tail_key, self._tail_node = nodes[-1].key, nodes[-1]

    def _copy_partial(self, source: Node, ordinal: int, priorities: dict[int, np.ndarray],
                      plan: Plan) -> None:
        """Private GPU copies of ``source``'s pages for this cache's last, partial block."""
        m = self._manager
        storage = m.storage
        p = storage.pages
        for pg in m.layout.pool_groups:
            lcs = np.array(pg.life_cycles, dtype=np.int16)
            prios = priorities[pg.index]
            new = storage.allocate(0, pg.index, lcs, np.full(lcs.size, ordinal), prios, m._now,
                                   plan)
            p.holders[new] = 1  # allocate() reported them
            src = np.array([source.pages[int(lc)] for lc in lcs], dtype=np.int32)
            for level in np.unique(p.level[src]).tolist():
                sel = p.level[src] == level
                storage.copy_pages(src[sel], new[sel], pg.index, plan)
            for lc, page in zip(lcs.tolist(), new.tolist()):
                self._pages[lc][ordinal] = page

    # -- resize --------------------------------------------------------------------------------------
    def _resize(self, capacity: int, history: int, plan: Plan) -> bool:
        m = self._manager
        storage = m.storage
        tpb = m.layout.tokens_per_block
        p = storage.pages
        new_blocks = math.ceil(capacity / tpb)
        old_blocks = self._pages[0].size if self._pages else 0
        span = max(new_blocks, old_blocks)
        ordinal = np.arange(span)
        tables: list[np.ndarray] = []
        new_ordinals: list[np.ndarray] = []
        released: list[np.ndarray] = []
        for lc in m.layout.life_cycles:
            have = np.full(span, NO_PAGE, dtype=np.int32)
            have[:old_blocks] = self._pages[lc.index]
            need = ordinal < new_blocks
            begin, end = lc.stale_range(history, tpb)
            need[begin:end] = False
            tables.append(have)
            new_ordinals.append(np.flatnonzero(need & (have < 0)))
            released.append(have[~need & (have >= 0)])
        priorities = [m._priorities(self.priority_callback, new_ordinals[lc.index], lc.index, plan)
                      for lc in m.layout.life_cycles]
        gone = np.concatenate(released)
        # Tentatively release, so released committed pages count as evictable and released
        # uncommitted ones as free; undone exactly if room cannot be made.
        old_last_used = p.last_used[gone].copy()
        np.subtract.at(p.holders, gone, 1)
        np.subtract.at(p.lockers, gone, 1)
        p.last_used[gone] = m._now
        storage.changed(gone)
        orphans = gone[(p.holders[gone] == 0) & (p.node[gone] < 0)]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                wanted = sum(new_ordinals[lc].size for lc in pg.life_cycles)
                freed = int((p.pool_group[orphans] == pg.index).sum())
                steps += storage.plan_room(0, pg.index, wanted, plan, extra_free=freed)
        except OutOfPagesError:
            np.add.at(p.holders, gone, 1)
            np.add.at(p.lockers, gone, 1)
            p.last_used[gone] = old_last_used
            storage.changed(gone)
            plan.ok = False
            return False
        plan.counts.pages_touched += gone.size
        storage.free(orphans, plan)
        storage.apply_eviction(steps, plan)
        allocated = np.zeros(m.layout.num_life_cycles, dtype=np.int64)
        for lc in m.layout.life_cycles:
            table = tables[lc.index]
            begin, end = lc.stale_range(history, tpb)
            table[begin:end] = NO_PAGE
            table = table[:new_blocks]
            ords = new_ordinals[lc.index]
            if ords.size:
                ids = storage.allocate(
                    0, lc.pool_group, np.full(ords.size, lc.index, dtype=np.int16), ords,
                    priorities[lc.index], m._now, plan)
                p.holders[ids] = 1
                p.lockers[ids] = 1
                table[ords] = ids
                allocated[lc.index] = ords.size
            self._pages[lc.index] = table
        if allocated.any():
            m.stats.record(plan.counts, alloc_total_blocks=allocated, alloc_new_blocks=allocated)
        self._capacity = capacity
        self._history = history
        return True

    def _advance_history(self, history: int, plan: Plan) -> None:
        """Raise history (never fails): sliding-window blocks falling out of the window go."""
        m = self._manager
        tpb = m.layout.tokens_per_block
        for lc in m.layout.life_cycles:
            if lc.is_sliding:
                begin, end = lc.stale_range(history, tpb)
                table = self._pages[lc.index]
                stale = table[begin:end]
                m._release(stale[stale >= 0], True, plan)
                table[begin:end] = NO_PAGE
        self._history = history

    # -- commit --------------------------------------------------------------------------------------
    def _reattach(self, root: Root, plan: Plan) -> None:
        """If the node of this cache's last committed block has left the tree (its pages were
        dropped and it was removed), put the cache's committed blocks back in, so new blocks hang
        from a live parent. Blocks still in the tree are found by key; missing ones are re-added
        with the pages the cache still holds."""
        tail = self._tail_node
        if tail is None or self._manager.tree.nodes.get(tail.node_id) is tail:
            return
        tpb = self._manager.layout.tokens_per_block
        key, self._tail_node = b"", None
        for b in range(self._committed_blocks):
            block = self._tokens[b * tpb:(b + 1) * tpb]
            key = block_key(key, block)
            self._tail_node = self._commit_block(root, b, key, block, plan)
        self._tail_key = key

    def _commit(self, toks: np.ndarray, plan: Plan) -> None:
        m = self._manager
        tpb = m.layout.tokens_per_block
        self._tokens = np.concatenate([self._tokens, toks])
        root = m.tree.root_for(self.scope)
        self._reattach(root, plan)
        first, full_blocks = self._committed_blocks, self._tokens.size // tpb
        if full_blocks > first:
            # One conversion (a fresh array) for all new blocks; each key then hashes a slice of
            # one buffer, and new nodes keep views of it.
            blocks = self._tokens[first * tpb:full_blocks * tpb].astype("<u4").reshape(-1, tpb)
            raw = blocks.tobytes()
            width = tpb * 4
            nodes_by_key = root.nodes_by_key
            key, tail = self._tail_key, self._tail_node
            fresh_rows: list[int] = []  # block indexes (into this commit) of new nodes
            fresh_nodes: list[int] = []
            # Each block's page per life cycle, in one conversion.
            page_table = np.stack([t[first:full_blocks] for t in self._pages], axis=1)
            page_rows = page_table.tolist()
            add_node = m.tree.add_node
            for i, b in enumerate(range(first, full_blocks)):
                key = hashlib.sha256(key + raw[i * width:(i + 1) * width]).digest()
                if key in nodes_by_key or m.event_sink is not None:
                    tail = self._commit_block(root, b, key, blocks[i], plan)
                    continue
                # The common case, a block nobody committed before: a new node owning our pages.
                tail = add_node(root, tail, key, blocks[i], page_rows[i], copy_tokens=False)
                fresh_rows.append(i)
                fresh_nodes.append(tail.node_id)
            fast = len(fresh_rows)
            if fast:
                pages = page_table[fresh_rows]
                nodes = np.broadcast_to(np.array(fresh_nodes, dtype=np.int32)[:, None], pages.shape)
                has = pages != NO_PAGE
                # Not reported to the eviction index: these pages are the ACTIVE cache's, locked.
                m.storage.pages.node[pages[has]] = nodes[has]
            c = plan.counts  # _commit_block counted its own blocks
            c.blocks_hashed += fast
            c.tree_nodes_visited += fast
            c.tree_nodes_created += fast
            self._tail_key, self._tail_node = key, tail
        self._committed_blocks = full_blocks
        ours = self.held_pages()
        # Not reported to the eviction index: an ACTIVE cache's pages are locked, hence not
        # candidates, and whatever unlocks them (suspend, close, release) reports them then.
        m.storage.pages.last_used[ours] = m._now
        if self._tokens.size > self._history:
            self._advance_history(int(self._tokens.size), plan)

    def _commit_block(self, root: Root, ordinal: int, key: bytes, tokens: np.ndarray,
                      plan: Plan) -> Node:
        """Put one block of this cache into the tree, rebasing onto an existing identical block."""
        m = self._manager
        storage = m.storage
        p = storage.pages
        c = plan.counts
        c.blocks_hashed += 1
        c.tree_nodes_visited += 1
        ours = [int(self._pages[lc][ordinal]) for lc in range(m.layout.num_life_cycles)]
        node = root.nodes_by_key.get(key)
        if node is None:
            node = m.tree.add_node(root, self._tail_node, key, tokens, ours)
            c.tree_nodes_created += 1
            for page in ours:
                if page != NO_PAGE:
                    p.node[page] = node.node_id
            storage.changed([page for page in ours if page != NO_PAGE])
            m._emit({"type": "stored", "scope": root.scope, "block": ordinal,
                     "num_tokens": int(tokens.size)}, plan)
            return node
        storage.changed([page for page in (*ours, *node.pages) if page != NO_PAGE])
        for lc, mine in enumerate(ours):
            theirs = node.pages[lc]
            if theirs == mine:
                continue
            if theirs != NO_PAGE and p.level[theirs] == 0:
                # Rebase: use the identical page already on the GPU, give ours back.
                if mine != NO_PAGE:
                    p.holders[theirs] += 1
                    p.lockers[theirs] += 1
                    self._pages[lc][ordinal] = theirs
                    m._release(np.array([mine], dtype=np.int32), True, plan)
            elif mine != NO_PAGE:
                # The tree's copy is missing or off the GPU: ours (fresh, on the GPU) replaces it.
                node.pages[lc] = mine
                p.node[mine] = node.node_id
                if theirs != NO_PAGE:
                    p.node[theirs] = NO_PAGE
                    if p.holders[theirs] == 0:
                        storage.free(np.array([theirs], dtype=np.int32), plan)
        return node

    # -- planned drops -------------------------------------------------------------------------------
    def _plan_drop(self, plan: Plan) -> PlannedDrop | None:
        m = self._manager
        tpb = m.layout.tokens_per_block
        p = m.storage.pages
        n_tokens = int(self._tokens.size)
        if n_tokens == 0:
            return None
        nodes, hashed = m.tree.walk_full_blocks(self.scope, self._tokens)
        plan.counts.blocks_hashed += hashed
        plan.counts.tree_nodes_visited += len(nodes)
        if len(nodes) < self._committed_blocks:
            return None
        nodes = nodes[:self._committed_blocks]
        if n_tokens % tpb:
            key = block_key(self._tail_key, self._tokens[self._committed_blocks * tpb:])
            root = m.tree.roots.get(self.scope)
            tail = None if root is None else root.nodes_by_key.get(key)
            if tail is None:
                return None
            nodes.append(tail)
        for b, node in enumerate(nodes):
            for lc in range(m.layout.num_life_cycles):
                mine = int(self._pages[lc][b]) if b < self._pages[lc].size else NO_PAGE
                if mine != NO_PAGE and node.pages[lc] != mine:
                    return None
        chosen: list[np.ndarray] = []
        for lc in m.layout.life_cycles:
            if lc.is_sliding:
                begin, end = lc.stale_range(self._history, tpb)
                window = self._pages[lc.index][max(end, lc.sink_blocks):len(nodes)]
                window = window[window >= 0]
                chosen.append(window[p.node[window] >= 0])
        ids = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int32)
        p.planned_drops[ids] += 1
        return PlannedDrop(m, ids, p.generation[ids].copy())


class PlannedDrop:
    """Pages planned for dropping; ``drop()`` applies the plan once (a second call is an error).

    Each planned page carries a count of plans naming it; at zero, a page that is committed and
    owned by no cache is dropped at once instead of waiting for eviction.
    """

    def __init__(self, manager: KVCacheManager, page_ids: np.ndarray,
                 generations: np.ndarray) -> None:
        self._manager = manager
        self._page_ids = page_ids
        self._generations = generations
        self._dropped = False

    @property
    def num_pages(self) -> int:
        return int(self._page_ids.size)

    @property
    def dropped(self) -> bool:
        return self._dropped

    @public_call("PlannedDrop.drop")
    def drop(self, plan: Plan) -> int:
        """Apply the plan; returns the number of pages dropped now."""
        if self._dropped:
            raise InvalidStateError("PlannedDrop.drop() called twice")
        storage = self._manager.storage
        p = storage.pages
        ids = self._page_ids[p.generation[self._page_ids] == self._generations]  # rows freed since
        p.planned_drops[ids] -= 1
        now = ids[(p.planned_drops[ids] == 0) & (p.holders[ids] == 0) & (p.node[ids] >= 0)]
        storage.drop(now, plan, kind="planned")
        self._dropped = True
        return int(now.size)

    def __del__(self) -> None:
        # An unapplied plan is applied when the handle is discarded, as in KVCM2.
        try:
            if not self._dropped and not self._manager._is_shut_down:
                self.drop()
        except Exception:  # noqa: BLE001 - never raise from a destructor
            pass
