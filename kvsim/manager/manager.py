"""KVCacheManager: pure state, no clock, no threads, no CUDA.

The manager owns what caches share: the page table and slot allocators (:mod:`storage`), the
radix tree of committed blocks, the statistics, the set of open caches and the LRU clock. Each
cache carries out its own operations (:mod:`kv_cache`) on that shared state.

Every public call records a :class:`~kvsim.manager.plan.Plan` (copies issued, bookkeeping
counted) and returns it to an executor that asks (``call.with_plan(...)``,
:mod:`kvsim.manager.calls`); executors turn plans into time. Calls validate before they mutate,
and anything that can still fail after validation (making room) is planned before it is
applied, so a call that raises or returns False leaves the manager exactly as it was.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from kvsim.errors import (
    CachesStillOpenError,
    ConfigError,
    InvalidArgumentError,
    InvalidStateError,
    OutOfPagesError,
)
from kvsim.manager.calls import public_call
from kvsim.manager.config import LifeCycle, ManagerConfig, StorageLayout
from kvsim.manager.kv_cache import CacheStatus, KvCache, PriorityCallback, as_tokens, require_size
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.manager.matching import Match, match_prefix
from kvsim.manager.pages import NO_PAGE, PAGE_IDS
from kvsim.manager.plan import Plan
from kvsim.manager.radix_tree import DEFAULT_SCOPE, Node, RadixTree
from kvsim.manager.stats import Statistics
from kvsim.manager.storage import EvictionStep, Storage

EventSink = Callable[[dict], None]


class KVCacheManager:
    def __init__(self, config: ManagerConfig, event_sink: EventSink | None = None) -> None:
        self.config = config
        self.layout = StorageLayout.from_config(config)
        lay = self.layout
        page_bytes = np.array([lay.page_bytes_of_life_cycle(i) for i in range(lay.num_life_cycles)])
        self.stats = Statistics(lay.num_life_cycles, lay.num_levels, page_bytes,
                                config.enable_stats, config.stats_commit == "per_page",
                                self._block_stats)
        self.storage = Storage(lay, self.stats)
        self.storage.on_drop = self._forget_dropped
        self.tree = RadixTree(lay.tokens_per_block)
        self.event_sink = event_sink
        # Weak: dropping the last reference to an open cache closes it (its destructor), as in
        # KVCM2; the manager must not keep it alive.
        self._caches: weakref.WeakValueDictionary[Hashable, KvCache] = weakref.WeakValueDictionary()
        self._next_cache_id = 0
        self._tick = 0  # LRU clock: advanced once per successful mutating call
        self._is_shut_down = False

    # -- plumbing -------------------------------------------------------------------------------
    def _mutate(self, plan: Plan, body: Callable[..., Any], obj: object, args: tuple,
                kwargs: dict) -> Any:
        """Run one mutating public call's ``body`` (:mod:`kvsim.manager.calls`): the promise that
        a call that raises changes nothing.

        Calls validate before they mutate, so bad arguments and refusals raise before any
        change. The event sink is user code that may raise too: it runs after the call has
        completed, on the events the call queued, and when it raises the manager is put back
        as it was before the call (a snapshot taken at entry, only when a sink is set). A plain
        method rather than a context manager: it runs around every call.
        """
        if self._is_shut_down:
            raise InvalidStateError(f"{plan.api}(): the manager is shut down")
        saved = _Snapshot(self) if self.event_sink is not None else None
        try:
            value = body(obj, plan, *args, **kwargs)
            if plan.ok:
                self._tick += 1
            if saved is not None:
                for event in plan.events:
                    self.event_sink(event)
        except BaseException:
            if saved is not None:
                saved.restore()
            raise
        return value

    @property
    def _now(self) -> int:
        """The LRU tick stamped on pages touched by the call in progress."""
        return self._tick + 1

    def _block_stats(self) -> np.ndarray:
        return self.storage.block_stats()

    @staticmethod
    def _require_scope(scope: Hashable) -> Hashable:
        """Any hashable value is a reuse scope (KVCM2 takes any ``ReuseScope(lora_id, salt)``,
        undeclared); None is the default scope, ``ReuseScope()``."""
        if scope is None:
            return DEFAULT_SCOPE
        try:
            hash(scope)
        except TypeError:
            raise InvalidArgumentError(
                f"reuse_scope must be hashable (a ReuseScope, an integer or a string), "
                f"got {scope!r}") from None
        return scope

    def _require_level(self, cache_level: object) -> int:
        if isinstance(cache_level, bool) or not isinstance(cache_level, (int, np.integer)) \
                or not 0 <= cache_level < self.layout.num_levels:
            raise InvalidArgumentError(
                f"cache_level must be an integer in [0, {self.layout.num_levels}), got {cache_level!r}")
        return int(cache_level)

    def _emit(self, event: dict, plan: Plan) -> None:
        if self.event_sink is not None:
            plan.counts.events_emitted += 1
            plan.events.append(event)

    def _priorities(self, callback: PriorityCallback | None, ordinals: np.ndarray,
                    lc: LifeCycle, plan: Plan) -> np.ndarray:
        """Eviction priorities of new pages: the cache's callback for each block (called with
        the block ordinal and the :class:`LifeCycle`, as in KVCM2), or the default; a callback
        returning anything but an integer in [0, 100] is an error."""
        if callback is None or ordinals.size == 0:
            return np.full(ordinals.size, self.config.default_priority, dtype=np.int16)
        out = np.empty(ordinals.size, dtype=np.int16)
        for i, b in enumerate(ordinals.tolist()):
            value = callback(b, lc)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 0 <= value <= 100:
                raise InvalidArgumentError(
                    f"priority callback returned {value!r} for block {b}, life cycle "
                    f"{lc.index}; expected an integer in [0, 100]")
            out[i] = value
        plan.counts.callback_calls += ordinals.size
        return out

    def _release(self, ids: np.ndarray, locked: bool, plan: Plan) -> None:
        """Drop one cache's ownership of ``ids`` (distinct: a cache holds a page once); frees
        those left uncommitted and unowned."""
        if ids.size == 0:
            return
        p = self.storage.pages
        # Fancy-indexed, not ufunc.at (~10x slower): the ids are distinct, and a duplicate
        # would show as a wrong holder count in the invariant checker.
        p.holders[ids] -= 1
        if locked:
            p.lockers[ids] -= 1
        p.last_used[ids] = self._now
        self.storage.changed(ids)
        plan.counts.pages_touched += ids.size
        self.storage.free(ids[(p.holders[ids] == 0) & (p.node[ids] < 0)], plan)

    def _forget_dropped(self, ids: np.ndarray, plan: Plan) -> None:
        """The tree forgets committed pages about to be dropped (storage calls this).

        As in KVCM2 (``Block.clear_stale_blocks_after_page_unlink``): a dropped page of a
        full-attention life cycle, or of a sink block, takes its block and every block below it
        out of the tree (no match can pass the missing page); a dropped page of a window block
        takes only itself, then empty childless blocks leave the tree, leaf upward.
        """
        p = self.storage.pages
        life_cycles = self.layout.life_cycles
        dropping = set(ids.tolist())
        orphans: list[int] = []  # pages of removed blocks, not among the dropped ones
        tree = self.tree
        nodes = tree.nodes
        # An eviction drops the deepest blocks first: most dropped pages are a leaf's. Without an
        # event sink such a leaf leaves here, flat (as _detach_subtree would take it out).
        leaves_inline = self.event_sink is None
        leaves_removed = 0
        width = len(life_cycles)  # pages per node: with one, a dropped leaf leaves no orphan
        for page, lc_index, node_id in zip(ids.tolist(), p.life_cycle[ids].tolist(),
                                           p.node[ids].tolist()):
            node = nodes.get(node_id)
            if node is None:
                continue  # already out, with a subtree removed earlier in this batch
            pages = node.pages
            if pages[lc_index] != page:
                continue
            lc = life_cycles[lc_index]
            pages[lc_index] = NO_PAGE
            if not lc.is_sliding or node.depth < lc.sink_blocks:
                if leaves_inline and node.kids is None:
                    tree._detach(node)
                    if width > 1:
                        orphans += [pg for pg in pages if pg != NO_PAGE]
                        node.pages = [NO_PAGE] * width
                    leaves_removed += 1
                    continue
                orphans += self._detach_subtree(node, plan)
                continue
            removed = self.tree.remove_if_empty(node)
            plan.counts.tree_nodes_removed += removed
            if removed:
                self._emit({"type": "removed", "scope": node.root.scope, "block": node.depth,
                            "num_nodes": removed}, plan)
        plan.counts.tree_nodes_removed += leaves_removed
        p.node[ids] = NO_PAGE
        self.storage.changed(ids)
        self._orphan_pages([pg for pg in orphans if pg not in dropping], plan)

    def _detach_subtree(self, top: Node, plan: Plan) -> list[int]:
        """Take ``top`` and everything below it out of the tree; returns their pages."""
        removed = self.tree.remove_subtree(top)
        pages: list[int] = []
        for n in removed:
            pages += [pg for pg in n.pages if pg != NO_PAGE]
            n.pages = [NO_PAGE] * len(n.pages)
        plan.counts.tree_nodes_removed += len(removed)
        if self.event_sink is not None:  # no event to build otherwise: evictions drop many
            self._emit({"type": "removed", "scope": top.root.scope, "block": top.depth,
                        "num_nodes": len(removed)}, plan)
        return pages

    def _orphan_pages(self, pages: list[int], plan: Plan) -> None:
        """Pages whose blocks left the tree: those no cache holds are freed at once (not counted
        as drops), the others stay with their caches, uncommitted, until released."""
        if not pages:
            return
        p = self.storage.pages
        ids = np.array(pages, dtype=PAGE_IDS)
        p.node[ids] = NO_PAGE
        self.storage.changed(ids)
        self.storage.free(ids[p.holders[ids] == 0], plan)

    def _remove_nodes(self, nodes: list[Node], plan: Plan) -> None:
        """Take nodes, with everything below them, out of the tree (see :meth:`_orphan_pages`)."""
        pages: list[int] = []
        for top in nodes:
            pages += self._detach_subtree(top, plan)
        self._orphan_pages(pages, plan)

    # -- read-only queries (shared lock) -------------------------------------------------------
    @property
    def tokens_per_block(self) -> int:
        return self.layout.tokens_per_block

    @property
    def num_open_caches(self) -> int:
        return len(self._caches)

    def open_caches(self) -> list[KvCache]:
        return list(self._caches.values())

    def gpu_utilization(self) -> float:
        """The highest share of a GPU pool group's slots that are neither free nor evictable
        (what ``resume()`` compares with ``max_util_for_resume``, as KVCM2's
        ``StorageManager.get_utilization``)."""
        worst = 0.0
        for g in range(self.layout.num_pool_groups):
            alloc = self.storage.allocators[0][g]
            if alloc.num_slots:
                evictable = self.storage.evictable_count(0, g)
                worst = max(worst, (alloc.num_used - evictable) / alloc.num_slots)
        return worst

    @public_call("KVCacheManager.probe_reuse", mutates=False)
    def probe_reuse(self, plan: Plan, tokens: object, reuse_scope: Hashable = None) -> int:
        """How many of ``tokens`` a new cache would reuse; read-only (never mutates anything),
        unless ``probe_drains_root_erasures`` reproduces the pre-fix bug."""
        scope = self._require_scope(reuse_scope)
        toks = as_tokens(tokens)
        if self.config.probe_drains_root_erasures:
            self.tree.drain_root_erasures()  # the old matchTokenPath(): a mutation under a shared lock
        match = self._match(scope, toks)
        plan.counts.tree_nodes_visited += match.tree_nodes_visited
        plan.counts.blocks_hashed += match.blocks_hashed
        return match.num_tokens

    @public_call("KVCacheManager.get_quota", mutates=False)
    def get_quota(self, plan: Plan, cache_level: int) -> int:
        """The bytes ``cache_level``'s slots hold, over all pool groups (per pool group:
        ``get_storage_statistics``)."""
        level = self._require_level(cache_level)
        return sum(self.storage.num_slots(level, g) * pg.page_bytes
                   for g, pg in enumerate(self.layout.pool_groups))

    @public_call("KVCacheManager.get_storage_statistics", mutates=False)
    def get_storage_statistics(self, plan: Plan, cache_level: int) -> list[dict[str, int]]:
        """Per pool group: total, free, evictable, available, unavailable blocks (and bytes)."""
        level = self._require_level(cache_level)
        out = []
        for g, pg in enumerate(self.layout.pool_groups):
            alloc = self.storage.allocators[level][g]
            evictable = self.storage.evictable_count(level, g)
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

    @public_call("KVCacheManager.get_committed_stats", mutates=False)
    def get_committed_stats(self, plan: Plan) -> dict:
        return self.stats.committed()

    # -- create ---------------------------------------------------------------------------------
    def _match(self, scope: Hashable, tokens: np.ndarray) -> Match:
        c = self.config
        return match_prefix(self.tree, self.layout, c.partial_reuse, c.reuse_match_backoff, scope,
                            tokens)

    @public_call("KVCacheManager.create_kv_cache")
    def create_kv_cache(self, plan: Plan, input_tokens: object = None,
                        reuse_scope: Hashable = None,
                        priority_callback: PriorityCallback | None = None,
                        cache_id: Hashable | None = None,
                        expected_prompt_length: int | None = None) -> KvCache:
        """A SUSPENDED cache holding the reusable prefix of ``input_tokens``.

        Its committed tokens, history and capacity all equal the matched tokens; nothing is
        allocated (a partially reused block is copied at the first ``resume()``). Blocks a
        resize allocates before the history reaches ``expected_prompt_length`` (default: the
        number of input tokens; with no input tokens, never) count as missed.
        """
        scope = self._require_scope(reuse_scope)
        toks = as_tokens(input_tokens, "input_tokens")
        if expected_prompt_length is not None:
            expected_prompt_length = require_size("expected_prompt_length",
                                                  expected_prompt_length)
        elif input_tokens is not None:
            expected_prompt_length = int(toks.size)
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
        # Validation done: from here on nothing fails.
        plan.counts.roots_erased += self.tree.drain_root_erasures()
        cache = KvCache(self, cache_id, scope, priority_callback, expected_prompt_length)
        cache._adopt(match, None if input_tokens is None else toks, plan)
        self._caches[cache_id] = cache
        if cache_id == self._next_cache_id:
            self._next_cache_id += 1
        return cache

    # -- manager-wide operations --------------------------------------------------------------
    @public_call("KVCacheManager.resize")
    def resize(self, plan: Plan, cache_level: int, quota: int | Sequence[int]) -> bool:
        """Change a level's quota (bytes; one int split over pool groups, or one per group).

        Every cache must be SUSPENDED (or closed). Shrinking evicts the excess to colder levels
        and compacts what stays into the remaining slots. Returns False, changing nothing, when
        the excess cannot be evicted.
        """
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
        self.storage.apply_eviction(steps, plan, record=False)  # KVCM2 records none of it
        for g, slots in enumerate(new_slots):
            self.storage.compact(level, g, slots, plan)
        return True

    def _require_no_open_caches(self, api: str) -> None:
        if self._caches:
            raise CachesStillOpenError(f"{api}(): {len(self._caches)} KV cache(s) still open")

    @public_call("KVCacheManager.clear_reusable_blocks")
    def clear_reusable_blocks(self, plan: Plan) -> None:
        """Forget every committed block; refuses while any cache is open."""
        self._require_no_open_caches("clear_reusable_blocks")
        self._forget_everything(plan)

    @public_call("KVCacheManager.shutdown")
    def shutdown(self, plan: Plan) -> None:
        self._require_no_open_caches("shutdown")
        self._forget_everything(plan)
        self._is_shut_down = True

    def _forget_everything(self, plan: Plan) -> None:
        # With no cache open every live page is committed and unowned: free them all at once.
        plan.counts.tree_nodes_removed += len(self.tree.nodes)
        self.storage.free(self.storage.pages.live_ids(), plan)
        self.tree.clear()

    @public_call("KVCacheManager.get_and_reset_iteration_stats")
    def get_and_reset_iteration_stats(self, plan: Plan) -> dict:
        return self.stats.take_iteration(self.layout.level_names)


class _Snapshot:
    """The manager's state at one moment, to put back after a call that raised.

    A deep copy of everything the manager owns (page table, slot allocators, eviction index,
    radix tree, statistics, counters) and of each open cache's fields; the caches themselves,
    the configuration and the sink are shared, so handles the caller holds stay valid, and so
    are what never changes in place (the tree's block tokens: see
    :meth:`RadixTree.__deepcopy__ <kvsim.manager.radix_tree.RadixTree.__deepcopy__>`).
    """

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.caches = list(manager._caches.items())
        memo = {id(manager): manager, id(manager.config): manager.config,
                id(manager.layout): manager.layout, id(manager.event_sink): manager.event_sink}
        memo.update({id(c): c for _, c in self.caches})
        # The tree first (RadixTree.__deepcopy__: without recursion, its tokens shared), so
        # that whatever else names a node names its copy.
        copy.deepcopy(manager.tree, memo)
        owned = {k: v for k, v in vars(manager).items() if k not in _SHARED_FIELDS}
        fields = [{k: v for k, v in vars(c).items() if k != "_manager"} for _, c in self.caches]
        self.owned, self.fields = copy.deepcopy((owned, fields), memo)

    def restore(self) -> None:
        m = self.manager
        vars(m).update(self.owned)
        m._caches = weakref.WeakValueDictionary(self.caches)
        for (_, cache), fields in zip(self.caches, self.fields):
            vars(cache).update(fields)


# Not copied by a snapshot: fixed at construction, or the caches' registry (rebuilt).
_SHARED_FIELDS = frozenset({"config", "layout", "event_sink", "_caches"})
