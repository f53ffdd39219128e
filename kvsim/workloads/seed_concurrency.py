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
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsim.manager import KVCacheManager, ManagerConfig, Outcome
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Sleep, Step, Workload, drop_last_reference
from kvsim.validation import MAX_COUNT, FloatRange, IntRange, schema
from kvsim.workloads import concurrent_probe


@schema
@dataclass(frozen=True)
class SeedConcurrencyWorkload(concurrent_probe.ConcurrentProbeWorkload):
    """The concurrent-probe workload's fields, and the stats and drop threads'."""

    stats_queries: IntRange(1, MAX_COUNT) = 50
    stats_interval_us: FloatRange(0.0, 1e9) = 20.0
    drop_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) = 256
    kind: Literal["seed_concurrency"] = "seed_concurrency"


def workload(config: ManagerConfig, spec: SeedConcurrencyWorkload, manager: KVCacheManager,
             seed: int) -> Workload:
    base = concurrent_probe.workload(config, spec, manager, seed)
    rng = np.random.default_rng(seed + 1)
    shared: dict[str, object] = {}

    def stats() -> Iterator[Step]:
        for i in range(spec.stats_queries):
            if i:
                yield Sleep(spec.stats_interval_us * 1e-6)
            yield Call("stats", Api.GET_STORAGE_STATISTICS, {"level": 0},
                       lambda: manager.get_storage_statistics.with_plan(0))
            yield Call("stats", Api.GET_COMMITTED_STATS, {},
                       manager.get_committed_stats.with_plan)
            yield Call("stats", Api.GET_AND_RESET_ITERATION_STATS, {},
                       manager.get_and_reset_iteration_stats.with_plan)

    def owner() -> Iterator[Step]:
        tokens = rng.integers(0, 2**31, size=spec.drop_tokens)

        def create() -> Outcome:
            outcome = manager.create_kv_cache.with_plan(cache_id="dropper")
            shared["cache"] = outcome.value
            return outcome

        def plan() -> Outcome:
            outcome = shared["cache"].plan_committed_block_drop.with_plan()
            shared["handle"] = outcome.value
            return outcome

        yield Call("drop", Api.CREATE_KV_CACHE, {"cache_id": "dropper"}, create)
        yield Call("drop", Api.RESUME, {}, lambda: shared["cache"].resume.with_plan())
        yield Call("drop", Api.RESIZE, {"capacity": spec.drop_tokens},
                   lambda: shared["cache"].resize.with_plan(spec.drop_tokens))
        yield Call("drop", Api.COMMIT, {"tokens": spec.drop_tokens},
                   lambda: shared["cache"].commit.with_plan(tokens))
        yield Call("drop", Api.STOP_COMMITTING, {},
                   lambda: shared["cache"].stop_committing.with_plan())
        yield Call("drop", Api.PLAN_COMMITTED_BLOCK_DROP, {}, plan)
        yield Call("drop", Api.CLOSE, {}, lambda: shared["cache"].close.with_plan())

    def collector() -> Iterator[Step]:
        # Hand-over: the handle is discarded on another thread once the owner has made it
        # (bounded, so a failed owner cannot keep the simulation polling forever).
        for _ in range(100_000):
            if "handle" in shared:
                break
            yield Sleep(10e-6)
        yield Call("drop", Api.DROP_DESTRUCTOR, {},
                   lambda: drop_last_reference(shared.pop("handle", None)))

    def threads() -> dict[str, Iterator[Step]]:
        out = base.make_threads()
        out.update({"stats": stats(), "owner": owner(), "collector": collector()})
        return out

    return Workload(setup=base.setup, make_threads=threads, holds=base.holds)
