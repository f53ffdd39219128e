"""Benchmark: host-side time of the manager's burst ``resize()`` on the seed's workload.

What it moves: 6380 pages of 16 KiB from the GPU tier to the host tier (as a plan; no copies run).
How it is timed: ``time.perf_counter`` around the ``resize()`` call alone, on a freshly built
manager each run (building and filling the tiers is not timed); median over ``runs``.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

from kvsim.bench.seed_workload import SeedWorkload


def _time_resize(workload: SeedWorkload, runs: int,
                 progress: Callable[[str], None] | None) -> tuple[list[float], dict]:
    samples_ms: list[float] = []
    plan_info: dict = {}
    for i in range(runs):
        mgr, _request, (burst,) = workload.build()
        t0 = time.perf_counter()
        outcome = burst.invoke()
        t1 = time.perf_counter()
        if not outcome.ok:
            raise RuntimeError("the burst resize failed: the workload is misconfigured")
        samples_ms.append((t1 - t0) * 1e3)
        plan = outcome.plan
        plan_info = {
            "offloaded_pages": plan.offloaded_pages,
            "offloaded_bytes": plan.offloaded_bytes,
            "allocated_pages": plan.counts.pages_allocated,
            "stats_commits": plan.counts.stats_commits,
            "stats_scan_units": plan.counts.stats_scan_units,
        }
        if progress is not None:
            progress(f"run {i + 1}/{runs}: {samples_ms[-1]:.3f} ms")
    return samples_ms, plan_info


def run(runs: int = 10, include_per_page: bool = True,
        progress: Callable[[str], None] | None = None) -> dict:
    """Time the seed workload's resize; returns the JSON-ready result."""
    after = SeedWorkload()
    samples, info = _time_resize(after, runs, progress)
    no_evict_samples, no_evict_info = _time_resize(SeedWorkload(fill_gpu=False), runs, progress)
    out = {
        "benchmark": "burst_resize",
        "what": "KvCache.resize(capacity=200001, history_length=200000) on a full GPU tier: "
                "6380 pages of 16 KiB offloaded gpu->host (plan only)",
        "timing": f"perf_counter around resize() alone, fresh manager per run, median of {runs}",
        **info,
        "median_ms": statistics.median(samples),
        "samples_ms": samples,
        "stats_off_median_ms": statistics.median(
            _time_resize(SeedWorkload(enable_stats=False), runs, progress)[0]),
        "no_eviction_median_ms": statistics.median(no_evict_samples),
        "no_eviction_offloaded_pages": no_evict_info["offloaded_pages"],
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processor": platform.machine(),
        },
    }
    if include_per_page:
        per_page = SeedWorkload(stats_commit="per_page")
        pp_samples, pp_info = _time_resize(per_page, runs, progress)
        out["per_page_stats_median_ms"] = statistics.median(pp_samples)
        out["per_page_stats_commits"] = pp_info["stats_commits"]
    return out
