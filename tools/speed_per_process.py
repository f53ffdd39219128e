"""Is a host's CPU speed a constant of the process? (issue 23, a diagnostic of the device hosts)

Two modes, one JSON line on stdout each:

* ``series``: twelve churn-loop speed probes in a row in this one process
  (:func:`kvsim.calibration.api_costs.speed_probe` at 100 iterations): does the speed drift
  within a process?
* ``run``: a probe, then gil_deadlock's fixed variant on the hardware executor with
  ``hw.copier=none`` (real threads, no GPU needed), then a probe: does a probe next to a run
  tell the run's own call speed (the antagonist's manager calls, timed by the executor)?

Used by reports/validation-h200/concurrency/README.md, "After call 12". Run from the repository
root: ``python tools/speed_per_process.py series|run``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvsim.calibration import api_costs  # noqa: E402

SCENARIO = ROOT / "scenarios" / "bugs" / "gil_deadlock.yaml"


def probe() -> dict:
    """The churn loop's medians, and their median over the methods (one number per probe)."""
    medians = api_costs.speed_probe(100, 10)
    return {"medians_us": medians, "all_methods_median_us": statistics.median(medians.values())}


def antagonist_call_us(result: dict) -> float:
    """The median manager-call time (``cpu_ms``, timed around the call) of the run's antagonist."""
    return statistics.median(c["cpu_ms"] * 1e3 for c in result["calls"]
                             if c.get("thread") == "antagonist")


def main(argv: list[str]) -> int:
    if argv not in (["series"], ["run"]):
        print("usage: python tools/speed_per_process.py series|run", file=sys.stderr)
        return 2
    out: dict = {"mode": argv[0], "unix_s": time.time()}
    if argv[0] == "series":
        out["probes"] = [probe() for _ in range(12)]
    else:
        from kvsim.scenario.load import load_scenario_file
        from kvsim.scenario.run import execute

        sf = load_scenario_file(SCENARIO, ["executor=hw", "hw.copier=none"])
        scenario = dict((v.name, s) for v, s in sf.variants)["fixed"]
        out["before"] = probe()
        out["run_antagonist_call_us"] = antagonist_call_us(execute(scenario))
        out["after"] = probe()
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
