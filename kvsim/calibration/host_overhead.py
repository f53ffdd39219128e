"""Host costs around a manager call on real threads, for the CPU cost preset.

* ``lock_costs``: the real lock (:class:`hw.rwlock.ThreadedSharedMutex`), uncontended, one thread:
  ``time.perf_counter`` around ``loops`` acquire+release pairs, divided by ``loops``; median of
  ``repeats`` such loops; shared and exclusive.
* ``executor_call_overhead``: the hardware executor (:class:`hw.executor.HwExecutor`, no copier)
  running one thread of cheap calls: a probe of a prefix shorter than a block (shared lock; the
  manager hashes nothing) and a resize to the capacity the cache already has (exclusive lock; the
  manager allocates nothing). Per call, the executor's latency (``perf_counter`` from call start to
  return) less the manager's own time (``perf_counter`` around the manager call, the figure the
  CPU model's unit costs describe) is what the executor adds: the lock's acquire and release, the
  call record, the plan's accounting. The median over all calls becomes the preset's
  ``python_call_us`` (spent holding the GIL, half before and half after the manager's work).

No GPU is needed: only host work is timed.
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.runtime.apis import LockMode


def lock_costs(loops: int = 2000, repeats: int = 7) -> dict[str, dict]:
    from hw.rwlock import ThreadedSharedMutex

    out = {}
    for mode in (LockMode.SHARED, LockMode.EXCLUSIVE):
        lock = ThreadedSharedMutex("writer")
        samples = []
        for _ in range(repeats):
            lock.log.clear()  # the log would grow with every pair
            gc.disable()
            try:
                t0 = time.perf_counter()
                for _ in range(loops):
                    lock.acquire("t", mode, "calibrate")
                    lock.release("t")
                samples.append((time.perf_counter() - t0) / loops)
            finally:
                gc.enable()
        out[mode.value] = {"us": statistics.median(samples) * 1e6,
                           "samples_us": [s * 1e6 for s in samples]}
    return out


def executor_call_overhead(calls: int = 400) -> dict:
    from hw.executor import HwExecutor, HwOptions, NullCopier
    from kvsim.runtime.apis import Api
    from kvsim.runtime.steps import Call

    config = ManagerConfig(layers=(LayerConfig(slot_bytes=(8192, 8192)),),
                           levels=(LevelConfig("gpu", 1024 * 16384), LevelConfig("host", 1024 * 16384)),
                           tokens_per_block=32)
    mgr = KVCacheManager(config)
    cache = mgr.create_kv_cache()
    assert cache.resume() and cache.resize(64)
    short = np.arange(16, dtype=np.uint32)  # under one block: nothing to hash

    def steps():
        for i in range(calls):
            if i % 2:
                yield Call("calibrate", Api.PROBE_REUSE, {"tokens": 16},
                           lambda: mgr.probe_reuse.with_plan(short))
            else:
                yield Call("calibrate", Api.RESIZE, {"capacity": 64},
                           lambda: cache.resize.with_plan(64))

    run = HwExecutor(mgr, NullCopier(), HwOptions(lock_policy="writer")).run({"calibrate": steps()})
    by_api: dict[str, list[float]] = {}
    for rec in run.calls[calls // 10:]:  # the first tenth warms the path up
        extra = (rec.end - rec.start) - rec.cpu_s - (rec.submit_s or 0.0)
        by_api.setdefault(rec.api, []).append(extra * 1e6)
    all_us = [v for vs in by_api.values() for v in vs]
    return {"us": statistics.median(all_us),
            "by_api_us": {api: statistics.median(vs) for api, vs in sorted(by_api.items())},
            "calls": len(all_us)}
