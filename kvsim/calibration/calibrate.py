"""``kvsim calibrate``: measure this machine and write presets the simulator takes.

* Always (any machine): times the Python manager's calls (:mod:`kvsim.calibration.cpu_fit`), the
  real lock and the hardware executor's per-call overhead (:mod:`kvsim.calibration.host_overhead`),
  how the GIL changes hands between threads and what ``Thread.start()`` costs
  (:mod:`kvsim.calibration.gil_handover`), and writes a CPU cost preset ``OUT/NAME.json`` with
  the raw samples beside it.
* ``--measure-copies`` (GPU machine): first runs the copy measurements into ``OUT``
  (``hw.bench_copy``, ``hw.bench_plan_copies``, ``hw.bench_link_wake``), then fits them as below.
* ``--copy-measurement FILE`` [``--plan-copies FILE``] [``--link-wake FILE``]
  [``--plan-batches FILE``] (any machine, files from those benchmarks): fits the copy model and
  writes the hardware JSON ``OUT/HARDWARE_NAME.json`` (:mod:`kvsim.calibration.hardware_json`)
  that scenarios take as ``hardware:``; every figure names its measurement file, and the file
  keeps the GPU, driver, CUDA and date it was measured with.

The command's options are in :mod:`kvsim.cli.calibration`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from kvsim.calibration import api_costs, cpu_fit, gil_handover, host_overhead
from kvsim.errors import KvsimError
from kvsim.output_dir import open_output_dir


def run(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim calibrate: {m}", file=sys.stderr))
    try:
        out = open_output_dir(args.out)
    except KvsimError as e:
        print(f"kvsim calibrate: {e}", file=sys.stderr)
        return 2
    host = platform.node() or "host"
    name = args.name or f"kvsim-python-{host}"
    if args.measure_copies:
        measured = _measure_copies(out, say, args.quick_copies)
        args.copy_measurement = args.copy_measurement or measured["copy"]
        args.plan_copies = args.plan_copies or measured["plan"]
        args.link_wake = args.link_wake or measured["wake"]
    hardware_file = None
    if args.copy_measurement:
        from kvsim.calibration.hardware_json import measured_preset

        hw_name = args.hardware_name or f"calibrated-{host}"
        say(f"fitting the copy model to {args.copy_measurement}")
        data = measured_preset(hw_name, f"Fitted by kvsim calibrate on {host} from "
                               f"{args.copy_measurement}", args.copy_measurement, args.plan_copies,
                               args.link_wake, args.plan_batches)
        hardware_file = out / f"{hw_name}.json"
        hardware_file.write_text(json.dumps(data, indent=1) + "\n")
    cases = cpu_fit.measure(args.repeats, progress=say)
    costs = cpu_fit.fit(cases)
    factor = cpu_fit.first_call_factor(cases)
    say("each method's fixed cost in a churn loop")
    churn = api_costs.measure()
    intercepts, round_us = api_costs.fit(churn, costs)
    say("lock acquire/release and executor per-call overhead")
    lock = host_overhead.lock_costs()
    overhead = host_overhead.executor_call_overhead()
    gil, gil_runs = None, {}
    probes = args.gil_probes
    if args.gil_runs > 0:
        for n in gil_handover.BENCH_THREAD_COUNTS:
            say(f"GIL hand-over: {args.gil_runs} runs of {n} threads x {probes} probes")
            gil_runs[n] = gil_handover.measure(args.gil_runs, threads=n, probes=probes,
                                               progress=say)
        gil = gil_handover.estimate([r for runs in gil_runs.values() for r in runs])
        gil["benchmark"] = {"thread_counts": list(gil_handover.BENCH_THREAD_COUNTS),
                            "probes_per_thread": probes,
                            "probe_tokens": gil_handover.BENCH_PROBE_TOKENS,
                            "runs_per_thread_count": args.gil_runs, "warm_up_runs": 1}
        gil["raw_runs"] = [{"threads": n, "calls": r.calls, "thread_starts": r.thread_starts}
                           for n, runs in gil_runs.items() for r in runs]
    start_cost = gil_handover.thread_start_cost()
    samples_file = out / f"{name}-samples.json"
    rows = []
    for c in cases:
        pred = cpu_fit.predict_us(costs, c.counts)
        rows.append({"name": c.name, "role": c.role, "measured_us": c.seconds * 1e6,
                     "predicted_us": pred, "error_pct": (pred - c.seconds * 1e6) / (c.seconds * 1e6) * 100,
                     "counts": c.counts, "samples_s": c.samples,
                     "first_call_in_thread_us": c.thread_seconds * 1e6,
                     "first_call_in_thread_samples_s": c.thread_samples})
    samples = {
        "what": "Python manager call times for the CPU cost model (kvsim.calibration.cpu_fit)",
        "timing": f"perf_counter around one call on a fresh manager, median of {args.repeats}; "
                  "again as the first call of a new thread (first_call_in_thread_us)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"node": host, "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "unit_costs_us": costs, "first_call_factor": factor, "cases": rows,
        "lock_acquire_release_us": lock, "executor_call_overhead_us": overhead,
        "gil_handover": gil, "thread_start_us": start_cost,
        "api_churn": {"timing": "perf_counter around each call of kvsim.calibration.api_costs' "
                                "churn loop (one thread, garbage collection on)",
                      "summary": api_costs.summary(churn), "api_call_us": intercepts,
                      "eviction_round_us": round_us,
                      "calls": [[c.api, round(c.seconds * 1e6, 3), c.counts["eviction_rounds"]]
                                for c in churn]}}
    samples_file.write_text(json.dumps(samples, indent=1) + "\n")
    preset_file = out / f"{name}.json"

    def write_preset() -> None:
        preset_file.write_text(json.dumps(cpu_fit.preset(
            costs, str(samples_file), name, overhead["us"], factor, gil, start_cost["us"],
            (intercepts, round_us)), indent=1) + "\n")

    write_preset()
    if gil is not None:
        from kvsim.calibration import host_speed
        from kvsim.model.cpu_cost import load_cpu_model

        gil["host_speed"] = host_speed.factor(load_cpu_model(preset_file), gil_runs)
        say(f"host speed over the GIL benchmark: x {gil['host_speed']['factor']:.3f} the CPU fit's")
        write_preset()
        samples_file.write_text(json.dumps(samples, indent=1) + "\n")
    if gil is not None and gil.get("hold_quantiles_ms") and not args.no_gil_fit:
        from kvsim.calibration import gil_fit

        say("GIL hand-over: fitting the model to the benchmark's probe latencies")
        try:
            result = gil_fit.fit(load_cpu_model(preset_file), gil_fit.estimated_handover(gil),
                                 gil_runs, progress=say,
                                 starter=gil_handover.starter_observations(gil))
        except gil_fit.FlatFitError as exc:  # the preset keeps the unfitted estimate, said
            say(str(exc))
            gil["fit_refused"] = str(exc)
        else:
            gil["fit"] = gil_fit.summary(result)
            write_preset()
        samples_file.write_text(json.dumps(samples, indent=1) + "\n")
    judged = [abs(r["error_pct"]) for r in rows if r["role"] == "judge"]
    print(json.dumps({"preset": str(preset_file), "samples": str(samples_file), "unit_costs_us": costs,
                      "hardware": None if hardware_file is None else str(hardware_file),
                      "python_call_us": overhead["us"], "first_call_factor": factor,
                      "lock_us": {m: v["us"] for m, v in lock.items()},
                      "gil_takeover_per_s_of_hold": (None if gil is None
                                                     else gil["worker_takeover_per_s"]),
                      "gil_fit": None if gil is None or "fit" not in gil else {
                          k: gil["fit"][k] for k in ("hold_scale", "waiter_exponent",
                                                     "recent_taker_share", "loss")},
                      "gil_starter_takeover_per_s": (
                          None if gil is None else gil.get("fit", gil)["starter_takeover_per_s"]),
                      "thread_start_us": start_cost["us"],
                      "api_call_us": intercepts, "eviction_round_us": round_us,
                      "judge_median_ape_pct": sorted(judged)[len(judged) // 2] if judged else None,
                      "judge_worst_ape_pct": max(judged) if judged else None}, sort_keys=True))
    return 0


def _measure_copies(out: Path, say, quick: bool = False) -> dict[str, str]:
    """Run the three copy benchmarks (GPU machine) into ``out``; the files they wrote."""
    from hw import bench_copy, bench_link_wake, bench_plan_copies

    before = set(out.glob("*.json"))
    for label, main, extra in (
            ("copy paths (hw.bench_copy)", bench_copy.main, ["--quick"] if quick else []),
            ("plan-shaped batches (hw.bench_plan_copies)", bench_plan_copies.main, []),
            ("first copy after idling (hw.bench_link_wake)", bench_link_wake.main,
             ["--idle-s", "0.1"] if quick else [])):
        say(f"measuring {label}")
        if main(["--out", str(out), *extra]) not in (0, None):
            raise SystemExit(f"kvsim calibrate: {label} failed")
    new = sorted(set(out.glob("*.json")) - before)

    def one(suffix: str) -> str:
        found = [p for p in new if p.name.endswith(suffix)] or sorted(out.glob(f"*{suffix}"))
        if not found:
            raise SystemExit(f"kvsim calibrate: no *{suffix} written in {out}")
        return str(found[-1])

    return {"copy": one("-copy-bench.json"), "plan": one("-plan-copies.json"),
            "wake": one("-link-wake.json")}
