"""A scenario's manager calls on real threads against the simulator's price for them, per API.

CPU only (no GPU): runs a scenario variant ``--runs`` times on the hardware executor with
``hw.copier=none`` (real threads, the real lock, the Python manager timed with ``perf_counter``
around each call as the hardware executor always times it, no copies) and once on the simulator
with ``--cpu-model`` (a CPU preset; to compare like with like, one calibrated on this machine:
``kvsim calibrate --gil-runs 0 --out DIR``). Per (thread, API, whether the call offloaded): the
calls and the median ``cpu_ms`` on each side, and their ratio, with the measured calls' median
thread CPU time. A ratio far from 1 where thread CPU and time agree is a call the CPU cost model
prices wrong on this machine; where the thread CPU is well below the time, the thread waited
inside the call (for the GIL), which the simulator models outside the call's price.

With ``--measured CASE_DIR`` the measured side is a concurrency call's runs of that case
(``CASE_DIR/rN/results.json[.xz]``, e.g. ``measured-11/v/gil_deadlock.fixed``) instead of runs
here: then ``--cpu-model`` should be that call's preset (calibrated on its host).

    python3 tools/call_price_check.py SCENARIO.yaml --cpu-model PRESET [--variant NAME] \\
        [--runs 3 | --measured CASE_DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def by_api(calls: list[dict], field: str = "cpu_ms") -> dict[tuple[str, str, bool], list[float]]:
    """Each call's ``field`` in us, grouped by (thread, API, offloaded any pages). ``field``
    "thread_cpu_ms": the hardware executor's thread CPU time in the call
    (:func:`kvsim.calibration.packed.thread_cpu_ms`, slim or full results); calls without it
    are left out."""
    from kvsim.calibration.packed import thread_cpu_ms

    out: dict[tuple[str, str, bool], list[float]] = defaultdict(list)
    for c in calls:
        ms = thread_cpu_ms(c) if field == "thread_cpu_ms" else c[field]
        if ms is not None:
            out[(c["thread"], c["api"], bool(c.get("offloaded_pages")))].append(ms * 1e3)
    return out


def table(measured: dict, predicted: dict, on_cpu: dict | None = None) -> list[dict]:
    """One row per group on either side: calls and median us of each, measured/predicted, and
    (with ``on_cpu``, :func:`by_api` of thread CPU) the measured calls' median thread CPU: where
    it is well below their time, the thread waited inside the call (for the GIL), which the
    simulator puts outside the call's price."""
    rows = []
    for key in sorted(set(measured) | set(predicted)):
        m, p = measured.get(key, []), predicted.get(key, [])
        c = (on_cpu or {}).get(key, [])
        mm = statistics.median(m) if m else None
        pm = statistics.median(p) if p else None
        rows.append({"thread": key[0], "api": key[1], "offloads": key[2],
                     "measured_calls": len(m), "measured_median_us": mm,
                     "measured_thread_cpu_median_us": statistics.median(c) if c else None,
                     "predicted_calls": len(p), "predicted_median_us": pm,
                     "ratio": mm / pm if mm and pm else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--cpu-model", required=True, help="CPU preset name or file for the simulator")
    ap.add_argument("--variant", default=None, help="a variant of the scenario (default: its base)")
    ap.add_argument("--runs", type=int, default=3, help="hardware-executor runs (seeds 0..N-1)")
    ap.add_argument("--measured", type=Path, help="a concurrency call's runs of this case")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs: at least 1, got {args.runs}")

    from kvsim.calibration.packed import first_existing, read_json
    from kvsim.errors import KvsimError
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import execute

    preset = args.cpu_model
    if Path(preset).suffix == ".json":  # a file: absolute, as scenario files resolve theirs
        preset = str(Path(preset).resolve())

    def scenario(sets: list[str]):
        sf = load_scenario_file(args.scenario, sets)
        if args.variant is None:
            return sf.base
        named = dict((v.name, s) for v, s in sf.variants)
        if args.variant not in named:
            raise SystemExit(f"{args.scenario}: no variant {args.variant!r} "
                             f"(variants: {', '.join(named) or 'none'})")
        return named[args.variant]

    try:
        predicted_run = scenario([f"cpu_model={preset}"])
        hw_runs = [] if args.measured else [
            scenario(["executor=hw", "hw.copier=none", f"seed={s}"]) for s in range(args.runs)]
        files = [] if not args.measured else [
            first_existing(d, "results.json") for d in sorted(args.measured.glob("r*"))]
        if args.measured and (not files or not all(files)):
            raise KvsimError(f"{args.measured}: no rN/results.json[.xz] in every run directory")
        results = [read_json(f) for f in files] + [execute(run) for run in hw_runs]
    except (KvsimError, OSError, ValueError) as e:
        print(f"call_price_check.py: {e}", file=sys.stderr)
        return 2
    measured: dict = defaultdict(list)
    on_cpu: dict = defaultdict(list)
    for result in results:
        for key, us in by_api(result["calls"]).items():
            measured[key] += us
        for key, us in by_api(result["calls"], "thread_cpu_ms").items():
            on_cpu[key] += us
    predicted = by_api(execute(predicted_run)["calls"])
    rows = table(measured, predicted, on_cpu)
    print("| thread | API | offloads | measured calls | measured median us | its thread CPU us | "
          "predicted calls | predicted median us | measured / predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def f(x):
            return "-" if x is None else f"{x:.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"| {r['thread']} | {r['api']} | {'yes' if r['offloads'] else 'no'} | "
              f"{r['measured_calls']} | {f(r['measured_median_us'])} | "
              f"{f(r['measured_thread_cpu_median_us'])} | {r['predicted_calls']} | "
              f"{f(r['predicted_median_us'])} | {ratio} |")
    if args.out:
        args.out.write_text(json.dumps({"what": __doc__.split("\n")[0],
                                        "scenario": str(args.scenario), "variant": args.variant,
                                        "cpu_model": args.cpu_model,
                                        "measured": (str(args.measured) if args.measured
                                                     else f"{args.runs} runs here"),
                                        "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
