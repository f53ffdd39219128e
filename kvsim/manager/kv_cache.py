"""One request's KV cache: a state machine over pages owned through the manager.

SUSPENDED --resume()--> ACTIVE --suspend()--> SUSPENDED; close() from any state -> CLOSED
(idempotent). Only an ACTIVE cache resizes and commits; its pages are LOCKED on the GPU level.
Every method validates first and mutates after, so a call that raises changes nothing.

Invariant: ``num_committed_tokens <= history_length <= capacity``; the cache has
``ceil(capacity / tokens_per_block)`` blocks, each with one page per life cycle except the stale
blocks of sliding-window life cycles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from kvsim.errors import InvalidArgumentError, InvalidStateError, OutOfPagesError
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.manager.radix_tree import Node

if TYPE_CHECKING:
    from kvsim.manager.manager import KVCacheManager

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
    def resume(self) -> bool:
        """Lock every page on the GPU, onboarding from colder levels.

        Returns False (and stays SUSPENDED) when GPU utilisation of a pool group would exceed
        ``max_util_for_resume`` or room cannot be made.
        """
        with self._manager._api("KvCache.resume") as plan:
            self._require(CacheStatus.SUSPENDED, "resume")
            return self._manager._resume(self, plan)

    def suspend(self) -> None:
        with self._manager._api("KvCache.suspend") as plan:
            self._require(CacheStatus.ACTIVE, "suspend")
            self._manager._suspend(self, plan)

    def close(self) -> None:
        """Release every page; closing a closed cache does nothing."""
        if self._status is CacheStatus.CLOSED or self._manager._is_shut_down:
            return
        with self._manager._api("KvCache.close") as plan:
            self._manager._close(self, plan)

    def resize(self, capacity: int, history_length: int | None = None) -> bool:
        """Grow or shrink to ``capacity`` tokens, optionally advancing the history.

        Needs ACTIVE. History never decreases and capacity never drops below it. Returns False,
        with nothing changed, when the GPU level cannot supply the pages.
        """
        with self._manager._api("KvCache.resize") as plan:
            self._require(CacheStatus.ACTIVE, "resize")
            capacity = require_size("capacity", capacity)
            history = self._history if history_length is None else require_size(
                "history_length", history_length)
            if history < self._history:
                raise InvalidArgumentError(
                    f"history_length may not decrease: {history} < current {self._history}")
            if capacity < history:
                raise InvalidArgumentError(
                    f"capacity {capacity} is below history_length {history}")
            return self._manager._resize_cache(self, capacity, history, plan)

    def commit(self, tokens: object) -> None:
        """Append committed tokens; every block that becomes full enters the radix tree."""
        with self._manager._api("KvCache.commit") as plan:
            self._require(CacheStatus.ACTIVE, "commit")
            if self._stopped_committing:
                raise InvalidStateError(f"cache {self.cache_id!r}: commit after stop_committing()")
            toks = as_tokens(tokens)
            total = self._tokens.size + toks.size
            if total > self._capacity:
                raise InvalidArgumentError(
                    f"committing {toks.size} tokens would make {total} committed tokens, "
                    f"above capacity {self._capacity}")
            self._manager._commit(self, toks, plan)

    def stop_committing(self) -> None:
        """Commit the partial tail block (if any); no commit may follow."""
        with self._manager._api("KvCache.stop_committing") as plan:
            self._require(CacheStatus.ACTIVE, "stop_committing")
            if not self._stopped_committing:
                self._manager._stop_committing(self, plan)

    def plan_committed_block_drop(self) -> PlannedDrop | None:
        """Plan to drop the committed pages of sliding-window life cycles' current windows.

        Needs ``stop_committing()`` first. Returns None when nothing is committed or the tree no
        longer holds this cache's pages.
        """
        with self._manager._api("KvCache.plan_committed_block_drop") as plan:
            if not self._stopped_committing:
                raise InvalidStateError(
                    f"cache {self.cache_id!r}: plan_committed_block_drop() needs stop_committing() first")
            return self._manager._plan_drop(self, plan)

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

    def drop(self) -> int:
        """Apply the plan; returns the number of pages dropped now."""
        with self._manager._api("PlannedDrop.drop") as plan:
            if self._dropped:
                raise InvalidStateError("PlannedDrop.drop() called twice")
            n = self._manager._apply_drop(self._page_ids, self._generations, plan)
            self._dropped = True
            return n

    def __del__(self) -> None:
        # An unapplied plan is applied when the handle is discarded, as in KVCM2.
        try:
            if not self._dropped and not self._manager._is_shut_down:
                self.drop()
        except Exception:  # noqa: BLE001 - never raise from a destructor
            pass

