"""Fit the simulator's GIL hand-over to the benchmark's probe latencies, by simulating it.

:mod:`kvsim.calibration.gil_handover` estimates the hold distribution and the waiter exponent
from call records, which miss hand-overs that complete no call: on the H200 host the simulator
with those estimates alone interrupted too many probes and kept them waiting too long
(reports/validation-h200/README.md). What a user of the model needs right is the probes'
latency: how many are interrupted and for how long. So three knobs are fitted to exactly that, on
the benchmark (the fit set; the validation scenario is judged apart):

* ``hold_scale``: the estimated hold distribution is stretched by it (more: fewer takeovers);
* ``waiter_exponent``: how the hold shortens with more waiters (set by how the interrupted share
  differs between the thread counts);
* ``recent_taker_share``: how often the waiter that lost the GIL last takes it over (more:
  an interrupted probe gets back sooner).

The starter's rate is given for one worker waiting and scaled by the same power of the waiters
as the holds, so at each point it is re-estimated at that point's exponent (from the starter's
waits, :func:`kvsim.calibration.gil_handover.starter_rate`); a rate estimated at another exponent
starts the threads at the wrong pace (on the H200 host, 1.7x too slowly at the fitted -1.2).

**Targets**, for each thread count measured: the share of probes *interrupted* (latency over
3x the median of that thread count's probes) and the median latency of those. **Loss**: the sum
of squared log ratios simulated/measured. **Search**: a grid over the three knobs, every point
simulated (about 30,000 probes per thread count, as many per thread as the measured runs made;
worker processes share the points), the least loss wins. The response is too noisy and too far
from linear for steps from point to point: a shorter hold means more takeovers but shorter
waits, so fewer probes cross the threshold. Every simulation is seeded, so a fit is repeatable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvsim.calibration import gil_handover as gh
from kvsim.model.handover import Handover

INTERRUPTED_OVER_MEDIAN = 3.0


@dataclass(frozen=True)
class LatencyTargets:
    """One thread count's probes: how many, the share interrupted, their median latency (s)."""

    probes: int
    interrupted_share: float
    interrupted_median_s: float


def targets(runs: list[gh.HandoverRun]) -> LatencyTargets:
    lat = np.array([end - start for r in runs for _t, start, end in r.calls])
    if not len(lat):
        raise ValueError("no probe calls to fit the GIL hand-over to")
    slow = lat[lat > INTERRUPTED_OVER_MEDIAN * np.median(lat)]
    return LatencyTargets(len(lat), len(slow) / len(lat),
                          float(np.median(slow)) if len(slow) else 0.0)


def loss(sim: dict[int, LatencyTargets], meas: dict[int, LatencyTargets]) -> float:
    total = 0.0
    for n, m in meas.items():
        s = sim[n]
        for a, b in ((s.interrupted_share, m.interrupted_share),
                     (s.interrupted_median_s, m.interrupted_median_s)):
            total += math.log(max(a, 1e-9) / max(b, 1e-9)) ** 2
    return total


def estimated_handover(estimate: dict) -> Handover:
    """The hand-over :func:`kvsim.calibration.gil_handover.estimate` gives, before the fit."""
    return Handover(hold=(tuple(estimate["hold_probs"]),
                          tuple(q * 1e-3 for q in estimate["hold_quantiles_ms"])),
                    waiter_exponent=estimate["waiter_exponent"],
                    starter_takeover_per_s=estimate["starter_takeover_per_s"] or 0.0)


# The grid searched (every point simulated; the least loss wins).
GRID_SHARES = (0.0, 0.3, 0.6)
GRID_EXPONENTS = (-1.6, -1.2, -0.8, -0.4, 0.0)
GRID_SCALES = (0.5, 0.7, 1.0, 1.4)
SIM_PROBES = 30000  # simulated probes per thread count and grid point


Starter = tuple[list[tuple[float, int]], int]  # (seconds, workers waiting) waits, takeovers


def _with_knobs(estimated: Handover, share: float, exponent: float, scale: float,
                starter: Starter | None) -> Handover:
    probs, holds = estimated.hold
    rate = estimated.starter_takeover_per_s if starter is None else \
        gh.starter_rate(*starter, exponent) or 0.0
    return replace(estimated, hold=(probs, tuple(h * scale for h in holds)),
                   waiter_exponent=exponent, recent_taker_share=share,
                   starter_takeover_per_s=rate)


def _evaluate(args: tuple) -> dict:
    cpu, estimated, point, probes_per_thread, sim_probes, starter = args
    share, exponent, scale = point
    model = replace(cpu, gil_handover=_with_knobs(estimated, share, exponent, scale, starter))
    sim = {}
    for n, probes in probes_per_thread.items():
        runs = max(1, math.ceil(sim_probes / (n * probes)))
        sim[n] = targets(gh.simulate(model, runs, threads=n, probes=probes, seed=1000 * n))
    return {"recent_taker_share": share, "waiter_exponent": exponent, "hold_scale": scale,
            "simulated": {n: vars(t) for n, t in sim.items()}}


