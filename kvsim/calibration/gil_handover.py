"""How this machine hands the GIL between Python threads, for the simulator's GIL model.

CPython asks a GIL holder to let go after a waiter has waited a whole switch interval (5 ms)
without any switch. A holder that briefly drops the GIL on its own (numpy loops over more than
500 elements do, and a probe runs several) wakes one waiter each time and takes the GIL straight
back; the woken waiter restarts its interval, so that request rarely comes. Who gets the GIL is
then decided by races the operating system settles, and the only honest model is a measured one
(:class:`kvsim.sim.gil.Gil` with ``takeover_per_s``): each waiting thread takes the GIL from a
holder running Python at a constant rate, and the thread that starts the others at its own rate.

**The benchmark** (:func:`measure`): the hardware executor (real threads, the real lock, no
copier) runs ``threads`` threads of back-to-back ``probe_reuse`` calls on a manager filled with
committed prefixes. The executor starts them one at a time from the main thread, as in every
hardware run, and records when it called ``Thread.start()`` and when each thread first ran.

**The estimates** (:func:`estimate`), per run then pooled:

* *starter*: after thread k first runs, the main thread (woken from ``Thread.start()``) waits
  for the GIL to start thread k+1: ``wait = start_called[k+1] - began[k]``. A wait ends by a
  takeover, or because the holder finished (then it was cut short). Rate: takeovers over the
  sum of the waits (maximum likelihood for exponential waits, cut-short ones included).
* *workers*: a probe holds the GIL from start to end (the records show no gap between a
  thread's calls: no thread loses the GIL outside a call), so completions in time order, grouped
  into runs of one thread, are the GIL's holds. A hold that ends while its thread still has calls
  to make, with no ``Thread.start()`` in between, was taken over by a worker. Exposure: each
  hold's length times the number of other threads started (a new thread waits for the GIL from
  ``Thread.start()`` on) and not yet finished. Rate:
  takeovers over exposure.

Both come with a 90 % interval (Poisson counts). The same estimator applied to the simulator's
records of the same benchmark checks the model end to end (``tests/test_gil_handover.py``).
"""

from __future__ import annotations

import bisect
import math
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.workloads import burst_resize
from kvsim.workloads.concurrent_probe import prober
from kvsim.workloads.steps import Step

# The benchmark's shape: the probe is the CPU model's 4096-token fit probe, on the CPU fit's
# one-pool manager; the validation scenario it is judged on differs (8 threads, two 8 KiB x2 pool
# groups with a sliding window, a resize holding the lock meanwhile). The rates depend on the
# call: 2048-token probes were taken over ~4x as often per second (tools/gil_handover_shapes.py).
BENCH_THREADS = 6
BENCH_PROBES = 400
BENCH_PROBE_TOKENS = 4096
# Where the takeover-delay distribution is tabulated (the simulator interpolates between).
DELAY_PROBS = np.array([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95,
                        0.98, 0.99, 1.0])


@dataclass(frozen=True)
class HandoverRun:
    """One run's records: ``calls`` as (thread, start_s, end_s); ``thread_starts`` as
    thread -> (Thread.start() called, first ran), seconds on the calls' clock."""

    calls: list[tuple[str, float, float]]
    thread_starts: dict[str, tuple[float, float]]


def bench_manager(seed: int = 0) -> tuple[KVCacheManager, list[np.ndarray]]:
    """A manager whose GPU tier is half full of committed prefixes (nothing to evict)."""
    config = ManagerConfig(layers=(LayerConfig(slot_bytes=(16384,)),),
                           levels=(LevelConfig("gpu", 64 * 1024 * 1024),
                                   LevelConfig("host", 64 * 1024 * 1024)),
                           tokens_per_block=32)
    manager = KVCacheManager(config)
    fillers: list[np.ndarray] = []
    spec = burst_resize.BurstResizeWorkload(history_tokens=0, capacity_tokens=0, growth_steps=0,
                                            gpu_fill_fraction=0.5, filler_requests=4)
    for call in burst_resize.calls(config, spec, manager, seed, fillers):
        call.invoke()
    return manager, fillers


def bench_threads(manager: KVCacheManager, fillers: list[np.ndarray], threads: int,
                  probes: int, probe_tokens: int) -> dict[str, Iterator[Step]]:
    return {f"probe{i}": prober(manager, fillers[i % len(fillers)][:probe_tokens], probes, 0.0)
            for i in range(threads)}


def run_of(calls, thread_starts: dict[str, list[float]]) -> HandoverRun:
    """A :class:`HandoverRun` from an executor's call records and ``thread_starts``."""
    return HandoverRun([(c.thread, c.start, c.end) for c in calls if c.end is not None],
                       {t: (v[0], v[1]) for t, v in thread_starts.items() if len(v) > 1})


