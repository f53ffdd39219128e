"""The KV-cache manager model: pure state; every call returns its value, and its plan to an
executor that asks (``call.with_plan(...)``); executors add time."""

from kvsim.manager.calls import Outcome
from kvsim.manager.config import LayerConfig, LevelConfig, ManagerConfig, StorageLayout
from kvsim.manager.kv_cache import CacheStatus, KvCache, PlannedDrop
from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch, Plan, WorkCounts

__all__ = [
    "CacheStatus",
    "CopyBatch",
    "KVCacheManager",
    "KvCache",
    "LayerConfig",
    "LevelConfig",
    "ManagerConfig",
    "Outcome",
    "Plan",
    "PlannedDrop",
    "StorageLayout",
    "WorkCounts",
]