def fit(cpu, estimated: Handover, measured: dict[int, list[gh.HandoverRun]],
        shares: tuple[float, ...] | None = None, exponents: tuple[float, ...] | None = None,
        scales: tuple[float, ...] | None = None, sim_probes: int | None = None,
        processes: int | None = None, progress: Callable[[str], None] | None = None,
        starter: Starter | None = None) -> dict:
    """Fit ``recent_taker_share``, ``waiter_exponent`` and ``hold_scale`` of ``estimated`` (on
    CPU preset ``cpu``) to ``measured`` benchmark runs, keyed by their thread count, over the
    grid, ``sim_probes`` simulated probes per thread count and point (``processes`` worker
    processes, default one per CPU; 1: none). ``starter``: the starter's waits and takeovers
    (:func:`kvsim.calibration.gil_handover.starter_observations`), its rate re-estimated at each
    point's exponent; None keeps ``estimated``'s rate. Returns the fitted :class:`Handover`
    and every grid point."""
    import contextlib
    import multiprocessing
    import os

    shares = GRID_SHARES if shares is None else shares  # (read here: tests may narrow them)
    exponents = GRID_EXPONENTS if exponents is None else exponents
    scales = GRID_SCALES if scales is None else scales
    sim_probes = SIM_PROBES if sim_probes is None else sim_probes
    meas = {n: targets(r) for n, r in sorted(measured.items())}
    # The benchmark simulated as it was measured: as many probes per thread.
    probes_per_thread = {n: gh.probes_per_thread(measured[n]) for n in meas}
    points = [(sh, ex, sc) for sh in shares for ex in exponents for sc in scales]
    jobs = [(cpu, estimated, p, probes_per_thread, sim_probes, starter) for p in points]
    processes = processes or min(len(points), os.cpu_count() or 1)
    evaluations = []
    with contextlib.ExitStack() as stack:
        if processes > 1:
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(processes))
            rows = pool.imap(_evaluate, jobs)
        else:
            rows = map(_evaluate, jobs)
        for row in rows:
            sim = {n: LatencyTargets(**t) for n, t in row["simulated"].items()}
            row["loss"] = loss(sim, meas)
            evaluations.append(row)
            if progress:
                progress(f"GIL fit {len(evaluations)}/{len(points)}: taker share "
                         f"{row['recent_taker_share']:.1f}, waiter exponent "
                         f"{row['waiter_exponent']:+.1f}, hold scale {row['hold_scale']:.1f}: "
                         f"loss {row['loss']:.4f}")
    if is_flat(evaluations):
        raise FlatFitError(
            f"GIL fit refused: every one of the {len(evaluations)} grid points gives the same loss "
            f"({evaluations[0]['loss']:.4f}), so the benchmark runs do not constrain the hand-over "
            f"(the estimate's median hold: {_median_hold_ms(estimated):.3f} ms); measure the "
            "benchmark again, or keep the estimate unfitted")
    best = min(evaluations, key=lambda r: r["loss"])
    fitted = _with_knobs(estimated, best["recent_taker_share"], best["waiter_exponent"],
                         best["hold_scale"], starter)
    return {"handover": fitted, "hold_scale": best["hold_scale"],
            "waiter_exponent": best["waiter_exponent"],
            "recent_taker_share": best["recent_taker_share"],
            "starter_takeover_per_s": fitted.starter_takeover_per_s, "loss": best["loss"],
            "measured": {n: vars(t) for n, t in meas.items()}, "simulated": best["simulated"],
            "simulated_probes_per_thread_count": sim_probes,
            "probes_per_thread": probes_per_thread, "evaluations": evaluations}


def _median_hold_ms(h: Handover) -> float:
    probs, seconds = h.hold
    return float(np.interp(0.5, probs, seconds)) * 1e3


class FlatFitError(ValueError):
    """The grid's losses are all equal: nothing was fitted (the best point would be the first)."""


def is_flat(evaluations: list[dict]) -> bool:
    """Whether more than one grid point was evaluated and all gave the same loss (to 1e-9
    relative): then the least loss picks the grid's first point, not a fit."""
    losses = [r["loss"] for r in evaluations]
    return len(losses) > 1 and max(losses) - min(losses) <= 1e-9 * max(1.0, abs(max(losses)))


def summary(result: dict) -> dict:
    """:func:`fit`'s result as JSON (the hand-over itself goes into the preset)."""
    return {k: v for k, v in result.items() if k != "handover"}
