"""The KV-cache manager model: pure state that records plans; executors add time."""

from kvsim.manager.config import LayerConfig, LevelConfig, ManagerConfig, StorageLayout
from kvsim.manager.kv_cache import CacheStatus, KvCache, PlannedDrop
from kvsim.manager.manager import KVCacheManager, ProbeResult
from kvsim.manager.plan import CopyBatch, Plan, WorkCounts

__all__ = [
    "CacheStatus",
    "CopyBatch",
    "KVCacheManager",
    "KvCache",
    "LayerConfig",
    "LevelConfig",
    "ManagerConfig",
    "Plan",
    "PlannedDrop",
    "ProbeResult",
    "StorageLayout",
    "WorkCounts",
]
