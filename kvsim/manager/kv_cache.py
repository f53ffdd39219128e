"""One request's KV cache: a state machine over pages it holds in the manager's shared storage.

SUSPENDED --resume()--> ACTIVE --suspend()--> SUSPENDED; close() from any state -> CLOSED
(idempotent). Only an ACTIVE cache resizes and commits; its pages are LOCKED on the GPU level.
``stop_committing()`` works in any state but CLOSED. Every method validates first and mutates
after, so a call that raises changes nothing. The semantics are KVCM2's
(``tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache.py``):

* ``create_kv_cache`` holds the matched pages and allocates nothing. A partially reused last
  block is copied into a private GPU page at the first ``resume()``, which may evict for it.
* ``resume()`` refuses (returns False, changing nothing) while any GPU pool group is used above
  ``max_util_for_resume`` (used = neither free nor evictable), before anything else.
* A sliding-window block that falls out of the window is unlocked: committed, it stays in the
  tree; not yet committed, the cache keeps holding its page while it may still commit, so that a
  later commit puts it in the tree (released by ``stop_committing``).
* ``close()`` drops the pending statistics, stops committing (which commits the partial tail
  block) and releases every page.
* Statistics of reuse and allocation stay pending in the cache (:mod:`kvsim.manager.stats`).

A cache owns its own fields (tokens, capacity, history, page table, tail of its committed
blocks) and carries out its operations itself; what caches share (the page table and slots,
the radix tree, the statistics, the LRU clock) belongs to the manager, which it reaches through
``self._manager`` and its few shared helpers (``_release``, ``_priorities``, ``_emit``).

Invariant: ``num_committed_tokens <= history_length <= capacity``; the cache has
``ceil(capacity / tokens_per_block)`` blocks, each with one page per life cycle except the stale
blocks of sliding-window life cycles (whose uncommitted pages may be held aside).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from kvsim.errors import InvalidArgumentError, InvalidStateError, OutOfPagesError
from kvsim.manager.calls import public_call
from kvsim.manager.config import LifeCycle
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.manager.pages import NO_PAGE, PAGE_IDS
from kvsim.manager.plan import Plan
from kvsim.manager.radix_tree import Node, Root, raw_tokens
from kvsim.manager.storage import EvictionStep

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager
    from kvsim.manager.matching import Match

# callback(block ordinal, life cycle) -> priority in [0, 100], as KVCM2's custom_priority_callback
PriorityCallback = Callable[[int, LifeCycle], int]


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
    if arr.dtype != np.uint32:  # uint32, the usual input, is in range by its type
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


def _pages_of(tables) -> np.ndarray:
    """The pages of the tables, each a fresh array (a mask selects a copy)."""
    if not tables:
        return np.zeros(0, dtype=PAGE_IDS)
    allp = tables[0] if len(tables) == 1 else np.concatenate(tables)
    return allp[allp >= 0]


class KvCache:
    """A handle on one request's cache; create it with ``KVCacheManager.create_kv_cache``."""

    # A resize that only appends blocks takes the short way (_grow); tests switch it off to
    # compare it with the general one.
    grow_by_appending = True

    def __init__(self, manager: KVCacheManager, cache_id: Hashable, scope: Hashable,
                 priority_callback: PriorityCallback | None,
                 expected_prompt_length: int | None) -> None:
        self._manager = manager
        self.cache_id = cache_id
        self.scope = scope
        self.priority_callback = priority_callback
        self._status = CacheStatus.SUSPENDED
        self._tokens = np.zeros(0, dtype=np.uint32)  # committed tokens
        # The buffer _tokens is the start of, with room to append (see _commit); None: none.
        self._token_room: np.ndarray | None = None
        self._capacity = 0
        self._history = 0
        self._committed_blocks = 0  # blocks committed into the radix tree
        self._tail_node: Node | None = None
        self._stopped_committing = False
        n_lc = manager.layout.num_life_cycles
        self._pages = [np.zeros(0, dtype=PAGE_IDS) for _ in range(n_lc)]
        # Out-of-window blocks not committed yet, per life cycle: ordinal -> page held for a
        # later commit (KVCM2's hold_for_commit).
        self._held_stale: list[dict[int, int]] = [{} for _ in range(n_lc)]
        self._never_resumed = True  # a partially reused block still holds the tree's page
        self._pending = manager.stats.pending()
        self._expected_prompt_length = expected_prompt_length
        self._generation_ready = False  # history has reached the prompt: allocations are not misses
        self._reuse_tier_segments: list[tuple[int | None, int]] | None = None

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
        """``resize(capacity, value)``: the history may not pass the capacity."""
        if not self.resize(self._capacity, value):
            raise OutOfPagesError(f"cache {self.cache_id!r}: out of pages for history {value}")

    @property
    def num_committed_tokens(self) -> int:
        return int(self._tokens.size)

    @property
    def num_blocks(self) -> int:
        return math.ceil(self._capacity / self._manager.layout.tokens_per_block)

    @property
    def reuse_tier_segments(self) -> list[tuple[int | None, int]] | None:
        """Where the reused tokens were found when the cache was created: runs of
        ``(level, tokens)`` in prompt order, the level of a block being the coldest level any
        life cycle loaded it from, or None for blocks no life cycle loads (stale for every
        sliding window). None for a cache created without input tokens (KVCM2's
        ``reuse_tier_segments``)."""
        return None if self._reuse_tier_segments is None else list(self._reuse_tier_segments)

    @property
    def pending_stats(self) -> dict:
        """What :meth:`commit_pending_stats` would publish now (read-only), with the reused
        blocks per level summed over life cycles."""
        return self._pending.request() | {
            "reused_blocks_by_level": [int(v) for v in self._pending.by_level.sum(axis=0)]}

    def page_ids(self, life_cycle: int) -> np.ndarray:
        """A copy of this cache's page ids for one life cycle (-1 where a block has no page)."""
        return self._pages[life_cycle].copy()

    def held_pages(self) -> np.ndarray:
        """Every page the cache holds: its blocks' and the out-of-window ones held for commit."""
        return _pages_of([*self._pages, *(np.fromiter(h.values(), dtype=PAGE_IDS)
                                          for h in self._held_stale)])

    def active_pages(self) -> np.ndarray:
        """The pages of the blocks the cache uses (locked while it is ACTIVE)."""
        return _pages_of(self._pages)

    # -- API ----------------------------------------------------------------------------------------
    @public_call("KvCache.resume")
    def resume(self, plan: Plan) -> bool:
        """Lock the cache's pages on the GPU, onboarding from colder levels; the first resume
        also copies a partially reused block into a private page.

        Returns False (and stays SUSPENDED, nothing changed) when some GPU pool group is used
        above ``max_util_for_resume`` or room cannot be made.
        """
        self._require(CacheStatus.SUSPENDED, "resume")
        m = self._manager
        if m.gpu_utilization() > m.config.max_util_for_resume:
            plan.ok = False
            return False
        storage = m.storage
        p = storage.pages
        tpb = m.layout.tokens_per_block
        partial = self._never_resumed and self._tokens.size % tpb != 0
        ordinal = self._tokens.size // tpb
        # The priority callback may raise: ask it about the private copy's pages first.
        priorities = None
        if partial:
            blocks = np.array([ordinal])
            priorities = {lc.index: m._priorities(self.priority_callback, blocks, lc, plan)
                          for lc in m.layout.life_cycles}
        ours = self.active_pages()
        p.lockers[ours] += 1  # locked pages are never eviction candidates
        # Locked pages stop being candidates for the room this call makes, and the evictable
        # counts are read by statistics commits inside it: both hear of it now.
        storage.locked(ours)
        onboard = ours[p.level[ours] > 0]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                n = int((p.pool_group[onboard] == pg.index).sum())
                if partial:
                    n += len(pg.life_cycles)
                steps += storage.plan_room(0, pg.index, n, plan)
        except OutOfPagesError:
            p.lockers[ours] -= 1
            storage.changed(ours)
            plan.ok = False
            return False
        storage.apply_eviction(steps, plan, record=True)
        storage.move_to(onboard, 0, plan, record=True)
        if partial:
            self._copy_partial(ordinal, priorities, plan)
        ours = self.active_pages()
        p.last_used[ours] = m._now
        # The index re-keys them; the evictable counts heard of the lock (storage.locked) and
        # of every move since (Storage.move): locked, their cells stay as they are.
        storage.index.changed(ours)
        plan.counts.pages_touched += ours.size
        self._never_resumed = False
        self._status = CacheStatus.ACTIVE
        return True

    @public_call("KvCache.suspend")
    def suspend(self, plan: Plan) -> None:
        self._require(CacheStatus.ACTIVE, "suspend")
        m = self._manager
        p = m.storage.pages
        ours = self.active_pages()
        p.lockers[ours] -= 1
        p.last_used[ours] = m._now
        m.storage.changed(ours)
        plan.counts.pages_touched += ours.size
        self._status = CacheStatus.SUSPENDED

    @public_call("KvCache.prefetch")
    def prefetch(self, plan: Plan, cache_level: int) -> bool:
        """Bring the pages of a SUSPENDED cache that sit colder than ``cache_level`` up to it
        (pages at warmer levels stay). A hint: False when room cannot be made there, changing
        nothing; the moves are not counted in the statistics (KVCM2's ``prefetch``)."""
        self._require(CacheStatus.SUSPENDED, "prefetch")
        m = self._manager
        target = m._require_level(cache_level)
        storage = m.storage
        p = storage.pages
        ours = self.active_pages()
        # Held for the call's duration: none of our pages may be chosen to make room.
        p.lockers[ours] += 1
        storage.locked(ours)
        colder = ours[p.level[ours] > target]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                n = int((p.pool_group[colder] == pg.index).sum())
                steps += storage.plan_room(target, pg.index, n, plan)
        except OutOfPagesError:
            p.lockers[ours] -= 1
            storage.changed(ours)
            plan.ok = False
            return False
        storage.apply_eviction(steps, plan, record=False)
        storage.move_to(colder, target, plan, record=False)
        p.lockers[ours] -= 1
        p.last_used[ours] = m._now
        storage.changed(ours)
        plan.counts.pages_touched += ours.size
        return True

    @public_call("KvCache.close", skip_if=lambda c: c._status is CacheStatus.CLOSED
                 or c._manager._is_shut_down)
    def close(self, plan: Plan) -> None:
        """Drop the pending statistics, stop committing (committing the partial tail block) and
        release every page; closing a closed cache does nothing (not even a call)."""
        m = self._manager
        self._pending.clear()
        self._stop_committing(plan)
        m._release(self.active_pages(), self._status is CacheStatus.ACTIVE, plan)
        m._release(self.held_pages_aside(), False, plan)
        self._pages = [np.zeros(0, dtype=PAGE_IDS) for _ in self._pages]
        self._held_stale = [{} for _ in self._held_stale]
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
        """Append committed tokens; every block that becomes full enters the radix tree. An
        empty commit does nothing, in any state."""
        toks = as_tokens(tokens)
        if toks.size == 0:
            return
        self._require(CacheStatus.ACTIVE, "commit")
        if self._stopped_committing:
            raise InvalidStateError(f"cache {self.cache_id!r}: commit after stop_committing()")
        total = self._tokens.size + toks.size
        if total > self._capacity:
            raise InvalidArgumentError(
                f"committing {toks.size} tokens would make {total} committed tokens, "
                f"above capacity {self._capacity}")
        self._commit(toks, plan)

    @public_call("KvCache.stop_committing")
    def stop_committing(self, plan: Plan) -> None:
        """Commit the partial tail block (if any); no commit may follow. Any state but CLOSED."""
        if self._status is CacheStatus.CLOSED:
            raise InvalidStateError(f"cache {self.cache_id!r}: stop_committing() on a CLOSED cache")
        self._stop_committing(plan)

    @public_call("KvCache.commit_pending_stats")
    def commit_pending_stats(self, plan: Plan) -> dict[str, int]:
        """Publish this cache's pending statistics to the manager; returns the per-request delta
        (allocated, new, reused and missed blocks, summed over life cycles)."""
        return self._manager.stats.commit_pending(self._pending, plan.counts)

    @public_call("KvCache.discard_pending_stats")
    def discard_pending_stats(self, plan: Plan) -> None:
        self._pending.clear()

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

    def held_pages_aside(self) -> np.ndarray:
        return _pages_of([np.fromiter(h.values(), dtype=PAGE_IDS) for h in self._held_stale])

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
    def _adopt(self, match: Match, toks: np.ndarray | None, plan: Plan) -> None:
        """Start as a new cache holding ``match``'s pages (a partially reused block too, until
        the first resume copies it), with committed tokens, history and capacity all equal to
        the match; the reuse is recorded as pending."""
        m = self._manager
        tpb = m.layout.tokens_per_block
        p = m.storage.pages
        blocks = match.blocks
        history = match.num_tokens
        plan.counts.tree_nodes_visited += match.tree_nodes_visited
        plan.counts.blocks_hashed += match.blocks_hashed
        n_lc = m.layout.num_life_cycles
        n_full = len(match.nodes)
        full = np.zeros(n_lc, dtype=np.int64)
        partial = np.zeros(n_lc, dtype=np.int64)
        by_level = np.zeros((n_lc, m.layout.num_levels), dtype=np.int64)
        block_level = np.full(len(blocks), -1, dtype=np.int64)  # coldest level loading it
        ordinal = np.arange(len(blocks))
        for lc in m.layout.life_cycles:
            i = lc.index
            arr = np.fromiter((blk.pages[i] for blk in blocks), dtype=PAGE_IDS, count=len(blocks))
            begin, end = lc.stale_range(history, tpb)
            arr[begin:end] = NO_PAGE  # stale at the matched length: not loaded
            loaded = arr >= 0
            levels = p.level[arr[loaded]].astype(np.int64)
            by_level[i] = np.bincount(levels, minlength=m.layout.num_levels)
            at = ordinal[loaded]  # each block once: a plain gather and scatter (no ufunc.at)
            block_level[at] = np.maximum(block_level[at], levels)
            full[i] = int(loaded[:n_full].sum())
            partial[i] = int(loaded[n_full:].sum())
            self._pages[i] = arr
        held = self.active_pages()
        p.holders[held] += 1
        p.last_used[held] = m._now
        m.storage.changed(held)
        plan.counts.pages_touched += held.size
        if m.stats.enabled and blocks:
            self._pending.record_reuse(full, partial, by_level)
        if toks is not None:
            self._reuse_tier_segments = _tier_segments(block_level, history, tpb)
        self._tokens = (toks[:history] if toks is not None else self._tokens).copy()
        self._capacity = self._history = history
        self._committed_blocks = len(match.nodes)
        if match.nodes:
            self._tail_node = match.nodes[-1]
        self._refresh_generation_ready()

    def _copy_partial(self, ordinal: int, priorities: dict[int, np.ndarray], plan: Plan) -> None:
        """Private GPU copies of the partially reused last block's pages (now on the GPU and
        locked), which then replace the tree's pages in this cache."""
        m = self._manager
        storage = m.storage
        p = storage.pages
        record = m.stats.enabled
        sources = []
        for pg in m.layout.pool_groups:
            lcs = np.array(pg.life_cycles, dtype=np.int16)
            prios = np.concatenate([priorities[int(lc)] for lc in lcs])
            new = storage.allocate(0, pg.index, lcs, np.full(lcs.size, ordinal), prios, m._now,
                                   plan)
            src = np.array([self._pages[int(lc)][ordinal] for lc in lcs], dtype=PAGE_IDS)
            storage.copy_pages(src, new, pg.index, plan)
            for lc, source, page in zip(lcs.tolist(), src.tolist(), new.tolist()):
                if record:
                    # An allocation, a miss only when the source left the tree meanwhile.
                    self._pending.record_allocation(lc, ordinal, ordinal + 1,
                                                    missed=bool(p.node[source] < 0))
                self._pages[lc][ordinal] = page
            sources.append(src)
        m._release(np.concatenate(sources), True, plan)

    def _refresh_generation_ready(self) -> None:
        expected = self._expected_prompt_length
        if expected is not None and self._history >= expected:
            self._generation_ready = True

    # -- resize --------------------------------------------------------------------------------------
    def _stale_disposal(self, lc: LifeCycle, ordinals: np.ndarray) -> np.ndarray:
        """Of blocks just fallen out of ``lc``'s window, which the cache keeps holding (not
        committed yet, and it may still commit them)."""
        if self._stopped_committing:
            return np.zeros(ordinals.size, dtype=bool)
        return ordinals >= self._committed_blocks

    def _resize(self, capacity: int, history: int, plan: Plan) -> bool:
        m = self._manager
        storage = m.storage
        tpb = m.layout.tokens_per_block
        p = storage.pages
        generation = self._generation_ready and capacity > self._capacity
        new_blocks = math.ceil(capacity / tpb)
        old_blocks = self._pages[0].size if self._pages else 0
        sliding = m.layout.sliding_life_cycles
        if new_blocks == old_blocks and (not sliding or all(
                lc.stale_range(history, tpb) == lc.stale_range(self._history, tpb)
                for lc in sliding)):
            # Nothing to allocate or release (KVCM2's _shortcut_set_capacity/history_length).
            self._capacity = capacity
            self._history = history
            self._refresh_generation_ready()
            return True
        if self.grow_by_appending and new_blocks > old_blocks and not sliding and \
                all(t.size == 0 or t.min() >= 0 for t in self._pages):
            return self._grow(capacity, history, new_blocks, old_blocks, generation, plan)
        span = max(new_blocks, old_blocks)
        ordinal = np.arange(span)
        tables: list[np.ndarray] = []
        new_ordinals: list[np.ndarray] = []
        released: list[np.ndarray] = []
        kept: list[tuple[np.ndarray, np.ndarray]] = []  # (ordinals, pages) held aside
        for lc in m.layout.life_cycles:
            have = np.full(span, NO_PAGE, dtype=PAGE_IDS)
            have[:old_blocks] = self._pages[lc.index]
            need = ordinal < new_blocks
            begin, end = lc.stale_range(history, tpb)
            need[begin:end] = False
            tables.append(have)
            new_ordinals.append((need & (have < 0)).nonzero()[0])
            dropping = (~need & (have >= 0)).nonzero()[0]
            stale = dropping[dropping < new_blocks]
            keep = self._stale_disposal(lc, stale)
            kept.append((stale[keep], have[stale[keep]]))
            released.append(have[np.concatenate([stale[~keep], dropping[dropping >= new_blocks]])])
        priorities = [m._priorities(self.priority_callback, new_ordinals[lc.index], lc, plan)
                      for lc in m.layout.life_cycles]
        gone = np.concatenate(released)
        aside = np.concatenate([pages for _, pages in kept])
        # Tentatively release (and unlock what is held aside), so released committed pages count
        # as evictable and released uncommitted ones as free; undone exactly if room cannot be
        # made.
        touched = np.concatenate([gone, aside])
        old_last_used = p.last_used[touched].copy()
        # One cache's pages, each once: fancy-indexed updates (ufunc.at is ~10x slower; a
        # duplicate would show as a wrong holder count in the invariant checker).
        p.holders[gone] -= 1
        p.lockers[touched] -= 1
        p.last_used[touched] = m._now
        storage.changed(touched)
        orphans = gone[(p.holders[gone] == 0) & (p.node[gone] < 0)]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                wanted = sum(new_ordinals[lc].size for lc in pg.life_cycles)
                freed = int((p.pool_group[orphans] == pg.index).sum())
                steps += storage.plan_room(0, pg.index, wanted, plan, extra_free=freed)
        except OutOfPagesError:
            p.holders[gone] += 1
            p.lockers[touched] += 1
            p.last_used[touched] = old_last_used
            storage.changed(touched)
            plan.ok = False
            return False
        plan.counts.pages_touched += touched.size
        storage.free(orphans, plan)
        storage.apply_eviction(steps, plan, record=True)
        record = m.stats.enabled
        if record and new_blocks < old_blocks:
            self._pending.subtract_allocation(new_blocks, old_blocks)
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
                table[ords] = ids
            self._pages[lc.index] = table
            held_ords, held_pages = kept[lc.index]
            self._held_stale[lc.index].update(zip(held_ords.tolist(), held_pages.tolist()))
            if record and new_blocks > old_blocks:
                for b, e in ((old_blocks, min(new_blocks, begin)),
                             (max(old_blocks, end), new_blocks)):
                    self._pending.record_allocation(lc.index, b, e, missed=not generation,
                                                    generation=generation)
        self._capacity = capacity
        self._history = history
        self._refresh_generation_ready()
        return True

    def _grow(self, capacity: int, history: int, new_blocks: int, old_blocks: int,
              generation: bool, plan: Plan) -> bool:
        """:meth:`_resize` when it only appends blocks: every life cycle full attention, and a
        page for every block so far. The same steps in the same order, on the new blocks alone
        (a decode step's resize adds a block to thousands)."""
        m = self._manager
        storage = m.storage
        ords = np.arange(old_blocks, new_blocks)
        life_cycles = m.layout.life_cycles
        priorities = [m._priorities(self.priority_callback, ords, lc, plan) for lc in life_cycles]
        steps: list[EvictionStep] = []
        try:
            for pg in m.layout.pool_groups:
                steps += storage.plan_room(0, pg.index, ords.size * len(pg.life_cycles), plan)
        except OutOfPagesError:
            plan.ok = False
            return False
        storage.apply_eviction(steps, plan, record=True)
        record = m.stats.enabled
        for lc in life_cycles:
            ids = storage.allocate(0, lc.pool_group, np.full(ords.size, lc.index, dtype=np.int16),
                                   ords, priorities[lc.index], m._now, plan)
            self._pages[lc.index] = np.concatenate([self._pages[lc.index], ids])
            if record:
                self._pending.record_allocation(lc.index, old_blocks, new_blocks,
                                                missed=not generation, generation=generation)
        self._capacity = capacity
        self._history = history
        self._refresh_generation_ready()
        return True

    def _advance_history(self, history: int, plan: Plan) -> None:
        """Raise history (never fails): sliding-window blocks falling out of the window are
        unlocked; committed ones released, the others held aside while commits may follow."""
        m = self._manager
        tpb = m.layout.tokens_per_block
        p = m.storage.pages
        for lc in m.layout.life_cycles:
            if lc.is_sliding:
                begin, end = lc.stale_range(history, tpb)
                table = self._pages[lc.index]
                ords = begin + (table[begin:end] >= 0).nonzero()[0]
                keep = self._stale_disposal(lc, ords)
                m._release(table[ords[~keep]], True, plan)
                aside = table[ords[keep]]
                p.lockers[aside] -= 1
                p.last_used[aside] = m._now
                m.storage.changed(aside)
                self._held_stale[lc.index].update(zip(ords[keep].tolist(), aside.tolist()))
                table[begin:end] = NO_PAGE
        self._history = history
        self._refresh_generation_ready()

    # -- commit --------------------------------------------------------------------------------------
    def _reattach(self, root: Root, plan: Plan) -> None:
        """If the node of this cache's last committed block has left the tree (its pages were
        dropped and it was removed), put the cache's committed blocks back in, so new blocks hang
        from a live parent. Blocks still in the tree are found; missing ones are re-added with
        the pages the cache still holds."""
        tail = self._tail_node
        if tail is None or self._manager.tree.nodes.get(tail.node_id) is tail:
            return
        tpb = self._manager.layout.tokens_per_block
        self._tail_node = None
        for b in range(self._committed_blocks):
            block = raw_tokens(self._tokens[b * tpb:(b + 1) * tpb])
            self._tail_node = self._commit_block(root, b, block, plan)

    def _page_of(self, lc: int, ordinal: int) -> int:
        table = self._pages[lc]
        page = int(table[ordinal]) if ordinal < table.size else NO_PAGE
        return page if page != NO_PAGE else self._held_stale[lc].get(ordinal, NO_PAGE)

    def _commit(self, toks: np.ndarray, plan: Plan) -> None:
        m = self._manager
        tpb = m.layout.tokens_per_block
        # A decode step appends a block or so to thousands of tokens: written into the room
        # after them instead of copying them all (1 % of a long replay). Only _tokens views the
        # room, and only its start: nothing else sees what is written past its end.
        n, room = self._tokens.size, self._token_room
        if room is None or self._tokens.base is not room or room.size < n + toks.size:
            room = self._token_room = np.empty(max(2 * (n + toks.size), 256), dtype=np.uint32)
            room[:n] = self._tokens
        room[n:n + toks.size] = toks
        self._tokens = room[:n + toks.size]
        root = m.tree.root_for(self.scope)
        self._reattach(root, plan)
        first, full_blocks = self._committed_blocks, self._tokens.size // tpb
        if full_blocks > first:
            # One conversion for all new blocks; each block is then a slice of its bytes, and
            # each new node keeps one.
            raw = raw_tokens(self._tokens[first * tpb:full_blocks * tpb])
            width = tpb * 4
            count = full_blocks - first
            # Each block's page per life cycle, in one conversion.
            # (a copy: held-aside pages are written into it below)
            page_table = (self._pages[0][first:full_blocks, None].copy() if len(self._pages) == 1
                          else np.stack([t[first:full_blocks] for t in self._pages], axis=1))
            held_aside = any(self._held_stale)
            for lc, held in enumerate(self._held_stale):
                for b, page in held.items():
                    if first <= b < full_blocks:
                        page_table[b - first, lc] = page
            # Blocks one at a time (_commit_block) while the tree may already hold them, or a
            # partial sibling they replace, or an event is due for each: until the first block
            # its parent has no child for. Every block after it is new (a new node has no
            # children), and they enter the tree as one chain.
            tail = self._tail_node
            one_by_one = m.event_sink is not None
            i = 0
            while i < count:
                blk = raw[i * width:(i + 1) * width]
                if not one_by_one and not m.tree.has_partial_children(root, tail) and \
                        (root if tail is None else tail).child(blk) is None:
                    break
                self._tail_node = tail
                tail = self._commit_block(root, first + i, blk, plan)
                i += 1
            fresh = count - i
            if fresh:
                rows = page_table[i:]  # the new blocks' pages
                tail = m.tree.add_chain(root, tail, raw, i, fresh, rows.tolist())
                node_of_page = m.storage.pages.node
                # Not reported to the eviction index: these pages are the ACTIVE cache's, locked
                # (pages held aside are reported below, when they are released).
                if fresh == 1:  # a decode step's block: no arrays for one row
                    for page in rows[0].tolist():
                        if page != NO_PAGE:
                            node_of_page[page] = tail.node_id
                else:
                    node_ids = np.arange(tail.node_id - fresh + 1, tail.node_id + 1,
                                         dtype=np.int32)
                    for pages in rows.T:  # one life cycle's pages at a time
                        has = pages != NO_PAGE
                        node_of_page[pages[has]] = node_ids[has]
                c = plan.counts  # _commit_block counted its own blocks
                c.blocks_hashed += fresh
                c.tree_nodes_visited += fresh
                c.tree_nodes_created += fresh
            self._tail_node = tail
            self._committed_blocks = full_blocks
            if held_aside:
                self._release_committed_aside(plan)
        ours = self.active_pages()
        # Not reported to the eviction index: an ACTIVE cache's pages are locked, hence not
        # candidates, and whatever unlocks them (suspend, close, release) reports them then.
        m.storage.pages.last_used[ours] = m._now
        if self._tokens.size > self._history:
            self._advance_history(int(self._tokens.size), plan)

    def _release_committed_aside(self, plan: Plan) -> None:
        """Out-of-window pages held for a commit that has now happened: the tree has them."""
        for held in self._held_stale:
            done = [b for b in held if b < self._committed_blocks]
            if done:
                self._manager._release(np.array([held.pop(b) for b in done], dtype=PAGE_IDS),
                                       False, plan)

    def _stop_committing(self, plan: Plan) -> None:
        if self._stopped_committing:
            return
        m = self._manager
        tpb = m.layout.tokens_per_block
        b = self._committed_blocks
        tail = self._tokens[b * tpb:]
        if tail.size and b == self._tokens.size // tpb:
            root = m.tree.root_for(self.scope)
            self._reattach(root, plan)
            self._commit_block(root, b, raw_tokens(tail), plan)
        self._stopped_committing = True
        # Out-of-window pages held for a commit that will not come now.
        m._release(self.held_pages_aside(), False, plan)
        self._held_stale = [{} for _ in self._held_stale]

    def _commit_block(self, root: Root, ordinal: int, raw: bytes, plan: Plan) -> Node | None:
        """Put one block of this cache, its tokens ``raw`` (little-endian uint32 bytes), into the
        tree (KVCM2's ``_commit_block``).

        An identical full block already there: the cache rebases onto its pages (ours are given
        back; a page of theirs off the GPU is brought up). A partial block whose tokens an
        existing sibling already holds adds nothing (None; the cache keeps its page). Otherwise
        a new node with our pages, replacing the shorter partial siblings it covers.
        """
        m = self._manager
        storage = m.storage
        p = storage.pages
        c = plan.counts
        c.blocks_hashed += 1
        c.tree_nodes_visited += 1
        parent = self._tail_node if ordinal else None
        n_lc = m.layout.num_life_cycles
        ours = [self._page_of(lc, ordinal) for lc in range(n_lc)]
        full = len(raw) == 4 * m.layout.tokens_per_block
        if full:
            node = (root if parent is None else parent).child(raw)
            if node is not None:
                self._rebase(node, ordinal, ours, plan)
                return node
        elif m.tree.covering_sibling(root, parent, raw) is not None:
            return None
        for replaced in m.tree.covered_partials(root, parent, raw):
            m._remove_nodes([replaced], plan)
        node = m.tree.add_node(root, parent, raw, ours)
        c.tree_nodes_created += 1
        for page in ours:
            if page != NO_PAGE:
                p.node[page] = node.node_id
        storage.changed([page for page in ours if page != NO_PAGE])
        m._emit({"type": "stored", "scope": root.scope, "block": ordinal,
                 "num_tokens": len(raw) >> 2}, plan)
        return node

    def _rebase(self, node: Node, ordinal: int, ours: list[int], plan: Plan) -> None:
        """Use the tree's pages of an identical block instead of ours (KVCM2 rebasing)."""
        m = self._manager
        storage = m.storage
        p = storage.pages
        active = self._status is CacheStatus.ACTIVE
        storage.changed([page for page in (*ours, *node.pages) if page != NO_PAGE])
        for lc, mine in enumerate(ours):
            theirs = node.pages[lc]
            if mine == NO_PAGE or theirs == mine:
                continue
            if theirs == NO_PAGE:
                # The tree's copy is gone: ours takes its place.
                node.pages[lc] = mine
                p.node[mine] = node.node_id
                continue
            in_table = ordinal < self._pages[lc].size and self._pages[lc][ordinal] == mine
            locked = active and in_table
            p.holders[theirs] += 1
            if in_table:
                self._pages[lc][ordinal] = theirs
            else:
                self._held_stale[lc][ordinal] = theirs
            m._release(np.array([mine], dtype=PAGE_IDS), locked, plan)
            if locked:
                p.lockers[theirs] += 1
            # _release above, or an earlier life cycle's move, may have read the counts and so
            # consumed the report made on entry: report the holder (and locker) change again.
            storage.changed([theirs])
            if locked:
                level = int(p.level[theirs])
                if level > 0:
                    # Our page's slot was just freed: theirs comes up into it.
                    storage.move(np.array([theirs], dtype=PAGE_IDS), level, 0,
                                 int(p.pool_group[theirs]), plan, record=True)

    # -- planned drops -------------------------------------------------------------------------------
    def _plan_drop(self, plan: Plan) -> PlannedDrop | None:
        m = self._manager
        tpb = m.layout.tokens_per_block
        p = m.storage.pages
        n_tokens = int(self._tokens.size)
        if n_tokens == 0:
            return None
        nodes, hashed, _ = m.tree.walk(self.scope, self._tokens)
        plan.counts.blocks_hashed += hashed
        plan.counts.tree_nodes_visited += len(nodes)
        if len(nodes) < math.ceil(n_tokens / tpb):
            return None
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
        ids = np.concatenate(chosen) if chosen else np.zeros(0, dtype=PAGE_IDS)
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
            raise InvalidStateError("PlannedDrop.drop(): this plan has already been dropped")
        storage = self._manager.storage
        p = storage.pages
        ids = self._page_ids[p.generation[self._page_ids] == self._generations]  # rows freed since
        p.planned_drops[ids] -= 1
        now = ids[(p.planned_drops[ids] == 0) & (p.holders[ids] == 0) & (p.node[ids] >= 0)]
        storage.drop(now, plan, record=False)
        self._dropped = True
        return int(now.size)

    def __del__(self) -> None:
        # An unapplied plan is applied when the handle is discarded, as in KVCM2.
        try:
            if not self._dropped and not self._manager._is_shut_down:
                self.drop()
        except Exception:  # noqa: BLE001 - never raise from a destructor
            pass


def _tier_segments(block_level: np.ndarray, history: int, tpb: int) -> list[tuple[int | None, int]]:
    """Runs of reused blocks loaded from one level: ``(level or None when nothing loads them,
    tokens)``, in block order (the last block holds ``history``'s remainder). One pass in numpy:
    a prompt reuses hundreds of blocks."""
    if block_level.size == 0:
        return []
    starts = np.flatnonzero(np.diff(block_level, prepend=block_level[0] - 1))
    per_block = np.minimum(tpb, history - tpb * np.arange(block_level.size, dtype=np.int64))
    tokens = np.add.reduceat(per_block, starts)
    return [(None if level < 0 else level, n)
            for level, n in zip(block_level[starts].tolist(), tokens.tolist())]
