"""The lock mode of every public API: the one table both executors read.

KVCM2 guards the radix tree, storage and the set of living caches with one reentrant
reader-writer mutex per manager. Mutating APIs take it exclusive, read-only queries take it
shared, and values fixed at construction need no lock. Nothing else decides locking.
"""

from __future__ import annotations

from enum import Enum


class LockMode(Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    NONE = "none"


API_LOCK_MODES: dict[str, LockMode] = {
    # KVCacheManager
    "KVCacheManager.create_kv_cache": LockMode.EXCLUSIVE,
    "KVCacheManager.resize": LockMode.EXCLUSIVE,  # resize(cache_level, quota)
    "KVCacheManager.shutdown": LockMode.EXCLUSIVE,
    "KVCacheManager.clear_reusable_blocks": LockMode.EXCLUSIVE,
    "KVCacheManager.get_and_reset_iteration_stats": LockMode.EXCLUSIVE,
    "KVCacheManager.probe_reuse": LockMode.SHARED,
    "KVCacheManager.get_quota": LockMode.SHARED,
    "KVCacheManager.get_committed_stats": LockMode.SHARED,
    "KVCacheManager.get_storage_statistics": LockMode.SHARED,
    "KVCacheManager.tokens_per_block": LockMode.NONE,
    # KvCache: one cache belongs to one thread; the lock guards what caches share.
    "KvCache.resume": LockMode.EXCLUSIVE,
    "KvCache.suspend": LockMode.EXCLUSIVE,
    "KvCache.close": LockMode.EXCLUSIVE,  # also reached from the cache's destructor
    "KvCache.resize": LockMode.EXCLUSIVE,  # resize(capacity, history_length)
    "KvCache.commit": LockMode.EXCLUSIVE,
    "KvCache.stop_committing": LockMode.EXCLUSIVE,
    "KvCache.plan_committed_block_drop": LockMode.EXCLUSIVE,
    "KvCache.status": LockMode.NONE,
    "KvCache.capacity": LockMode.NONE,
    "KvCache.history_length": LockMode.NONE,
    "KvCache.num_committed_tokens": LockMode.NONE,
    # Bindings that reach exclusive paths without looking like calls: each may block on the lock,
    # so each must release the GIL first (the deadlocks the seed fixed).
    "KvCache.capacity.setter": LockMode.EXCLUSIVE,  # -> resize()
    "KvCache.history_length.setter": LockMode.EXCLUSIVE,  # -> resize()
    "KvCache.__del__": LockMode.EXCLUSIVE,  # -> close()
    # PlannedDrop.drop(), also reached from the handle's destructor
    "PlannedDrop.drop": LockMode.EXCLUSIVE,
    "PlannedDrop.__del__": LockMode.EXCLUSIVE,  # applies an unapplied plan
}


def lock_mode(api: str) -> LockMode:
    """The declared lock mode of ``api``; an unknown name is a bug in the caller."""
    try:
        return API_LOCK_MODES[api]
    except KeyError:
        raise KeyError(f"no lock mode declared for API {api!r}") from None
