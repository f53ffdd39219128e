"""Add a CPU preset's ``call_cpu_spread`` from GIL benchmark runs (what-if 7; design S of
reports/validation-h200/concurrency/PROTOCOL-5.md; no shipped preset has it).

    python3 tools/call_spread_from_bench.py [--upto-median-x X] PRESET.json OUT.json BENCH.jsonl[.gz|.xz]...

Writes PRESET with ``call_cpu_spread`` (kvsim.calibration.host_speed.call_spread over the runs,
priced with PRESET as loaded without its host speed factor) to OUT, and prints the table.
``--upto-median-x X`` leaves out the probes over X medians first (the GIL's interruptions, where
the benchmark's threads contend: 3 is the GIL fit's own threshold). ``--judged``: the inputs are
judged runs' ``results.json[.xz]`` (tools/concurrency_validation_runs.sh's ``v/CASE/rN/``), whose
``probe_reuse`` calls stand in for the benchmark's probes (a fit set of cases, what-if 9).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvsim.calibration import gil_handover as gh
from kvsim.calibration import host_speed
from kvsim.calibration.packed import read_json


def judged_probes(results: dict) -> gh.HandoverRun:
    """A judged run's probes (``KVCacheManager.probe_reuse`` calls) as a benchmark run's."""
    return gh.HandoverRun([(c["thread"], c["start_ms"] / 1e3, (c["start_ms"] + c["latency_ms"]) / 1e3)
                           for c in results["calls"] if c["api"] == "KVCacheManager.probe_reuse"],
                          {})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("bench", nargs="+", help="GIL benchmark runs (.jsonl, .gz or .xz)")
    ap.add_argument("--judged", action="store_true",
                    help="the inputs are judged runs' results.json[.xz]: their probes count")
    ap.add_argument("--upto-median-x", type=float, default=None, metavar="X",
                    help="leave out the probes over X medians first (3: the GIL fit's threshold)")
    args = ap.parse_args(argv)
    if args.upto_median_x is not None and not args.upto_median_x > 1.0:
        ap.error(f"--upto-median-x: must be over 1 (the median), got {args.upto_median_x:g}")
    preset = json.loads(args.preset.read_text())
    if args.judged:
        runs = {0: [judged_probes(read_json(f)) for f in args.bench]}
    else:
        runs = gh.read_runs(args.bench)
    spread = host_speed.call_spread(host_speed.unstretched(preset, args.preset), runs,
                                    args.upto_median_x)
    preset["call_cpu_spread"] = host_speed.spread_field(spread, ", ".join(args.bench))
    args.out.write_text(json.dumps(preset, indent=1) + "\n")
    print(json.dumps(spread))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
