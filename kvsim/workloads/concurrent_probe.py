"""Concurrent probes during a background burst resize (the seed's concurrency tests).

Setup is the burst-resize setup: earlier requests fill the GPU tier with committed pages. Then
``probe_threads`` threads each call ``probe_reuse`` ``probes_per_thread`` times (closed loop, with
``probe_interval_us`` of think time between probes), probing the first ``probe_tokens`` tokens of
a filler request's committed tokens (thread i probes filler i mod fillers, so every probe walks
real tree nodes). At ``resize_start_us`` the ``resize`` thread grows the request, which holds the
manager lock exclusively while it evicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvsim.manager import KVCacheManager, ManagerConfig
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Sleep, Step, Until, Workload
from kvsim.validation import MAX_COUNT, MAX_THREADS, FloatRange, IntRange, schema
from kvsim.workloads import burst_resize


@schema
@dataclass(frozen=True)
class ConcurrentProbeWorkload:
    background: burst_resize.BurstResizeWorkload
    probe_threads: IntRange(1, MAX_THREADS) = 8
    probes_per_thread: IntRange(1, MAX_COUNT) = 500
    probe_interval_us: FloatRange(0.0, 1e9) = 0.0  # think time between one thread's probes
    probe_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) = 4096  # tokens per probe
    resize_start_us: FloatRange(0.0, 1e12) = 100.0  # when the background resize starts
    kind: Literal["concurrent_probe"] = "concurrent_probe"


def prober(manager: KVCacheManager, tokens: np.ndarray, count: int,
            interval_s: float) -> Iterator[Step]:
    # Token ids as the manager keeps them (uint32), converted once: the manager validates and
    # converts any other dtype on every call (5 % of a probe-heavy run).
    tokens = tokens.astype(np.uint32)
    for i in range(count):
        if i and interval_s:
            yield Sleep(interval_s)
        yield Call("probe", Api.PROBE_REUSE, {"tokens": int(tokens.size)},
                   lambda: manager.probe_reuse.with_plan(tokens), tokens)


def workload(config: ManagerConfig, spec: ConcurrentProbeWorkload, manager: KVCacheManager,
             seed: int) -> Workload:
    fillers: list[np.ndarray] = []
    base = burst_resize.workload(config, spec.background, manager, seed, fillers)

    def resize_thread(growth: Iterator[Step]) -> Iterator[Step]:
        yield Until(spec.resize_start_us * 1e-6)
        yield from growth

    def threads() -> dict[str, Iterator[Step]]:
        out: dict[str, Iterator[Step]] = {"resize": resize_thread(base.make_threads()["main"])}
        for i in range(spec.probe_threads):
            source = fillers[i % len(fillers)] if fillers else np.zeros(0, dtype=np.int64)
            out[f"probe{i}"] = prober(manager, source[: spec.probe_tokens],
                                       spec.probes_per_thread, spec.probe_interval_us * 1e-6)
        return out

    return Workload(setup=base.setup, make_threads=threads, holds=base.holds)
