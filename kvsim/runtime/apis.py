"""Every public API of the manager with the lock mode it takes: the one table both executors read.

KVCM2 guards the radix tree, storage and the set of living caches with one reentrant
reader-writer mutex per manager. Mutating APIs take it exclusive, read-only queries take it
shared, and values fixed at construction need no lock. Nothing else decides locking.

A workload names the API of each call it makes by an :class:`Api` member, never by a string,
so a misspelt API cannot run without its lock; :meth:`Api.named` turns a label from a file
(``sim.gil_release``, ``expect_failures``) into a member or says which labels exist.
``plan_api`` is the manager call whose plan the API's invocation returns: usually itself; a
property setter runs ``KvCache.resize``, a cache's destructor ``KvCache.close``, a drop handle's
destructor ``PlannedDrop.drop``; the executors check that the plan a call returns is that one.
"""

from __future__ import annotations

from enum import Enum

from kvsim.errors import ConfigError


class LockMode(Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    NONE = "none"

    # Members are singletons compared by identity: hashed by identity too, in C (Enum's own
    # __hash__ is a Python function, and MODE_VALUE is read twice a call).
    __hash__ = object.__hash__


# A member's .value goes through a descriptor (slow in the lock's hot paths): each mode's string,
# as Acquisition and CallRecord hold it, read once.
MODE_VALUE: dict[LockMode, str] = {mode: mode.value for mode in LockMode}


class UnknownApiError(ConfigError):
    """A label that names no API of the table."""


EXCLUSIVE, SHARED, NONE = LockMode.EXCLUSIVE, LockMode.SHARED, LockMode.NONE


class Api(Enum):
    # KVCacheManager
    CREATE_KV_CACHE = ("KVCacheManager.create_kv_cache", EXCLUSIVE)
    MANAGER_RESIZE = ("KVCacheManager.resize", EXCLUSIVE)  # resize(cache_level, quota)
    SHUTDOWN = ("KVCacheManager.shutdown", EXCLUSIVE)
    CLEAR_REUSABLE_BLOCKS = ("KVCacheManager.clear_reusable_blocks", EXCLUSIVE)
    GET_AND_RESET_ITERATION_STATS = ("KVCacheManager.get_and_reset_iteration_stats", EXCLUSIVE)
    PROBE_REUSE = ("KVCacheManager.probe_reuse", SHARED)
    GET_QUOTA = ("KVCacheManager.get_quota", SHARED)
    GET_COMMITTED_STATS = ("KVCacheManager.get_committed_stats", SHARED)
    GET_STORAGE_STATISTICS = ("KVCacheManager.get_storage_statistics", SHARED)
    TOKENS_PER_BLOCK = ("KVCacheManager.tokens_per_block", NONE)
    # KvCache: one cache belongs to one thread; the lock guards what caches share.
    RESUME = ("KvCache.resume", EXCLUSIVE)
    SUSPEND = ("KvCache.suspend", EXCLUSIVE)
    CLOSE = ("KvCache.close", EXCLUSIVE)  # also reached from the cache's destructor
    RESIZE = ("KvCache.resize", EXCLUSIVE)  # resize(capacity, history_length)
    COMMIT = ("KvCache.commit", EXCLUSIVE)
    STOP_COMMITTING = ("KvCache.stop_committing", EXCLUSIVE)
    PLAN_COMMITTED_BLOCK_DROP = ("KvCache.plan_committed_block_drop", EXCLUSIVE)
    PREFETCH = ("KvCache.prefetch", EXCLUSIVE)  # prefetch(cache_level)
    # Publishing a cache's statistics writes the manager's; taken exclusive, like every call
    # that writes what caches share.
    COMMIT_PENDING_STATS = ("KvCache.commit_pending_stats", EXCLUSIVE)
    DISCARD_PENDING_STATS = ("KvCache.discard_pending_stats", EXCLUSIVE)
    STATUS = ("KvCache.status", NONE)
    CAPACITY = ("KvCache.capacity", NONE)
    HISTORY_LENGTH = ("KvCache.history_length", NONE)
    NUM_COMMITTED_TOKENS = ("KvCache.num_committed_tokens", NONE)
    # Bindings that reach exclusive paths without looking like calls: each may block on the
    # lock, so each must release the GIL first (the deadlocks the seed fixed).
    CAPACITY_SETTER = ("KvCache.capacity.setter", EXCLUSIVE, "KvCache.resize")
    HISTORY_LENGTH_SETTER = ("KvCache.history_length.setter", EXCLUSIVE, "KvCache.resize")
    CACHE_DESTRUCTOR = ("KvCache.__del__", EXCLUSIVE, "KvCache.close")
    # PlannedDrop.drop(), also reached from the handle's destructor
    DROP = ("PlannedDrop.drop", EXCLUSIVE)
    DROP_DESTRUCTOR = ("PlannedDrop.__del__", EXCLUSIVE, "PlannedDrop.drop")

    def __init__(self, label: str, mode: LockMode, plan_api: str | None = None) -> None:
        self.label = label
        self.mode = mode
        self.plan_api = plan_api or label

    def __str__(self) -> str:
        return self.label

    @classmethod
    def named(cls, label: str) -> Api:
        """The API a label names; an unknown label is an error listing the known ones."""
        try:
            return _BY_LABEL[label]
        except (KeyError, TypeError):
            raise UnknownApiError(f"unknown API {label!r} (known: {', '.join(_BY_LABEL)})") from None


_BY_LABEL: dict[str, Api] = {api.label: api for api in Api}
LABELS: frozenset[str] = frozenset(_BY_LABEL)


def lock_mode(label: str) -> LockMode:
    """The declared lock mode of the API ``label``; an unknown label is an error."""
    return Api.named(label).mode