def measure(runs: int = 3, threads: int = BENCH_THREADS, probes: int = BENCH_PROBES,
            probe_tokens: int = BENCH_PROBE_TOKENS, progress=None) -> list[HandoverRun]:
    """``runs`` hardware-executor runs of the benchmark (no GPU needed), after one warm-up run."""
    from hw.executor import HwExecutor, HwOptions, NullCopier

    out = []
    for i in range(runs + 1):
        manager, fillers = bench_manager()
        run = HwExecutor(manager, NullCopier(), HwOptions(lock_policy="writer")).run(
            bench_threads(manager, fillers, threads, probes, probe_tokens))
        if run.errors:
            raise RuntimeError(f"GIL hand-over benchmark: {run.errors[0]}")
        if i:  # the first run warms the process up
            out.append(run_of(run.calls, run.thread_starts))
        if progress:
            progress(f"GIL hand-over run {i}/{runs}{' (warm-up)' if not i else ''}")
    return out


def thread_start_cost(samples: int = 50) -> dict:
    """``Thread.start()`` of a thread with nothing to do, uncontended: ``perf_counter`` around
    the call (it returns once the new thread has run); median of ``samples``."""
    times = []
    for _ in range(samples):
        t = threading.Thread(target=lambda: None)
        t0 = time.perf_counter()
        t.start()
        times.append(time.perf_counter() - t0)
        t.join()
    return {"us": statistics.median(times) * 1e6, "samples_us": [x * 1e6 for x in times]}


def _poisson_interval(count: int, exposure: float) -> tuple[float | None, float | None]:
    """A 90 % interval for a rate from ``count`` events over ``exposure`` (normal approximation
    on the square root, adequate from a handful of events)."""
    if exposure <= 0:
        return (None, None)
    lo = max(0.0, math.sqrt(count) - 0.8224) ** 2
    hi = (math.sqrt(count + 1) + 0.8224) ** 2
    return (lo / exposure, hi / exposure)


def _holds(calls: list[tuple[str, float, float]]) -> list[tuple[str, float, float, float]]:
    """(thread, from, to, first completion): runs of consecutive completions by one thread; a
    hold starts where the previous ended (or at its first call's start)."""
    out: list[list] = []
    for thread, start, end in sorted(calls, key=lambda c: (c[2], c[1])):
        if out and out[-1][0] == thread:
            out[-1][2] = end
        else:
            out.append([thread, max(start, out[-1][2]) if out else start, end, end])
    return [tuple(h) for h in out]


def _started_between(called: list[float], lo: float, hi: float) -> bool:
    """Whether a ``Thread.start()`` (``called``, sorted) fell in [lo, hi]: the starter held the
    GIL in between (and handed it to a waiter at random when it blocked)."""
    i = bisect.bisect_left(called, lo)
    return i < len(called) and called[i] <= hi


def estimate_one(run: HandoverRun) -> dict:
    """Counts and exposures of one run (see the module docstring)."""
    last_end: dict[str, float] = {}
    for thread, _s, end in run.calls:
        last_end[thread] = max(end, last_end.get(thread, end))
    holds = _holds(run.calls)
    completions = sorted((end, thread) for thread, _s, end in run.calls)
    ends = [c[0] for c in completions]

    def holder_ended_before(t: float) -> bool:
        """Whether the last call completed before ``t`` was its thread's last (the holder let
        go because it finished)."""
        i = int(np.searchsorted(ends, t, side="right")) - 1
        return i >= 0 and last_end[completions[i][1]] <= completions[i][0]

    starts = sorted(run.thread_starts.items(), key=lambda kv: kv[1][0])
    waits, starter_takeovers = [], 0
    for (_t, (_c, began)), (_n, (called_next, _b)) in zip(starts, starts[1:]):
        waits.append(max(0.0, called_next - began))
        # A wait that ended because the holder finished was cut short, not taken over.
        starter_takeovers += not holder_ended_before(called_next)
    called = sorted(v[0] for v in run.thread_starts.values())
    # A started thread waits for the GIL from Thread.start() on.
    alive_from = {t: v[0] for t, v in run.thread_starts.items()}
    # Takeovers and waiter exposure, split by how many other threads were live during the hold
    # (the rate need not be one per waiter: tools/gil_handover_shapes.py reports the split).
    by_waiters: dict[int, list] = {}
    for i, (thread, frm, to, _first) in enumerate(holds):
        others = [max(0.0, to - max(frm, a)) for t, a in alive_from.items()
                  if t != thread and last_end.get(t, -1.0) > to]
        row = by_waiters.setdefault(len(others), [0, 0.0])
        row[1] += sum(others)
        if i + 1 == len(holds) or last_end[thread] <= to:
            continue  # the thread ended: it let go
        if not _started_between(called, to, holds[i + 1][3]):  # else the starter took it
            row[0] += 1
    return {"starter_waits_s": waits, "starter_takeovers": starter_takeovers,
            "worker_takeovers": sum(n for n, _t in by_waiters.values()),
            "worker_exposure_s": sum(t for _n, t in by_waiters.values()), "holds": len(holds),
            "worker_waits": _worker_waits(holds, last_end, called), "by_waiters": by_waiters}


