"""Burst-resize workload: earlier requests fill the GPU tier, then one request grows.

Setup: ``filler_requests`` requests commit distinct random tokens and close, leaving
``gpu_fill_fraction`` of the GPU tier full of committed, droppable (evictable) pages. Then the
request under study resumes and grows to ``capacity_tokens`` with history ``history_tokens`` in
``growth_steps`` resize calls (1 = one burst, as in the seed).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsim.manager import KvCache, KVCacheManager, ManagerConfig, Outcome
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Workload
from kvsim.validation import FloatRange, IntRange, schema


@schema
@dataclass(frozen=True)
class BurstResizeWorkload:
    history_tokens: IntRange(0, MAX_SEQUENCE_TOKENS)
    capacity_tokens: IntRange(0, MAX_SEQUENCE_TOKENS) | None = None  # default history + 1
    growth_steps: IntRange(1, 100_000) = 1  # resize calls to reach the target (1: a burst)
    gpu_fill_fraction: FloatRange(0.0, 1.0) = 1.0  # GPU filled by earlier requests
    filler_requests: IntRange(1, 100_000) = 4
    kind: Literal["burst_resize"] = "burst_resize"

    def __post_init__(self) -> None:
        if self.capacity_tokens is None:
            object.__setattr__(self, "capacity_tokens",
                               min(self.history_tokens + 1, MAX_SEQUENCE_TOKENS))


def _fill_tokens(config: ManagerConfig, manager: KVCacheManager, fraction: float) -> int:
    """Tokens of committed history that fill ``fraction`` of the GPU tier's smallest group."""
    layout = manager.layout
    blocks = min(
        slots // len(pg.life_cycles)
        for slots, pg in zip(layout.level_slots[0], layout.pool_groups)
    )
    return int(math.floor(blocks * fraction)) * config.tokens_per_block


def _lifetime(manager: KVCacheManager, handle: dict[str, KvCache], phase: str, cache_id: str,
              capacity: int, history: int | None, tokens: np.ndarray | None,
              close: bool) -> Iterator[Call]:
    """create -> resume [-> resize] [-> commit] [-> commit_pending_stats -> close] for one
    request; ``handle["c"]``."""

    def create() -> Outcome:
        outcome = manager.create_kv_cache.with_plan(cache_id=cache_id)
        handle["c"] = outcome.value
        return outcome

    yield Call(phase, Api.CREATE_KV_CACHE, {"cache_id": cache_id}, create)
    yield Call(phase, Api.RESUME, {"cache_id": cache_id}, lambda: handle["c"].resume.with_plan())
    if capacity:
        args = {"cache_id": cache_id, "capacity": capacity, "history_length": history}
        yield Call(phase, Api.RESIZE, args,
                   lambda: handle["c"].resize.with_plan(capacity, history))
    if tokens is not None:
        yield Call(phase, Api.COMMIT, {"cache_id": cache_id, "tokens": int(tokens.size)},
                   lambda: handle["c"].commit.with_plan(tokens), tokens)
    if close:
        # close() drops statistics not yet published, as in KVCM2: publish them first.
        yield Call(phase, Api.COMMIT_PENDING_STATS, {"cache_id": cache_id},
                   lambda: handle["c"].commit_pending_stats.with_plan())
        yield Call(phase, Api.CLOSE, {"cache_id": cache_id}, lambda: handle["c"].close.with_plan())


def calls(config: ManagerConfig, workload: BurstResizeWorkload, manager: KVCacheManager,
          seed: int, filler_tokens: list[np.ndarray] | None = None,
          request: dict[str, KvCache] | None = None) -> Iterator[Call]:
    """The workload's calls, in order; each is invoked before the next is generated.

    ``filler_tokens``, if given, receives each filler's committed tokens (for probes);
    ``request``, if given, receives the request under study (``request["c"]``).
    """
    rng = np.random.default_rng(seed)
    tpb = config.tokens_per_block
    total = _fill_tokens(config, manager, workload.gpu_fill_fraction)
    per_filler = total // workload.filler_requests // tpb * tpb
    for i in range(workload.filler_requests if per_filler else 0):
        tokens = rng.integers(0, 2**31, size=per_filler, dtype=np.int64)
        if filler_tokens is not None:
            filler_tokens.append(tokens)
        yield from _lifetime(manager, {}, "setup", f"filler{i}", per_filler, None, tokens, True)
    request = {} if request is None else request
    yield from _lifetime(manager, request, "setup", "request", 0, None, None, False)
    steps = workload.growth_steps
    for s in range(1, steps + 1):
        capacity = workload.capacity_tokens * s // steps
        history = workload.history_tokens * s // steps
        yield Call("growth", Api.RESIZE,
                   {"cache_id": "request", "capacity": capacity, "history_length": history},
                   lambda c=capacity, h=history: request["c"].resize.with_plan(c, h))


def workload(config: ManagerConfig, spec: BurstResizeWorkload, manager: KVCacheManager,
             seed: int, filler_tokens: list[np.ndarray] | None = None) -> Workload:
    """Setup (fillers, the request resumed) untimed; the growth on one thread, ``main``. The
    request stays open to the end of the run."""
    request: dict[str, KvCache] = {}
    setup, growth = _split(calls(config, spec, manager, seed, filler_tokens, request))
    return Workload(setup=setup, make_threads=lambda: {"main": growth}, holds=(request,))


def _split(stream: Iterator[Call]) -> tuple[Iterator[Call], Iterator[Call]]:
    """Setup calls are consumed (and invoked) by the caller before growth calls are generated."""
    growth: list[Call] = []

    def setup() -> Iterator[Call]:
        for call in stream:
            if call.phase == "growth":
                growth.append(call)
                growth.extend(stream)
                return
            yield call

    def grow() -> Iterator[Call]:
        yield from growth

    return setup(), grow()
