"""Benchmark: wall time of simulated scenarios, and simulated events per second.

What it runs: ``scenarios/seed/h100_pcie_burst_resize.yaml`` (the run as written plus its five
variants) and ``scenarios/concurrency/probe_during_resize.yaml`` (plus its two variants).
How it is timed: ``time.perf_counter`` around ``run_scenario`` (building the manager state, the
untimed setup calls and the SimPy run; not writing the report), median of ``runs``. Events are
the SimPy events the runs processed: a variant whose results were reused (the same run as one
before it, :func:`kvsim.scenario.run.run_scenario`) processed none.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import run_scenario

SCENARIOS = ("scenarios/seed/h100_pcie_burst_resize.yaml",
             "scenarios/concurrency/probe_during_resize.yaml")


def run(root: Path, runs: int = 3) -> dict:
    out: dict = {"benchmark": "sim_scenarios", "timing": f"perf_counter around run_scenario, "
                 f"median of {runs}", "scenarios": {}}
    for rel in SCENARIOS:
        sf = load_scenario_file(root / rel)
        walls, events = [], 0
        for _ in range(runs):
            t0 = time.perf_counter()
            results = run_scenario(sf)
            walls.append(time.perf_counter() - t0)
            variants = results.get("_variant_results", {}).values()
            reused = sum(1 for v in variants if "_reused_from" in v)
            events = results["sim"]["events"] + sum(
                v["sim"]["events"] for v in variants if "_reused_from" not in v)
        wall = statistics.median(walls)
        out["scenarios"][rel] = {"runs_including_variants": 1 + len(sf.base.variants),
                                 "variants_reused": reused,
                                 "wall_s": wall, "samples_s": walls, "sim_events": events,
                                 "events_per_s": events / wall}
    return out
