"""KVCM2's concurrency tests as one workload (the seed's test_kv_cache_concurrency.py).

Threads, all at once on one manager:
* ``probe0..7`` -- 8 threads x ``probes_per_thread`` probe_reuse calls (many threads probing);
* ``resize``   -- a background burst resize holding the lock exclusively for milliseconds
  (probes and stats queries run concurrently with it);
* ``stats``    -- storage statistics, committed statistics and get-and-reset of the iteration
  statistics in a loop (stats queries do not block, and are not blocked forever by, a resize);
* ``owner`` / ``collector`` -- a request commits, stops committing and plans a committed-block
  drop on ``owner``; the handle is discarded on ``collector`` (its destructor applies the plan
  under the exclusive lock from another thread).

The fixed configuration must pass: every call succeeds, no violation, no deadlock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from kvsim.manager import KvCache, KVCacheManager, ManagerConfig, PlannedDrop
from kvsim.runtime.steps import Call, Sleep, Step, Workload
from kvsim.workloads import concurrent_probe


@dataclass(frozen=True)
class SeedConcurrencyWorkload:
    probes: concurrent_probe.ConcurrentProbeWorkload = field(
        default_factory=lambda: concurrent_probe.ConcurrentProbeWorkload(
            background=concurrent_probe.burst_resize.BurstResizeWorkload(0, 1)))
    stats_queries: int = 50
    stats_interval_us: float = 20.0
    drop_tokens: int = 256
    kind: str = "seed_concurrency"


def workload(config: ManagerConfig, spec: SeedConcurrencyWorkload, manager: KVCacheManager,
             seed: int) -> Workload:
    base = concurrent_probe.workload(config, spec.probes, manager, seed)
    rng = np.random.default_rng(seed + 1)
    shared: dict[str, object] = {}

    def stats() -> Iterator[Step]:
        for i in range(spec.stats_queries):
            if i:
                yield Sleep(spec.stats_interval_us * 1e-6)
            yield Call("stats", "KVCacheManager.get_storage_statistics", {"level": 0},
                       lambda: manager.get_storage_statistics(0))
            yield Call("stats", "KVCacheManager.get_committed_stats", {},
                       manager.get_committed_stats)
            yield Call("stats", "KVCacheManager.get_and_reset_iteration_stats", {},
                       manager.get_and_reset_iteration_stats)

    def owner() -> Iterator[Step]:
        tokens = rng.integers(0, 2**31, size=spec.drop_tokens)

        def create() -> KvCache:
            shared["cache"] = manager.create_kv_cache(cache_id="dropper")
            return shared["cache"]

        def plan() -> PlannedDrop | None:
            shared["handle"] = shared["cache"].plan_committed_block_drop()
            return shared["handle"]

        yield Call("drop", "KVCacheManager.create_kv_cache", {"cache_id": "dropper"}, create)
        yield Call("drop", "KvCache.resume", {}, lambda: shared["cache"].resume())
        yield Call("drop", "KvCache.resize", {"capacity": spec.drop_tokens},
                   lambda: shared["cache"].resize(spec.drop_tokens))
        yield Call("drop", "KvCache.commit", {"tokens": spec.drop_tokens},
                   lambda: shared["cache"].commit(tokens))
        yield Call("drop", "KvCache.stop_committing", {}, lambda: shared["cache"].stop_committing())
        yield Call("drop", "KvCache.plan_committed_block_drop", {}, plan)
        yield Call("drop", "KvCache.close", {}, lambda: shared["cache"].close())

    def collector() -> Iterator[Step]:
        # Hand-over: the handle is discarded on another thread once the owner has made it
        # (bounded, so a failed owner cannot keep the simulation polling forever).
        for _ in range(100_000):
            if "handle" in shared:
                break
            yield Sleep(10e-6)

        def discard() -> None:
            handle = shared.pop("handle")
            if handle is not None:
                handle.__del__()  # what CPython runs when the last reference goes

        yield Call("drop", "PlannedDrop.__del__", {}, discard)

    def threads() -> dict[str, Iterator[Step]]:
        out = base.make_threads()
        out.update({"stats": stats(), "owner": owner(), "collector": collector()})
        return out

    return Workload(setup=base.setup, make_threads=threads)
