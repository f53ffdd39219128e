"""How this machine hands the GIL between Python threads, for the simulator's GIL model.

CPython asks a GIL holder to let go after a waiter has waited a whole switch interval (5 ms)
without any switch. A holder that briefly drops the GIL on its own (numpy loops over more than
500 elements do, and a probe runs several) wakes one waiter each time and takes the GIL straight
back; the woken waiter restarts its interval, so that request rarely comes. Who gets the GIL is
then decided by races the operating system settles, and the only honest model is a measured one
(:class:`kvsim.sim.gil.Handover`): how long a holder keeps the GIL while workers wait, how that
depends on how many wait, and who takes it over.

**The benchmark** (:func:`measure`): the hardware executor (real threads, the real lock, no
copier) runs ``threads`` threads of back-to-back ``probe_reuse`` calls on a manager filled with
committed prefixes. The executor starts them one at a time from the main thread, as in every
hardware run, and records when it called ``Thread.start()`` and when each thread first ran.

**The estimates** (:func:`estimate`), per run then pooled:

* *starter*: after thread k first runs, the main thread (woken from ``Thread.start()``) waits
  for the GIL to start thread k+1: ``wait = start_called[k+1] - began[k]``. A wait ends by a
  takeover, or because the holder finished (then it was cut short). It races like one more
  waiter (below): rate, for one worker waiting, takeovers over the sum of ``wait * n ** g``
  (maximum likelihood for exponential waits, cut-short ones included).
* *holds*: a probe holds the GIL from start to end (the records show no gap between a thread's
  calls: no thread loses the GIL outside a call), so completions in time order, grouped into
  runs of one thread, are the GIL's holds. A hold is timed from its first completion to the
  next hold's first completion (both lie one part-call after the hand-over, so the offsets
  cancel on average), from when another worker was started if that came later. It ended by a
  worker's takeover if its thread still had calls to make and no ``Thread.start()`` came in
  between; else it was cut short (censored). ``n``: the other workers started and not finished.
* *waiter exponent* ``g``: the takeover hazard taken as ``rate * n ** g``; ``g`` maximises the
  profile likelihood of exponential holds over the holds (0: one race at a time, whoever waits;
  1: each waiter races on its own).
* *hold distribution*: the Kaplan-Meier estimate over the holds scaled to one waiter
  (``length * n ** g``), censoring included.

Call records only show hand-overs that complete a call, so quick back-and-forth hand-overs are
missed and these estimates are biased; :mod:`kvsim.calibration.gil_fit` corrects the hold
distribution's scale and fits who takes the GIL over by simulating this same benchmark.
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

from kvsim.calibration.gil_bench_size import (  # noqa: F401 (kept where callers look)
    BENCH_PROBE_TOKENS,
    BENCH_PROBES,
    BENCH_THREAD_COUNTS,
    BENCH_THREADS,
)
from kvsim.calibration.packed import read_lines
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.runtime.steps import Step
from kvsim.workloads import burst_resize
from kvsim.workloads.concurrent_probe import prober

# Where the hold distribution is tabulated (the simulator interpolates between).
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


def probes_per_thread(runs: list[HandoverRun]) -> int:
    """How many probes each thread of ``runs`` made: the benchmark gives every thread the same
    number, which a simulation of it must repeat (ValueError if the runs disagree)."""
    counts: set[int] = set()
    for run in runs:
        per_thread = dict.fromkeys(run.thread_starts, 0)
        for thread, _s, _e in run.calls:
            per_thread[thread] = per_thread.get(thread, 0) + 1
        counts.update(per_thread.values())
    if len(counts) != 1:
        raise ValueError(f"GIL benchmark runs whose threads made different numbers of probes: "
                         f"{sorted(counts)}")
    return counts.pop()


def run_of(calls, thread_starts: dict[str, list[float]]) -> HandoverRun:
    """A :class:`HandoverRun` from an executor's call records and ``thread_starts``."""
    return HandoverRun([(c.thread, c.start, c.end) for c in calls if c.end is not None],
                       {t: (v[0], v[1]) for t, v in thread_starts.items() if len(v) > 1})


