"""The seed's GIL deadlock: a binding that blocks on the manager lock while holding the GIL.

An ``antagonist`` thread loops create -> resume -> resize -> commit (fresh tokens, so every
iteration commits and runs its priority callback under the lock) -> close, like the antagonist in
KVCM2's concurrency tests. A ``victim`` thread keeps setting its cache's capacity through the
property setter (``KvCache.capacity.setter``, which reaches ``resize()``) and finally drops its
last reference (``KvCache.__del__``, which reaches ``close()``). The antagonist re-takes the GIL
under the lock for its callback; if the victim's binding keeps the GIL while it waits for the
lock, the two wait for each other. ``sim.gil_release`` decides per binding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsim.manager import KvCache, KVCacheManager, ManagerConfig, Outcome
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Sleep, Step, Workload, drop_last_reference, set_capacity
from kvsim.validation import MAX_COUNT, FloatRange, IntRange, schema


@schema
@dataclass(frozen=True)
class GilAntagonistWorkload:
    iterations: IntRange(1, MAX_COUNT) = 50  # antagonist create/commit/close cycles
    setter_calls: IntRange(1, MAX_COUNT) = 50  # victim capacity-setter calls
    tokens: IntRange(1, MAX_SEQUENCE_TOKENS) = 64  # tokens each antagonist iteration commits
    priority: IntRange(0, 100) = 50  # what the antagonist's priority callback returns
    victim_start_us: FloatRange(0.0, 1e12) = 1.0
    kind: Literal["gil_antagonist"] = "gil_antagonist"


def workload(config: ManagerConfig, spec: GilAntagonistWorkload, manager: KVCacheManager,
             seed: int) -> Workload:
    tpb = config.tokens_per_block
    rng = np.random.default_rng(seed)

    def antagonist() -> Iterator[Step]:
        for i in range(spec.iterations):
            handle: dict[str, KvCache] = {}
            tokens = rng.integers(0, 2**31, size=spec.tokens)
            cid = f"antagonist{i}"

            def create(cid: str = cid, handle: dict = handle) -> Outcome:
                outcome = manager.create_kv_cache.with_plan(
                    cache_id=cid, priority_callback=lambda block, lc: spec.priority)
                handle["c"] = outcome.value
                return outcome

            yield Call("antagonist", Api.CREATE_KV_CACHE, {"cache_id": cid}, create)
            yield Call("antagonist", Api.RESUME, {"cache_id": cid},
                       lambda h=handle: h["c"].resume.with_plan())
            yield Call("antagonist", Api.RESIZE, {"cache_id": cid, "capacity": spec.tokens},
                       lambda h=handle: h["c"].resize.with_plan(spec.tokens))
            yield Call("antagonist", Api.COMMIT, {"cache_id": cid, "tokens": spec.tokens},
                       lambda h=handle, t=tokens: h["c"].commit.with_plan(t))
            yield Call("antagonist", Api.CLOSE, {"cache_id": cid},
                       lambda h=handle: h["c"].close.with_plan())

    def victim() -> Iterator[Step]:
        yield Sleep(spec.victim_start_us * 1e-6)
        handle: dict[str, KvCache] = {}

        def create() -> Outcome:
            outcome = manager.create_kv_cache.with_plan(cache_id="victim")
            handle["c"] = outcome.value
            return outcome

        yield Call("victim", Api.CREATE_KV_CACHE, {"cache_id": "victim"}, create)
        yield Call("victim", Api.RESUME, {"cache_id": "victim"},
                   lambda: handle["c"].resume.with_plan())
        for i in range(spec.setter_calls):
            size = tpb * (1 + i % 4)
            yield Call("victim", Api.CAPACITY_SETTER, {"cache_id": "victim", "capacity": size},
                       lambda size=size: set_capacity(handle["c"], size))
        yield Call("victim", Api.CACHE_DESTRUCTOR, {"cache_id": "victim"},
                   lambda: drop_last_reference(handle.pop("c")))

    return Workload(setup=(), make_threads=lambda: {"antagonist": antagonist(), "victim": victim()})
