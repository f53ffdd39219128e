"""How fast the host ran during a set of GIL benchmark runs, against a CPU preset's timings.

A CPU preset's costs are timed once, single-threaded, in a minute of micro-cases; the host they
describe is a VM whose single-thread speed moves up to 2x between minutes of one device call
(reports/validation-h200/README.md). The GIL benchmark (:mod:`kvsim.calibration.gil_handover`)
runs hundreds of the CPU fit's own 4096-token probe per run, and where it is run between the
judged runs (tools/interleaved_runs.sh) it samples the minutes they ran in. The median of its
probe latencies over the runs, over what the preset prices that probe at (the executor's
per-call host cost plus the manager's work for its counts), is the **host speed factor**: a CPU
preset with ``host_speed_factor`` stretches every host cost by it when loaded
(:func:`kvsim.model.cpu_cost.load_cpu_model`). The median probe is one nobody interrupted, so the
GIL hand-over does not enter it.
"""

from __future__ import annotations

import numpy as np

from kvsim.calibration import gil_handover as gh
from kvsim.manager.plan import WorkCounts
from kvsim.model.cpu_cost import CpuCostModel, cpu_model_from_dict


def bench_probe_counts() -> WorkCounts:
    """The counted work of the benchmark's probe (every thread probes a committed prefix of
    ``BENCH_PROBE_TOKENS`` tokens, so all probes count the same)."""
    manager, fillers = gh.bench_manager()
    return manager.probe_reuse.with_plan(fillers[0][:gh.BENCH_PROBE_TOKENS]).plan.counts


def modelled_probe_s(cpu: CpuCostModel, counts: WorkCounts | None = None) -> float:
    """What ``cpu`` prices an uninterrupted benchmark probe at: the binding's Python on both
    sides plus the manager's work (``counts``: the probe's, :func:`bench_probe_counts`, made
    here when not given)."""
    return cpu.python_call_us * 1e-6 + cpu.seconds(bench_probe_counts() if counts is None else counts)


def unstretched(preset: dict, path) -> CpuCostModel:
    """A preset (its JSON ``dict``, from ``path``) loaded without its ``host_speed_factor``:
    the model :func:`factor` and :func:`call_spread` price the benchmark's probe with."""
    return cpu_model_from_dict({k: v for k, v in preset.items() if k != "host_speed_factor"}, path)


def probe_latencies(runs: dict[int, list[gh.HandoverRun]], needed_for: str) -> np.ndarray:
    """Every benchmark probe's latency in seconds; ValueError naming ``needed_for`` if none."""
    lat = np.array([end - start for rs in runs.values() for r in rs for _t, start, end in r.calls])
    if not lat.size:
        raise ValueError(f"no benchmark probes to take {needed_for} from")
    return lat


def measured_probe_s(runs: dict[int, list[gh.HandoverRun]]) -> float:
    return float(np.median(probe_latencies(runs, "the host's speed")))


def factor(cpu: CpuCostModel, runs: dict[int, list[gh.HandoverRun]]) -> dict:
    """The host speed factor of ``runs`` against ``cpu`` (loaded without a factor), with what it
    rests on."""
    if cpu.host_speed_factor != 1.0:
        raise ValueError(f"{cpu.name}: already stretched by a host speed factor; load it without")
    measured, modelled = measured_probe_s(runs), modelled_probe_s(cpu)
    return {"factor": measured / modelled, "measured_probe_median_ms": measured * 1e3,
            "modelled_probe_ms": modelled * 1e3,
            "probes": sum(len(r.calls) for rs in runs.values() for r in rs)}


def preset_field(speed: dict, source: str) -> dict:
    """The preset's ``host_speed_factor`` entry for :func:`factor`'s result."""
    return {"value": round(speed["factor"], 4),
            "source": f"{source}: kvsim.calibration.host_speed; median latency of the GIL "
                      f"benchmark's {speed['probes']} probes ({speed['measured_probe_median_ms']:.4f} ms) "
                      f"over the preset's price of that probe ({speed['modelled_probe_ms']:.4f} ms)"}


# Where the benchmark's probe-latency spread is tabulated; the top 0.1 % (where takeovers of the
# GIL lie) is cut at the 99.9th percentile.
SPREAD_PROBS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)


def call_spread(cpu: CpuCostModel, runs: dict[int, list[gh.HandoverRun]],
                upto_median_x: float | None = None) -> dict:
    """The preset's ``call_cpu_spread`` from benchmark ``runs``: how the probes' latencies spread
    around their median, as ratios of the manager call's CPU time (the simulator scales only
    that): a probe ``r`` times the median adds ``(r - 1)`` median probes, spread over the
    manager's share of the modelled probe (floored at 0.01). ``cpu`` loaded without a factor.

    ``upto_median_x``: probes slower than this many medians are left out first. Where the
    benchmark's threads contend, those are the probes another thread's GIL hold interrupted
    (the GIL fit counts probes over ``gil_fit.INTERRUPTED_OVER_MEDIAN`` medians as such): the
    simulator's GIL is the model of those, and left in they would be drawn again, at the
    benchmark's contention, in every call (concurrency call 5 and its what-if 8,
    reports/validation-h200/concurrency/README.md)."""
    lat = probe_latencies(runs, "the spread")
    median = np.median(lat)
    if upto_median_x is not None:
        if not upto_median_x > 1.0:
            raise ValueError(f"upto_median_x must be over 1 (median), got {upto_median_x}")
        lat = lat[lat <= upto_median_x * median]
    probs = np.array(SPREAD_PROBS)
    q = np.quantile(lat, np.minimum(probs, 0.999)) / median
    counts = bench_probe_counts()  # (builds the benchmark's manager: once)
    share = cpu.seconds(counts) / modelled_probe_s(cpu, counts)
    ratios = np.maximum(1.0 + (q - 1.0) / share, 0.01)
    return {"probs": list(SPREAD_PROBS), "ratios": [round(float(r), 4) for r in ratios],
            "probe_latency_over_median": [round(float(x), 4) for x in q],
            "manager_share_of_probe": round(share, 4), "probes": int(lat.size),
            "upto_median_x": upto_median_x}


def spread_field(spread: dict, source: str) -> dict:
    """The preset's ``call_cpu_spread`` entry for :func:`call_spread`'s result."""
    return {"value": {"probs": spread["probs"], "ratios": spread["ratios"]},
            "source": f"{source}: kvsim.calibration.host_speed.call_spread; the "
                      f"{spread['probes']} probe latencies over their median"
                      + ("" if spread.get("upto_median_x") is None else
                         f" (those over {spread['upto_median_x']:g} medians left out)")
                      + ", cut at the 99.9th "
                      f"percentile, as ratios of the manager's {spread['manager_share_of_probe']:.1%} "
                      "share of the modelled probe"}