def runs_from_json(raw: list[dict]) -> dict[int, list[HandoverRun]]:
    """Raw benchmark runs as kept in calibration samples or written by tools/gil_bench_runs.py
    (``{"threads", "calls", "thread_starts"}``; without "threads": the thread count started),
    by thread count."""
    out: dict[int, list[HandoverRun]] = {}
    for r in raw:
        starts = {t: (v[0], v[1]) for t, v in r["thread_starts"].items()}
        out.setdefault(int(r.get("threads", len(starts))), []).append(
            HandoverRun([(c[0], c[1], c[2]) for c in r["calls"]], starts))
    return dict(sorted(out.items()))


def read_runs(files) -> dict[int, list[HandoverRun]]:
    """:func:`runs_from_json` of every run in benchmark files (tools/gil_bench_runs.py's JSONL,
    plain, ``.gz`` or ``.xz``), by thread count."""
    return runs_from_json([run for f in files for run in read_lines(f)])


def measure(runs: int = 3, threads: int = BENCH_THREADS, probes: int = BENCH_PROBES,
            probe_tokens: int = BENCH_PROBE_TOKENS, progress=None,
            warm_up: bool = True) -> list[HandoverRun]:
    """``runs`` hardware-executor runs of the benchmark (no GPU needed), after one warm-up run
    (``warm_up=False``: none, for a process that has warmed up already)."""
    from hw.executor import HwExecutor, HwOptions, NullCopier

    out = []
    for i in range(0 if warm_up else 1, runs + 1):
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


