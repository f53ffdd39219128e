"""``kvsim calibrate``: measure this machine and write presets the simulator takes.

* ``--cpu`` (any machine): times the Python manager's calls and fits a CPU cost preset
  (:mod:`kvsim.calibration.cpu_fit`), writing the raw samples beside it.
* ``--copies MEASUREMENT.json`` (from ``python3 -m hw.bench_copy`` on the GPU): fits the copy model
  and writes a hardware JSON (:mod:`kvsim.calibration.copy_fit`, via ``tools/make_presets.py``'s
  rules), with the measurement file named as every figure's source.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from kvsim.calibration import cpu_fit, host_overhead


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine; write a CPU cost preset")
    p.add_argument("--out", default="reports/calibration", help="output directory")
    p.add_argument("--name", default=None, help="preset name (default kvsim-python-<host>)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim calibrate: {m}", file=sys.stderr))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    host = platform.node() or "host"
    name = args.name or f"kvsim-python-{host}"
    cases = cpu_fit.measure(args.repeats, progress=say)
    costs = cpu_fit.fit(cases)
    factor = cpu_fit.first_call_factor(cases)
    say("lock acquire/release and executor per-call overhead")
    lock = host_overhead.lock_costs()
    overhead = host_overhead.executor_call_overhead()
    samples_file = out / f"{name}-samples.json"
    rows = []
    for c in cases:
        pred = cpu_fit.predict_us(costs, c.counts)
        rows.append({"name": c.name, "role": c.role, "measured_us": c.seconds * 1e6,
                     "predicted_us": pred, "error_pct": (pred - c.seconds * 1e6) / (c.seconds * 1e6) * 100,
                     "counts": c.counts, "samples_s": c.samples,
                     "first_call_in_thread_us": c.thread_seconds * 1e6,
                     "first_call_in_thread_samples_s": c.thread_samples})
    samples_file.write_text(json.dumps({
        "what": "Python manager call times for the CPU cost model (kvsim.calibration.cpu_fit)",
        "timing": f"perf_counter around one call on a fresh manager, median of {args.repeats}; "
                  "again as the first call of a new thread (first_call_in_thread_us)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"node": host, "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "unit_costs_us": costs, "first_call_factor": factor, "cases": rows,
        "lock_acquire_release_us": lock, "executor_call_overhead_us": overhead}, indent=1) + "\n")
    preset_file = out / f"{name}.json"
    preset_file.write_text(json.dumps(cpu_fit.preset(costs, str(samples_file), name, overhead["us"],
                                                     factor), indent=1) + "\n")
    judged = [abs(r["error_pct"]) for r in rows if r["role"] == "judge"]
    print(json.dumps({"preset": str(preset_file), "samples": str(samples_file), "unit_costs_us": costs,
                      "python_call_us": overhead["us"], "first_call_factor": factor,
                      "lock_us": {m: v["us"] for m, v in lock.items()},
                      "judge_median_ape_pct": sorted(judged)[len(judged) // 2] if judged else None,
                      "judge_worst_ape_pct": max(judged) if judged else None}, sort_keys=True))
    return 0
