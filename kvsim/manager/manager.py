"""KVCacheManager: pure state, no clock, no threads, no CUDA.

Every public call records a :class:`~kvsim.manager.plan.Plan` in ``last_plan`` (copies issued and
bookkeeping counted); executors turn plans into time. Calls validate before they mutate, and
anything that can still fail after validation (making room) is planned before it is applied, so a
call that raises or returns False leaves the manager exactly as it was.
"""

from __future__ import annotations

import copy
import hashlib
import math
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kvsim.errors import (
    CachesStillOpenError,
    ConfigError,
    InvalidArgumentError,
    InvalidStateError,
    OutOfPagesError,
    UnknownScopeError,
)
from kvsim.manager.config import LifeCycle, ManagerConfig, StorageLayout
from kvsim.manager.kv_cache import CacheStatus, KvCache, PlannedDrop, PriorityCallback, as_tokens
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.manager.pages import NO_PAGE
from kvsim.manager.plan import Plan
from kvsim.manager.radix_tree import Node, RadixTree, Root, block_key
from kvsim.manager.stats import Statistics
from kvsim.manager.storage import EvictionStep, Storage

EventSink = Callable[[dict], None]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What ``probe`` found: reusable tokens, and the work the lookup did."""

    reusable_tokens: int
    tree_nodes_visited: int
    blocks_hashed: int


@dataclass(frozen=True, slots=True)
class _Match:
    nodes: list[Node]  # full blocks reused
    partial: Node | None  # node whose first ``partial_tokens`` tokens are reused
    partial_tokens: int
    num_tokens: int
    blocks_hashed: int


class KVCacheManager:
    def __init__(self, config: ManagerConfig, event_sink: EventSink | None = None) -> None:
        self.config = config
        self.layout = StorageLayout.from_config(config)
        lay = self.layout
        page_bytes = np.array([lay.page_bytes_of_life_cycle(i) for i in range(lay.num_life_cycles)])
        self.stats = Statistics(lay.num_life_cycles, page_bytes, config.enable_stats,
                                config.stats_commit == "per_page", self._block_stats)
        self.storage = Storage(lay, self.stats)
        self.storage.on_drop = self._forget_dropped
        self.tree = RadixTree(lay.tokens_per_block)
        self.event_sink = event_sink
        self.last_plan: Plan | None = None
        # Weak: dropping the last reference to an open cache closes it (its destructor), as in
        # KVCM2; the manager must not keep it alive.
        self._caches: weakref.WeakValueDictionary[Hashable, KvCache] = weakref.WeakValueDictionary()
        self._next_cache_id = 0
        self._tick = 0  # LRU clock: advanced once per successful call
        self._is_shut_down = False

    # -- plumbing -------------------------------------------------------------------------------
    @contextmanager
    def _api(self, name: str) -> Iterator[Plan]:
        """One public call: its plan, and the promise that a call that raises changes nothing.

        Calls validate before they mutate, so bad arguments and refusals raise before any
        change. The event sink is user code that may raise too: it runs after the call has
        completed, on the events the call queued, and when it raises the manager is put back
        as it was before the call (a snapshot taken at entry, only when a sink is set).
        """
        if self._is_shut_down:
            raise InvalidStateError(f"{name}(): the manager is shut down")
        plan = Plan(name)
        saved = _Snapshot(self) if self.event_sink is not None else None
        try:
            yield plan
            if plan.ok:
                self._tick += 1
            if saved is not None:
                for event in plan.events:
                    self.event_sink(event)
        except BaseException:
            if saved is not None:
                saved.restore()
            plan.ok = False
            self.last_plan = plan
            raise
        self.last_plan = plan

    @property
    def _now(self) -> int:
        """The LRU tick stamped on pages touched by the call in progress."""
        return self._tick + 1

    def _block_stats(self) -> np.ndarray:
        return self.storage.block_stats()

    def _require_scope(self, scope: Hashable) -> Hashable:
        try:
            known = scope in self.config.reuse_scopes
        except TypeError:
            known = False
        if not known:
            raise UnknownScopeError(
                f"reuse scope {scope!r} is not declared (declared: {list(self.config.reuse_scopes)})")
        return scope

    def _emit(self, event: dict, plan: Plan) -> None:
        if self.event_sink is not None:
            plan.counts.events_emitted += 1
            plan.events.append(event)

    def _priorities(self, callback: PriorityCallback | None, ordinals: np.ndarray, lc: int,
                    plan: Plan) -> np.ndarray:
        if callback is None or ordinals.size == 0:
            return np.full(ordinals.size, self.config.default_priority, dtype=np.int16)
        out = np.empty(ordinals.size, dtype=np.int16)
        for i, b in enumerate(ordinals.tolist()):
            value = callback(b, lc)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value <= 100:
                raise InvalidArgumentError(
                    f"priority callback returned {value!r} for block {b}, life cycle {lc}; "
                    "expected an integer in [0, 100]")
            out[i] = value
        plan.counts.callback_calls += ordinals.size
        return out

    # -- read-only queries (shared lock) -------------------------------------------------------
    @property
    def tokens_per_block(self) -> int:
        return self.layout.tokens_per_block

    @property
    def num_open_caches(self) -> int:
        return len(self._caches)

    def open_caches(self) -> list[KvCache]:
        return list(self._caches.values())

    def probe(self, tokens: object, reuse_scope: Hashable = 0) -> ProbeResult:
        """How many of ``tokens`` a new cache would reuse; read-only (never mutates anything),
        unless ``probe_drains_root_erasures`` reproduces the pre-fix bug."""
        scope = self._require_scope(reuse_scope)
        toks = as_tokens(tokens)
        if self.config.probe_drains_root_erasures:
            self.tree.drain_root_erasures()  # the old matchTokenPath(): a mutation under a shared lock
        match = self._match(scope, toks)
        visited = len(match.nodes) + (1 if match.partial is not None else 0)
        return ProbeResult(match.num_tokens, visited, match.blocks_hashed)

    def probe_reuse(self, tokens: object, reuse_scope: Hashable = 0) -> int:
        return self.probe(tokens, reuse_scope).reusable_tokens

    def get_quota(self, cache_level: int) -> list[int]:
        """Bytes per pool group at ``cache_level``."""
        level = self._require_level(cache_level)
        return [self.storage.num_slots(level, g) * pg.page_bytes
                for g, pg in enumerate(self.layout.pool_groups)]

    def get_storage_statistics(self, cache_level: int) -> list[dict[str, int]]:
        """Per pool group: total, free, evictable, available, unavailable blocks (and bytes)."""
        level = self._require_level(cache_level)
        out = []
        for g, pg in enumerate(self.layout.pool_groups):
            alloc = self.storage.allocators[level][g]
            evictable = int(self.storage.evictable_at(level, g).size)
            available = alloc.num_free + evictable
            row = {
                "total": alloc.num_slots,
                "free": alloc.num_free,
                "evictable": evictable,
                "available": available,
                "unavailable": alloc.num_slots - available,
            }
            row.update({f"{k}_bytes": v * pg.page_bytes for k, v in list(row.items())})
            out.append(row)
        return out

    def get_committed_stats(self) -> dict:
        return self.stats.committed()

    def _require_level(self, cache_level: object) -> int:
        if isinstance(cache_level, bool) or not isinstance(cache_level, (int, np.integer)) \
                or not 0 <= cache_level < self.layout.num_levels:
            raise InvalidArgumentError(
                f"cache_level must be an integer in [0, {self.layout.num_levels}), got {cache_level!r}")
        return int(cache_level)

    # -- matching -------------------------------------------------------------------------------
    def _life_cycles(self) -> tuple[LifeCycle, ...]:
        return self.layout.life_cycles

    def _window_present(self, lc: LifeCycle, nodes: list[Node], history: int,
                        extra: Node | None) -> bool:
        """Does every non-stale block of ``lc`` up to ``history`` tokens have a page?"""
        num_blocks = len(nodes) + (1 if extra is not None else 0)
        begin, end = lc.stale_range(history, self.layout.tokens_per_block)
        for b in list(range(0, begin)) + list(range(end, num_blocks)):
            node = nodes[b] if b < len(nodes) else extra
            if node.pages[lc.index] == NO_PAGE:
                return False
        return True

    def _match(self, scope: Hashable, tokens: np.ndarray) -> _Match:
        """The usable prefix of ``tokens`` in the tree; read-only."""
        tpb = self.layout.tokens_per_block
        nodes, hashed = self.tree.walk_full_blocks(scope, tokens)
        walked = len(nodes)
        # Prune to blocks that still have the pages each life cycle needs.
        for lc in self._life_cycles():
            if not lc.is_sliding:
                for i, node in enumerate(nodes):
                    if node.pages[lc.index] == NO_PAGE:
                        nodes = nodes[:i]
                        break
        for lc in self._life_cycles():
            if lc.is_sliding:
                while nodes and not self._window_present(lc, nodes, len(nodes) * tpb, None):
                    nodes = nodes[:-1]
        partial, partial_tokens = None, 0
        if self.config.partial_reuse and len(nodes) == walked:
            parent = nodes[-1] if nodes else None
            child, n = self.tree.best_partial_child(scope, parent, tokens[len(nodes) * tpb:])
            if child is not None and n > 0 and all(
                self._window_present(lc, nodes, len(nodes) * tpb + n, child)
                for lc in self._life_cycles()
            ):
                partial, partial_tokens = child, n
        return _Match(nodes, partial, partial_tokens, len(nodes) * tpb + partial_tokens, hashed)

    # -- create ---------------------------------------------------------------------------------
    def create_kv_cache(self, input_tokens: object = None, reuse_scope: Hashable = 0,
                        priority_callback: PriorityCallback | None = None,
                        cache_id: Hashable | None = None) -> KvCache:
        """A SUSPENDED cache holding the reusable prefix of ``input_tokens``.

        Its committed tokens, history and capacity all equal the matched tokens.
        """
        with self._api("KVCacheManager.create_kv_cache") as plan:
            scope = self._require_scope(reuse_scope)
            toks = as_tokens(input_tokens, "input_tokens")
            if priority_callback is not None and not callable(priority_callback):
                raise InvalidArgumentError("priority_callback must be callable or None")
            try:
                hash(cache_id)
            except TypeError:
                raise InvalidArgumentError(
                    f"cache_id must be hashable (a string or an integer), got {cache_id!r}") from None
            if toks.size > MAX_SEQUENCE_TOKENS:
                raise InvalidArgumentError(f"input_tokens holds {toks.size} tokens; at most "
                                           f"{MAX_SEQUENCE_TOKENS} (kvsim.manager.limits)")
            if cache_id is None:
                cache_id = self._next_cache_id
                while cache_id in self._caches:
                    cache_id += 1
            elif cache_id in self._caches:
                raise InvalidArgumentError(f"cache id {cache_id!r} is already open")
            match = self._match(scope, toks)
            partial, n_partial = self._feasible_partial(match)
            # The priority callback may raise: ask it about the partial block's new pages now,
            # before anything changes.
            partial_priorities = None
            if partial is not None:
                ordinal = np.array([len(match.nodes)])
                partial_priorities = {
                    pg.index: np.concatenate([self._priorities(priority_callback, ordinal, lc, plan)
                                              for lc in pg.life_cycles])
                    for pg in self.layout.pool_groups}
            # Validation done: from here on nothing fails.
            plan.counts.roots_erased += self.tree.drain_root_erasures()
            cache = KvCache(self, cache_id, scope, priority_callback)
            self._adopt_match(cache, match, toks, plan, partial, n_partial, partial_priorities)
            self._caches[cache_id] = cache
            if cache_id == self._next_cache_id:
                self._next_cache_id += 1
            return cache

    def _feasible_partial(self, match: _Match) -> tuple[Node | None, int]:
        """The partial block is copied into a fresh GPU page per life cycle; only when the GPU
        level has the slots free (create never evicts for it)."""
        if match.partial is None:
            return None, 0
        for pg in self.layout.pool_groups:
            if self.storage.allocators[0][pg.index].num_free < len(pg.life_cycles):
                return None, 0
        return match.partial, match.partial_tokens

    def _adopt_match(self, cache: KvCache, match: _Match, toks: np.ndarray, plan: Plan,
                     partial: Node | None, n_partial: int,
                     partial_priorities: dict[int, np.ndarray] | None) -> None:
        tpb = self.layout.tokens_per_block
        p = self.storage.pages
        nodes = match.nodes
        k = len(nodes)
        history = k * tpb + n_partial
        num_blocks = k + (1 if partial is not None else 0)
        plan.counts.tree_nodes_visited += num_blocks
        plan.counts.blocks_hashed += match.blocks_hashed
        input_blocks = math.ceil(toks.size / tpb)
        n_lc = self.layout.num_life_cycles
        reused = np.zeros(n_lc, dtype=np.int64)
        alloc_new = np.zeros(n_lc, dtype=np.int64)
        for lc in self._life_cycles():
            arr = np.full(num_blocks, NO_PAGE, dtype=np.int32)
            begin, end = lc.stale_range(history, tpb)
            for b in list(range(0, min(begin, k))) + list(range(end, k)):
                arr[b] = nodes[b].pages[lc.index]
            cache._pages[lc.index] = arr
            reused[lc.index] = int((arr >= 0).sum())
        held = cache.held_pages()
        p.holders[held] += 1
        p.last_used[held] = self._now
        self.storage.changed(held)
        plan.counts.pages_touched += held.size
        if partial is not None:
            self._copy_partial(cache, partial, k, partial_priorities, plan)
            alloc_new += 1
        missed = np.full(n_lc, max(0, input_blocks - num_blocks), dtype=np.int64)
        self.stats.record(plan.counts, reused_blocks=reused, missed_blocks=missed,
                          alloc_total_blocks=reused + alloc_new, alloc_new_blocks=alloc_new,
                          partial_reused_blocks=alloc_new)
        cache._tokens = toks[:history].copy()
        cache._capacity = cache._history = history
        cache._committed_blocks = k
        if k:
            cache._tail_key, cache._tail_node = nodes[-1].key, nodes[-1]

    def _copy_partial(self, cache: KvCache, source: Node, ordinal: int,
                      priorities: dict[int, np.ndarray], plan: Plan) -> None:
        """Give ``cache`` private GPU copies of ``source``'s pages for its last, partial block."""
        p = self.storage.pages
        for pg in self.layout.pool_groups:
            lcs = np.array(pg.life_cycles, dtype=np.int16)
            prios = priorities[pg.index]
            new = self.storage.allocate(0, pg.index, lcs, np.full(lcs.size, ordinal), prios,
                                        self._now, plan)
            p.holders[new] = 1  # allocate() reported them
            src = np.array([source.pages[int(lc)] for lc in lcs], dtype=np.int32)
            for level in np.unique(p.level[src]).tolist():
                sel = p.level[src] == level
                self.storage.copy_pages(src[sel], new[sel], pg.index, plan)
            for lc, page in zip(lcs.tolist(), new.tolist()):
                cache._pages[lc][ordinal] = page

    # -- resume / suspend / close ------------------------------------------------------------
    def _resume(self, cache: KvCache, plan: Plan) -> bool:
        p = self.storage.pages
        ours = cache.held_pages()
        groups = p.pool_group[ours]
        newly_locked = p.lockers[ours] == 0
        for pg in self.layout.pool_groups:
            g = pg.index
            total = self.storage.num_slots(0, g)
            used = self.storage.allocators[0][g].used_pages()
            locked = int((p.lockers[used] > 0).sum())
            need = int((newly_locked & (groups == g)).sum())
            if need and locked + need > self.config.max_util_for_resume * total:
                plan.ok = False
                return False
        p.lockers[ours] += 1  # locked pages are never eviction candidates
        onboard = ours[p.level[ours] > 0]
        steps: list[EvictionStep] = []
        try:
            for pg in self.layout.pool_groups:
                n = int((p.pool_group[onboard] == pg.index).sum())
                steps += self.storage.plan_room(0, pg.index, n, plan)
        except OutOfPagesError:
            p.lockers[ours] -= 1
            self.storage.changed(ours)
            plan.ok = False
            return False
        self.storage.apply_eviction(steps, plan)
        levels = p.level[onboard]
        for level in np.unique(levels).tolist():
            for g in np.unique(p.pool_group[onboard[levels == level]]).tolist():
                sel = onboard[(levels == level) & (p.pool_group[onboard] == g)]
                self.storage.move(sel, level, 0, g, plan)
        if onboard.size:
            n_lc = self.layout.num_life_cycles
            onboarded = np.bincount(p.life_cycle[onboard], minlength=n_lc).astype(np.int64)
            self.stats.record(plan.counts, alloc_total_blocks=onboarded)
        p.last_used[ours] = self._now
        self.storage.changed(ours)
        plan.counts.pages_touched += ours.size
        cache._status = CacheStatus.ACTIVE
        return True

    def _suspend(self, cache: KvCache, plan: Plan) -> None:
        p = self.storage.pages
        ours = cache.held_pages()
        p.lockers[ours] -= 1
        p.last_used[ours] = self._now
        self.storage.changed(ours)
        plan.counts.pages_touched += ours.size
        cache._status = CacheStatus.SUSPENDED

    def _release(self, ids: np.ndarray, locked: bool, plan: Plan) -> None:
        """Drop one cache's ownership of ``ids``; frees those left uncommitted and unowned."""
        if ids.size == 0:
            return
        p = self.storage.pages
        np.subtract.at(p.holders, ids, 1)
        if locked:
            np.subtract.at(p.lockers, ids, 1)
        p.last_used[ids] = self._now
        self.storage.changed(ids)
        plan.counts.pages_touched += ids.size
        self.storage.free(ids[(p.holders[ids] == 0) & (p.node[ids] < 0)], plan)

    def _close(self, cache: KvCache, plan: Plan) -> None:
        self._release(cache.held_pages(), cache._status is CacheStatus.ACTIVE, plan)
        cache._pages = [np.zeros(0, dtype=np.int32) for _ in cache._pages]
        cache._status = CacheStatus.CLOSED
        self._caches.pop(cache.cache_id, None)

    # -- resize ---------------------------------------------------------------------------------
    def _resize_cache(self, cache: KvCache, capacity: int, history: int, plan: Plan) -> bool:
        tpb = self.layout.tokens_per_block
        p = self.storage.pages
        new_blocks = math.ceil(capacity / tpb)
        old_blocks = cache._pages[0].size if cache._pages else 0
        span = max(new_blocks, old_blocks)
        ordinal = np.arange(span)
        tables: list[np.ndarray] = []
        new_ordinals: list[np.ndarray] = []
        released: list[np.ndarray] = []
        for lc in self._life_cycles():
            have = np.full(span, NO_PAGE, dtype=np.int32)
            have[:old_blocks] = cache._pages[lc.index]
            need = ordinal < new_blocks
            begin, end = lc.stale_range(history, tpb)
            need[begin:end] = False
            tables.append(have)
            new_ordinals.append(np.flatnonzero(need & (have < 0)))
            released.append(have[~need & (have >= 0)])
        priorities = [self._priorities(cache.priority_callback, new_ordinals[lc.index], lc.index,
                                       plan) for lc in self._life_cycles()]
        gone = np.concatenate(released)
        # Tentatively release, so released committed pages count as evictable and released
        # uncommitted ones as free; undone exactly if room cannot be made.
        old_last_used = p.last_used[gone].copy()
        np.subtract.at(p.holders, gone, 1)
        np.subtract.at(p.lockers, gone, 1)
        p.last_used[gone] = self._now
        self.storage.changed(gone)
        orphans = gone[(p.holders[gone] == 0) & (p.node[gone] < 0)]
        steps: list[EvictionStep] = []
        try:
            for pg in self.layout.pool_groups:
                wanted = sum(new_ordinals[lc].size for lc in pg.life_cycles)
                freed = int((p.pool_group[orphans] == pg.index).sum())
                steps += self.storage.plan_room(0, pg.index, wanted, plan, extra_free=freed)
        except OutOfPagesError:
            np.add.at(p.holders, gone, 1)
            np.add.at(p.lockers, gone, 1)
            p.last_used[gone] = old_last_used
            self.storage.changed(gone)
            plan.ok = False
            return False
        plan.counts.pages_touched += gone.size
        self.storage.free(orphans, plan)
        self.storage.apply_eviction(steps, plan)
        n_lc = self.layout.num_life_cycles
        allocated = np.zeros(n_lc, dtype=np.int64)
        for lc in self._life_cycles():
            table = tables[lc.index]
            begin, end = lc.stale_range(history, tpb)
            table[begin:end] = NO_PAGE
            table = table[:new_blocks]
            ords = new_ordinals[lc.index]
            if ords.size:
                ids = self.storage.allocate(
                    0, lc.pool_group, np.full(ords.size, lc.index, dtype=np.int16), ords,
                    priorities[lc.index], self._now, plan)
                p.holders[ids] = 1
                p.lockers[ids] = 1
                table[ords] = ids
                allocated[lc.index] = ords.size
            cache._pages[lc.index] = table
        if allocated.any():
            self.stats.record(plan.counts, alloc_total_blocks=allocated, alloc_new_blocks=allocated)
        cache._capacity = capacity
        cache._history = history
        return True

    def _advance_history(self, cache: KvCache, history: int, plan: Plan) -> None:
        """Raise history (never fails): sliding-window blocks falling out of the window go."""
        tpb = self.layout.tokens_per_block
        for lc in self._life_cycles():
            if lc.is_sliding:
                begin, end = lc.stale_range(history, tpb)
                table = cache._pages[lc.index]
                stale = table[begin:end]
                self._release(stale[stale >= 0], True, plan)
                table[begin:end] = NO_PAGE
        cache._history = history

    # -- commit ---------------------------------------------------------------------------------
    def _reattach(self, cache: KvCache, root: Root, plan: Plan) -> None:
        """If the node of the cache's last committed block has left the tree (its pages were
        dropped and it was removed), put the cache's committed blocks back in, so new blocks hang
        from a live parent. Blocks still in the tree are found by key; missing ones are re-added
        with the pages the cache still holds."""
        tail = cache._tail_node
        if tail is None or self.tree.nodes.get(tail.node_id) is tail:
            return
        tpb = self.layout.tokens_per_block
        key, cache._tail_node = b"", None
        for b in range(cache._committed_blocks):
            block = cache._tokens[b * tpb:(b + 1) * tpb]
            key = block_key(key, block)
            cache._tail_node = self._commit_block(cache, root, b, key, block, plan)
        cache._tail_key = key

    def _commit(self, cache: KvCache, toks: np.ndarray, plan: Plan) -> None:
        tpb = self.layout.tokens_per_block
        cache._tokens = np.concatenate([cache._tokens, toks])
        root = self.tree.root_for(cache.scope)
        self._reattach(cache, root, plan)
        first, full_blocks = cache._committed_blocks, cache._tokens.size // tpb
        if full_blocks > first:
            # One conversion (a fresh array) for all new blocks; each key then hashes a slice of
            # one buffer, and new nodes keep views of it.
            blocks = cache._tokens[first * tpb:full_blocks * tpb].astype("<u4").reshape(-1, tpb)
            raw = blocks.tobytes()
            width = tpb * 4
            nodes_by_key = root.nodes_by_key
            key, tail = cache._tail_key, cache._tail_node
            fresh_rows: list[int] = []  # block indexes (into this commit) of new nodes
            fresh_nodes: list[int] = []
            # Each block's page per life cycle, in one conversion.
            page_table = np.stack([t[first:full_blocks] for t in cache._pages], axis=1)
            page_rows = page_table.tolist()
            add_node = self.tree.add_node
            for i, b in enumerate(range(first, full_blocks)):
                key = hashlib.sha256(key + raw[i * width:(i + 1) * width]).digest()
                if key in nodes_by_key or self.event_sink is not None:
                    tail = self._commit_block(cache, root, b, key, blocks[i], plan)
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
                self.storage.pages.node[pages[has]] = nodes[has]
            c = plan.counts  # _commit_block counted its own blocks
            c.blocks_hashed += fast
            c.tree_nodes_visited += fast
            c.tree_nodes_created += fast
            cache._tail_key, cache._tail_node = key, tail
        cache._committed_blocks = full_blocks
        ours = cache.held_pages()
        # Not reported to the eviction index: an ACTIVE cache's pages are locked, hence not
        # candidates, and whatever unlocks them (suspend, close, release) reports them then.
        self.storage.pages.last_used[ours] = self._now
        if cache._tokens.size > cache._history:
            self._advance_history(cache, int(cache._tokens.size), plan)

    def _stop_committing(self, cache: KvCache, plan: Plan) -> None:
        tpb = self.layout.tokens_per_block
        b = cache._committed_blocks
        tail = cache._tokens[b * tpb:]
        if tail.size:
            root = self.tree.root_for(cache.scope)
            self._reattach(cache, root, plan)
            self._commit_block(cache, root, b, block_key(cache._tail_key, tail), tail, plan)
        cache._stopped_committing = True

    def _commit_block(self, cache: KvCache, root: Root, ordinal: int, key: bytes,
                      tokens: np.ndarray, plan: Plan) -> Node:
        """Put one block of ``cache`` into the tree, rebasing onto an existing identical block."""
        p = self.storage.pages
        c = plan.counts
        c.blocks_hashed += 1
        c.tree_nodes_visited += 1
        ours = [int(cache._pages[lc][ordinal]) for lc in range(self.layout.num_life_cycles)]
        node = root.nodes_by_key.get(key)
        if node is None:
            node = self.tree.add_node(root, cache._tail_node, key, tokens, ours)
            c.tree_nodes_created += 1
            for page in ours:
                if page != NO_PAGE:
                    p.node[page] = node.node_id
            self.storage.changed([page for page in ours if page != NO_PAGE])
            self._emit({"type": "stored", "scope": root.scope, "block": ordinal,
                        "num_tokens": int(tokens.size)}, plan)
            return node
        self.storage.changed([page for page in (*ours, *node.pages) if page != NO_PAGE])
        for lc, mine in enumerate(ours):
            theirs = node.pages[lc]
            if theirs == mine:
                continue
            if theirs != NO_PAGE and p.level[theirs] == 0:
                # Rebase: use the identical page already on the GPU, give ours back.
                if mine != NO_PAGE:
                    p.holders[theirs] += 1
                    p.lockers[theirs] += 1
                    cache._pages[lc][ordinal] = theirs
                    self._release(np.array([mine], dtype=np.int32), True, plan)
            elif mine != NO_PAGE:
                # The tree's copy is missing or off the GPU: ours (fresh, on the GPU) replaces it.
                node.pages[lc] = mine
                p.node[mine] = node.node_id
                if theirs != NO_PAGE:
                    p.node[theirs] = NO_PAGE
                    if p.holders[theirs] == 0:
                        self.storage.free(np.array([theirs], dtype=np.int32), plan)
        return node

    # -- planned drops ----------------------------------------------------------------------------
    def _plan_drop(self, cache: KvCache, plan: Plan) -> PlannedDrop | None:
        tpb = self.layout.tokens_per_block
        p = self.storage.pages
        n_tokens = int(cache._tokens.size)
        if n_tokens == 0:
            return None
        nodes, hashed = self.tree.walk_full_blocks(cache.scope, cache._tokens)
        plan.counts.blocks_hashed += hashed
        plan.counts.tree_nodes_visited += len(nodes)
        if len(nodes) < cache._committed_blocks:
            return None
        nodes = nodes[:cache._committed_blocks]
        if n_tokens % tpb:
            key = block_key(cache._tail_key, cache._tokens[cache._committed_blocks * tpb:])
            root = self.tree.roots.get(cache.scope)
            tail = None if root is None else root.nodes_by_key.get(key)
            if tail is None:
                return None
            nodes.append(tail)
        for b, node in enumerate(nodes):
            for lc in range(self.layout.num_life_cycles):
                mine = int(cache._pages[lc][b]) if b < cache._pages[lc].size else NO_PAGE
                if mine != NO_PAGE and node.pages[lc] != mine:
                    return None
        chosen: list[np.ndarray] = []
        for lc in self._life_cycles():
            if lc.is_sliding:
                begin, end = lc.stale_range(cache._history, tpb)
                window = cache._pages[lc.index][max(end, lc.sink_blocks):len(nodes)]
                window = window[window >= 0]
                chosen.append(window[p.node[window] >= 0])
        ids = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int32)
        p.planned_drops[ids] += 1
        return PlannedDrop(self, ids, p.generation[ids].copy())

    def _apply_drop(self, ids: np.ndarray, generations: np.ndarray, plan: Plan) -> int:
        p = self.storage.pages
        ids = ids[p.generation[ids] == generations]  # rows freed since the plan are skipped
        p.planned_drops[ids] -= 1
        now = ids[(p.planned_drops[ids] == 0) & (p.holders[ids] == 0) & (p.node[ids] >= 0)]
        self.storage.drop(now, plan, kind="planned")
        return int(now.size)

    def _forget_dropped(self, ids: np.ndarray, plan: Plan) -> None:
        p = self.storage.pages
        for page, lc, node_id in zip(ids.tolist(), p.life_cycle[ids].tolist(),
                                     p.node[ids].tolist()):
            node = self.tree.nodes[node_id]
            node.pages[lc] = NO_PAGE
            p.node[page] = NO_PAGE
            removed = self.tree.remove_if_empty(node)
            plan.counts.tree_nodes_removed += removed
            if removed:
                self._emit({"type": "removed", "scope": node.root.scope, "block": node.depth,
                            "num_nodes": removed}, plan)
        self.storage.changed(ids)

    # -- manager-wide operations --------------------------------------------------------------
    def resize(self, cache_level: int, quota: int | Sequence[int]) -> bool:
        """Change a level's quota (bytes; one int split over pool groups, or one per group).

        Every cache must be SUSPENDED (or closed). Shrinking evicts the excess to colder levels
        and compacts what stays into the remaining slots. Returns False, changing nothing, when
        the excess cannot be evicted.
        """
        with self._api("KVCacheManager.resize") as plan:
            level = self._require_level(cache_level)
            try:
                new_slots = self.layout.split_quota(
                    list(quota) if isinstance(quota, (tuple, list)) else quota,
                    self.layout.level_names[level])
            except ConfigError as e:
                raise InvalidArgumentError(str(e)) from None
            active = [c.cache_id for c in self._caches.values() if c.status is CacheStatus.ACTIVE]
            if active:
                raise InvalidStateError(
                    f"KVCacheManager.resize() needs every cache SUSPENDED; ACTIVE: {active}")
            steps: list[EvictionStep] = []
            try:
                for g, slots in enumerate(new_slots):
                    alloc = self.storage.allocators[level][g]
                    excess = alloc.num_used - slots
                    if excess > 0:
                        steps += self.storage.plan_room(level, g, alloc.num_free + excess, plan)
            except OutOfPagesError:
                plan.ok = False
                return False
            self.storage.apply_eviction(steps, plan)
            for g, slots in enumerate(new_slots):
                self.storage.compact(level, g, slots, plan)
            return True

    def _require_no_open_caches(self, api: str) -> None:
        if self._caches:
            raise CachesStillOpenError(f"{api}(): {len(self._caches)} KV cache(s) still open")

    def clear_reusable_blocks(self) -> None:
        """Forget every committed block; refuses while any cache is open."""
        with self._api("KVCacheManager.clear_reusable_blocks") as plan:
            self._require_no_open_caches("clear_reusable_blocks")
            self._forget_everything(plan)

    def shutdown(self) -> None:
        with self._api("KVCacheManager.shutdown") as plan:
            self._require_no_open_caches("shutdown")
            self._forget_everything(plan)
        self._is_shut_down = True

    def _forget_everything(self, plan: Plan) -> None:
        # With no cache open every live page is committed and unowned: free them all at once.
        plan.counts.tree_nodes_removed += len(self.tree.nodes)
        self.storage.free(self.storage.pages.live_ids(), plan)
        self.tree.clear()

    def get_and_reset_iteration_stats(self) -> dict:
        with self._api("KVCacheManager.get_and_reset_iteration_stats"):
            return self.stats.take_iteration(self.layout.level_names)


class _Snapshot:
    """The manager's state at one moment, to put back after a call that raised.

    A deep copy of everything the manager owns (page table, slot allocators, eviction index,
    radix tree, statistics, counters) and of each open cache's fields; the caches themselves,
    the configuration and the sink are shared, so handles the caller holds stay valid.
    """

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.caches = list(manager._caches.items())
        memo = {id(manager): manager, id(manager.config): manager.config,
                id(manager.layout): manager.layout, id(manager.event_sink): manager.event_sink}
        memo.update({id(c): c for _, c in self.caches})
        owned = {k: v for k, v in vars(manager).items() if k not in _SHARED_FIELDS}
        fields = [{k: v for k, v in vars(c).items() if k != "_manager"} for _, c in self.caches]
        self.owned, self.fields = copy.deepcopy((owned, fields), memo)

    def restore(self) -> None:
        m = self.manager
        vars(m).update(self.owned)
        m._caches = weakref.WeakValueDictionary(self.caches)
        for (_, cache), fields in zip(self.caches, self.fields):
            vars(cache).update(fields)


# Not copied by a snapshot: fixed at construction, or the call's output.
_SHARED_FIELDS = frozenset({"config", "layout", "event_sink", "last_plan", "_caches"})