def _worker_waits(holds, last_end: dict[str, float],
                  called: list[float]) -> list[tuple[float, bool]]:
    """(seconds, taken over) for each time a worker lost the GIL mid-way and later got it back.

    The wait runs from the end of the thread's hold to the end of the hold before its next one.
    It ended by the thread's own takeover unless the hold before its return ended because that
    thread finished, or the starter ran in between (both hand the GIL to a waiter at random):
    then it was cut short (censored)."""
    out = []
    nxt: dict[str, int] = {}
    for i in range(len(holds) - 1, -1, -1):  # index of each hold's thread's next hold
        thread = holds[i][0]
        holds_next = nxt.get(thread)
        nxt[thread] = i
        if holds_next is None or last_end[thread] <= holds[i][2]:
            continue
        before = holds[holds_next - 1]
        wait = before[2] - holds[i][2]
        cut = last_end[before[0]] <= before[2] or \
            _started_between(called, before[2], holds[holds_next][3])
        out.append((wait, not cut))
    return out


def delay_quantiles(waits: list[tuple[float, bool]], probs: np.ndarray) -> list[float] | None:
    """Quantiles of the takeover delay from (wait, taken over) pairs: the Kaplan-Meier estimate
    (cut-short waits only tell that the delay was longer). Quantiles past the estimate's reach
    (the longest waits cut short) take the longest wait seen."""
    events = sorted(waits)
    if not any(e for _w, e in events):
        return None
    at_risk, surv, times, cdf = len(events), 1.0, [], []
    for w, taken in events:
        if taken:
            surv *= 1.0 - 1.0 / at_risk
            times.append(w)
            cdf.append(1.0 - surv)
        at_risk -= 1
    longest = events[-1][0]
    out = []
    for p in probs:
        k = int(np.searchsorted(cdf, p, side="left"))
        out.append(times[k] if k < len(times) else longest)
    return out


def estimate(runs: list[HandoverRun]) -> dict:
    """Pooled rates over ``runs``, with per-run figures and 90 % intervals."""
    per_run = [estimate_one(r) for r in runs]
    waits = [w for r in per_run for w in r["starter_waits_s"]]
    starter = sum(r["starter_takeovers"] for r in per_run)
    takeovers = sum(r["worker_takeovers"] for r in per_run)
    exposure = sum(r["worker_exposure_s"] for r in per_run)
    worker_waits = [w for r in per_run for w in r["worker_waits"]]
    by_waiters: dict[int, list] = {}
    for r in per_run:
        for w, (n, t) in r["by_waiters"].items():
            row = by_waiters.setdefault(w, [0, 0.0])
            row[0] += n
            row[1] += t
    quantiles = delay_quantiles(worker_waits, DELAY_PROBS)
    return {
        "worker_delay_probs": DELAY_PROBS.tolist(),
        "worker_delay_quantiles_ms": None if quantiles is None else [q * 1e3 for q in quantiles],
        "worker_waits": len(worker_waits),
        "worker_takeovers_by_waiters": {
            w: {"takeovers": n, "exposure_s": t, "per_s": n / t if t else None}
            for w, (n, t) in sorted(by_waiters.items())},
        "worker_waits_taken_over": sum(1 for _w, e in worker_waits if e),
        "worker_takeover_per_s": takeovers / exposure if exposure else None,
        "worker_takeover_interval_per_s": _poisson_interval(takeovers, exposure),
        "worker_takeovers": takeovers, "worker_exposure_s": exposure,
        "starter_takeover_per_s": starter / sum(waits) if sum(waits) > 0 else None,
        "starter_takeover_interval_per_s": _poisson_interval(starter, sum(waits)),
        "starter_takeovers": starter,
        "starter_waits_ms": [w * 1e3 for w in waits],
        "per_run": [{"worker_takeovers": r["worker_takeovers"],
                     "worker_exposure_s": r["worker_exposure_s"],
                     "worker_takeover_per_s": (r["worker_takeovers"] / r["worker_exposure_s"]
                                               if r["worker_exposure_s"] else None),
                     "holds": r["holds"], "starter_takeovers": r["starter_takeovers"],
                     "starter_waits_ms": [w * 1e3 for w in r["starter_waits_s"]]} for r in per_run],
    }


def simulate(cpu, runs: int = 3, threads: int = BENCH_THREADS, probes: int = BENCH_PROBES,
             probe_tokens: int = BENCH_PROBE_TOKENS, hardware: str = "h200-sxm",
             seed: int = 0) -> list[HandoverRun]:
    """The benchmark in the simulator with CPU preset ``cpu`` (seeds ``seed``, ``seed + 1``...)."""
    from kvsim.hardware import load_hardware
    from kvsim.sim.executor import SimExecutor, SimOptions

    hw = load_hardware(hardware)
    out = []
    for i in range(runs):
        manager, fillers = bench_manager()
        run = SimExecutor(manager, hw, cpu, SimOptions(lock_policy="writer", gil_seed=seed + i)).run(
            bench_threads(manager, fillers, threads, probes, probe_tokens))
        out.append(run_of(run.calls, run.thread_starts))
    return out