def _holds(calls: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """(thread, last completion, first completion): runs of consecutive completions by one
    thread."""
    out: list[list] = []
    for thread, _start, end in sorted(calls, key=lambda c: (c[2], c[1])):
        if out and out[-1][0] == thread:
            out[-1][1] = end
        else:
            out.append([thread, end, end])
    return [tuple(h) for h in out]


def _started_between(called: list[float], lo: float, hi: float) -> bool:
    """Whether a ``Thread.start()`` (``called``, sorted) fell in [lo, hi]: the starter held the
    GIL in between (and handed it to a waiter at random when it blocked)."""
    i = bisect.bisect_left(called, lo)
    return i < len(called) and called[i] <= hi


def estimate_one(run: HandoverRun) -> dict:
    """The starter's waits and the holds of one run (see the module docstring)."""
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
    for k, ((_t, (_c, began)), (_n, (called_next, _b))) in enumerate(zip(starts, starts[1:])):
        # The workers waiting meanwhile: those started and not finished, but for the holder.
        live = sum(1 for t, _v in starts[:k + 1] if last_end.get(t, -1.0) > began)
        waits.append((max(0.0, called_next - began), max(live - 1, 1)))
        # A wait that ended because the holder finished was cut short, not taken over.
        starter_takeovers += not holder_ended_before(called_next)
    called = sorted(v[0] for v in run.thread_starts.values())
    # A started thread waits for the GIL from Thread.start() on.
    alive_from = {t: v[0] for t, v in run.thread_starts.items()}
    hold_rows = []  # (seconds, other workers live, taken over by a worker)
    for (thread, to, first), (_next, _to, next_first) in zip(holds, holds[1:]):
        others = [a for t, a in alive_from.items() if t != thread and last_end.get(t, -1.0) > to]
        begin = max([first, min(others)]) if others else None
        if begin is None or begin >= next_first:
            continue
        taken = last_end[thread] > to and not _started_between(called, to, next_first)
        hold_rows.append((next_first - begin, len(others), taken))
    return {"starter_waits_s": waits, "starter_takeovers": starter_takeovers,
            "holds": hold_rows}


def km_quantiles(waits: list[tuple[float, bool]], probs: np.ndarray) -> list[float] | None:
    """Quantiles of a duration from (seconds, ended by the event) pairs: the Kaplan-Meier estimate
    (cut-short ones only tell that it was longer). Quantiles past the estimate's reach
    (the longest ones cut short) take the longest seen."""
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


EXPONENT_GRID = np.round(np.arange(-1.0, 2.0001, 0.05), 2)  # where waiter_exponent looks


def waiter_exponent(holds: list[tuple[float, int, bool]],
                    grid: np.ndarray = EXPONENT_GRID) -> float:
    """``g`` maximising the profile log-likelihood of exponential holds with hazard
    ``rate * n ** g`` over (seconds, n, taken over) rows, g from -1 to 2; 0 without takeovers."""
    t = np.array([h[0] for h in holds])
    n = np.array([h[1] for h in holds], dtype=float)
    d = np.array([h[2] for h in holds], dtype=float)
    if not d.sum():
        return 0.0
    best, best_ll = 0.0, -math.inf
    for g in grid:
        exposure = float(np.sum(t * n ** g))
        ll = d.sum() * math.log(d.sum() / exposure) + g * float(np.sum(d * np.log(n))) - d.sum()
        if ll > best_ll + 1e-12:
            best, best_ll = float(g), ll
    return best


def starter_exposure(waits: list[tuple[float, int]], exponent: float) -> float:
    """Seconds of starter waiting, each (seconds, workers waiting) wait weighted by
    ``n ** exponent``: what the starter's takeovers are counted over."""
    return sum(w * n ** exponent for w, n in waits)


def starter_rate(waits: list[tuple[float, int]], takeovers: int, exponent: float) -> float | None:
    """The starter's takeover rate for one worker waiting, by maximum likelihood for exponential
    waits with hazard ``rate * n ** exponent`` over (seconds, workers waiting) ``waits``, cut-short
    ones included: ``takeovers`` over the waits' exposure. The simulator scales the rate by the
    same power of the waiters (:class:`kvsim.sim.gil.Handover`), so it must be estimated at the
    exponent the model uses, the fitted one where the exponent is fitted."""
    exposure = starter_exposure(waits, exponent)
    return takeovers / exposure if exposure > 0 else None


def starter_observations(estimate: dict) -> tuple[list[tuple[float, int]], int]:
    """(seconds, workers waiting) of every starter wait and the takeovers among them, from an
    :func:`estimate`: what :func:`starter_rate` needs at another exponent."""
    return [(ms * 1e-3, int(n)) for ms, n in estimate["starter_waits_ms"]], estimate["starter_takeovers"]


def estimate(runs: list[HandoverRun]) -> dict:
    """Pooled estimates over ``runs``, with per-run figures and 90 % intervals."""
    per_run = [estimate_one(r) for r in runs]
    starter = sum(r["starter_takeovers"] for r in per_run)
    holds = [h for r in per_run for h in r["holds"]]
    g = waiter_exponent(holds)
    # The starter races like one more waiter: its rate is given for one worker waiting.
    waits = [(w, n) for r in per_run for w, n in r["starter_waits_s"]]
    exposure = starter_exposure(waits, g)
    quantiles = km_quantiles([(t * n ** g, taken) for t, n, taken in holds], DELAY_PROBS)
    by_waiters: dict[int, list] = {}
    for t, n, taken in holds:
        row = by_waiters.setdefault(n, [0, 0.0])
        row[0] += taken
        row[1] += t
    takeovers = sum(1 for h in holds if h[2])
    hold_s = sum(h[0] for h in holds)
    return {
        "hold_probs": DELAY_PROBS.tolist(),
        "hold_quantiles_ms": None if quantiles is None else [q * 1e3 for q in quantiles],
        "waiter_exponent": g,
        "holds": len(holds), "worker_takeovers": takeovers, "hold_s": hold_s,
        "worker_takeover_per_s": takeovers / hold_s if hold_s else None,
        "worker_takeover_interval_per_s": _poisson_interval(takeovers, hold_s),
        "holds_by_waiters": {
            n: {"takeovers": k, "hold_s": t, "per_s": k / t if t else None}
            for n, (k, t) in sorted(by_waiters.items())},
        "starter_takeover_per_s": starter_rate(waits, starter, g),
        "starter_takeover_interval_per_s": _poisson_interval(starter, exposure),
        "starter_takeovers": starter,
        # (ms, workers waiting): the fit re-estimates the starter's rate at its exponent
        "starter_waits_ms": [[w * 1e3, n] for w, n in waits],
        "per_run": [{"holds": len(r["holds"]),
                     "worker_takeovers": sum(1 for h in r["holds"] if h[2]),
                     "starter_takeovers": r["starter_takeovers"],
                     "starter_waits_ms": [w * 1e3 for w, _n in r["starter_waits_s"]]}
                    for r in per_run],
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
