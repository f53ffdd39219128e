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
from kvsim.model.cpu_cost import CpuCostModel


def bench_probe_counts() -> WorkCounts:
    """The counted work of the benchmark's probe (every thread probes a committed prefix of
    ``BENCH_PROBE_TOKENS`` tokens, so all probes count the same)."""
    manager, fillers = gh.bench_manager()
    return manager.probe_reuse.with_plan(fillers[0][:gh.BENCH_PROBE_TOKENS]).plan.counts


def modelled_probe_s(cpu: CpuCostModel) -> float:
    """What ``cpu`` prices an uninterrupted benchmark probe at: the binding's Python on both
    sides plus the manager's work."""
    return cpu.python_call_us * 1e-6 + cpu.seconds(bench_probe_counts())


def measured_probe_s(runs: dict[int, list[gh.HandoverRun]]) -> float:
    lat = [end - start for rs in runs.values() for r in rs for _t, start, end in r.calls]
    if not lat:
        raise ValueError("no benchmark probes to take the host's speed from")
    return float(np.median(lat))


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
