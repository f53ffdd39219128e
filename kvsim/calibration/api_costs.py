"""Each manager method's own fixed cost, timed in a workload's steady state.

:mod:`kvsim.calibration.cpu_fit` fits one intercept (``per_call_us``) and the unit costs over
big burst resizes, probes and commits. Small calls of other methods cost more than that
intercept: on real threads a resume, close or capacity change in a churning workload takes 2-7x
it (``tools/call_price_check.py``; reports/validation-h200/concurrency/README.md, "After call
11"). This measures them where they happen.

What it times: a churn loop on one thread, as the hardware executor times a call
(``time.perf_counter`` around the plan-returning call, garbage collection left on as in a run):
create a cache, resume it, resize it to ``CHURN_TOKENS``, commit them (fresh tokens: new
blocks), close it; on a GPU tier that fills after ``CHURN_GPU_PAGES / 4`` requests, after which
every resize evicts the oldest closed requests' pages to the host tier (which drops its own).
After ``warm_up`` iterations (the code's first runs), ``iterations`` more are recorded, each call
with its plan's counts: the resizes before the tier fills are the ones that do not evict.

What it fits (:func:`fit`), given the unit costs from ``cpu_fit``: each method's intercept is the
median over its calls of (time less the unit costs of its counts), floored at 0
(``api_call_us``); a resize that evicts also pays ``eviction_rounds`` times a per-round cost,
the median over evicting resizes of (their residual less the non-evicting resizes' intercept)
per round (``unit_us.eviction_rounds``).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kvsim.calibration.cpu_fit import UNITS, _config
from kvsim.manager import KVCacheManager


@dataclass(frozen=True)
class ChurnCall:
    """One timed call of the churn loop: the method, its seconds and its plan's counts."""

    api: str
    seconds: float
    counts: dict[str, int]


# One request's tokens (2 blocks of 32, two life cycles: 4 pages) against a GPU tier of 256
# pages: it fills after 64 requests, so the recorded resizes are ~54 that allocate and ~246
# that evict.
CHURN_TOKENS = 64
CHURN_GPU_PAGES = 256
CHURN_HOST_PAGES = 1024


def measure(iterations: int = 300, warm_up: int = 10) -> list[ChurnCall]:
    """The churn loop (module docstring); ``iterations`` recorded after ``warm_up``."""
    if iterations < 1 or warm_up < 0:
        raise ValueError(f"iterations >= 1 and warm_up >= 0, got {iterations}, {warm_up}")
    mgr = KVCacheManager(_config(CHURN_GPU_PAGES, CHURN_HOST_PAGES))
    calls: list[ChurnCall] = []

    def timed(api: str, fn, keep: bool):
        t0 = time.perf_counter()
        outcome = fn()
        seconds = time.perf_counter() - t0
        if not outcome.plan.ok:
            raise RuntimeError(f"churn loop: {api} failed: {outcome.error}")
        if keep:
            counts = outcome.plan.counts
            calls.append(ChurnCall(api, seconds, {u: getattr(counts, u) for u in (
                *UNITS, "eviction_rounds")}))
        return outcome.value

    base = 10**6
    for i in range(warm_up + iterations):
        keep = i >= warm_up
        tokens = np.arange(base + i * CHURN_TOKENS, base + (i + 1) * CHURN_TOKENS, dtype=np.uint32)
        cache = timed("KVCacheManager.create_kv_cache", mgr.create_kv_cache.with_plan, keep)
        timed("KvCache.resume", cache.resume.with_plan, keep)
        timed("KvCache.resize", lambda c=cache: c.resize.with_plan(CHURN_TOKENS), keep)
        timed("KvCache.commit", lambda c=cache, t=tokens: c.commit.with_plan(t), keep)
        timed("KvCache.close", cache.close.with_plan, keep)
    return calls


def fit(calls: list[ChurnCall], unit_us: dict[str, float]) -> tuple[dict[str, float], float]:
    """(``api_call_us`` per method, the per-round eviction cost in us) from ``calls`` and the
    unit costs ``unit_us`` (:func:`kvsim.calibration.cpu_fit.fit`'s, per_call_us aside)."""
    residual: dict[str, list[float]] = defaultdict(list)
    evicting: list[tuple[float, int]] = []
    for c in calls:
        us = c.seconds * 1e6 - sum(unit_us.get(u, 0.0) * c.counts.get(u, 0) for u in UNITS)
        rounds = c.counts.get("eviction_rounds", 0)
        if c.api == "KvCache.resize" and rounds:
            evicting.append((us, rounds))
        else:
            residual[c.api].append(us)
    intercepts = {api: max(0.0, statistics.median(v)) for api, v in sorted(residual.items())}
    per_round = 0.0
    if evicting and "KvCache.resize" in intercepts:
        base = intercepts["KvCache.resize"]
        per_round = max(0.0, statistics.median((us - base) / n for us, n in evicting))
    elif evicting:  # every resize evicted: the intercept is theirs, no per-round split
        intercepts["KvCache.resize"] = max(0.0, statistics.median(us for us, _ in evicting))
    return intercepts, per_round


def summary(calls: list[ChurnCall]) -> dict:
    """Per method: calls, median and p90 microseconds (for the samples file and the log)."""
    by: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        key = c.api + (" (evicting)" if c.counts.get("eviction_rounds") else "")
        by[key].append(c.seconds * 1e6)
    return {k: {"calls": len(v), "median_us": statistics.median(v),
                "p90_us": float(np.percentile(v, 90))} for k, v in sorted(by.items())}


def speed_probe(iterations: int = 300, warm_up: int = 10) -> dict[str, float]:
    """The churn loop's median microseconds per method (:func:`summary`'s keys): a process's
    speed, as the calibration's own churn loop measured the calibrating process's."""
    return {k: v["median_us"] for k, v in summary(measure(iterations, warm_up)).items()}


def reference_medians(data: dict, where: str) -> dict[str, float]:
    """The churn medians of a calibration samples file (its ``api_churn.summary``) or of a
    :func:`speed_probe` file (``{"medians_us": {...}}``); ``where`` names the file in errors."""
    summary_ = (data.get("api_churn") or {}).get("summary") if isinstance(data, dict) else None
    if isinstance(summary_, dict):
        medians = {k: v.get("median_us") if isinstance(v, dict) else None
                   for k, v in summary_.items()}
    elif isinstance(data, dict) and isinstance(data.get("medians_us"), dict):
        medians = dict(data["medians_us"])
    else:
        raise ValueError(f"{where}: neither a calibration samples file with api_churn.summary "
                         "nor a speed probe with medians_us")
    bad = [k for k, v in medians.items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0]
    if bad or not medians:
        raise ValueError(f"{where}: churn medians must be positive numbers; "
                         f"{', '.join(sorted(bad)) or 'none given'}")
    return {k: float(v) for k, v in medians.items()}


def speed_ratio(probes: list[dict[str, float]], reference: dict[str, float]) -> float:
    """How much slower (> 1) or faster (< 1) the probed process ran than the reference: the
    median over the methods both have of (the probes' mean median / the reference's)."""
    common = sorted(set(reference).intersection(*probes)) if probes else []
    if not common:
        raise ValueError("speed_ratio: no method in both the probes and the reference")
    return statistics.median(statistics.fmean(p[k] for p in probes) / reference[k]
                             for k in common)
