"""``kvsim run``, ``kvsim validate-scenario`` and ``kvsim report``: a scenario file end to end."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvsim.errors import KvsimError


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="run a scenario file and write its results and report")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", help="output directory (default reports/<scenario name>)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario field, e.g. --set seed=3")
    run.add_argument("--json", action="store_true", help="print the results object to stdout")
    run.add_argument("--verify", action="store_true",
                     help="hw executor: sign every page and check every migrated page")
    run.add_argument("--record-trace", metavar="FILE.jsonl",
                     help="hw executor: write the calls it ran as an op trace")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(func=run_command)

    check = sub.add_parser("validate-scenario", help="check a scenario file without running it")
    check.add_argument("scenario", help="scenario YAML file (or a sweep file with a 'sweep:' block)")
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a scenario field, as kvsim run --set does")
    check.set_defaults(func=validate_command)

    report = sub.add_parser("report", help="redraw a results directory's report and figures")
    report.add_argument("results_dir", help="a directory kvsim run wrote (holds results.json)")
    report.set_defaults(func=report_command)


def run_command(args: argparse.Namespace) -> int:
    """``kvsim run``: everything is checked (the file, every variant, the presets, what the
    machine needs, the output directory) before the run starts; exit 2 on bad input, 1 when the
    run found invariant violations or failed calls the scenario does not expect, else 0."""
    from kvsim.output_dir import ReplacedDir
    from kvsim.report.results_dir import write_results_into
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.results import failed_calls, finite, public
    from kvsim.scenario.run import missing_requirement, run_scenario

    try:
        overrides = list(args.set) + (["hw.verify=true"] if getattr(args, "verify", False) else [])
        if getattr(args, "record_trace", None):
            overrides.append(f"hw.record_trace={args.record_trace}")
        sf = load_scenario_file(args.scenario, overrides)
        for scenario in (sf.base, *(s for _, s in sf.variants)):
            missing = missing_requirement(scenario)
            if missing:
                raise KvsimError(f"{args.scenario}: {missing}")
        if sf.base.hw.record_trace:
            from kvsim.traces.op_trace import check_trace_target

            check_trace_target(sf.base.hw.record_trace, "--record-trace")
        out = Path(args.out) if args.out else Path("reports") / sf.base.name
        target = ReplacedDir(out, "--out" if args.out else "the report directory")
    except KvsimError as e:
        print(f"kvsim run: {e}", file=sys.stderr)
        return 2
    scenario = sf.base
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim run: {m}", file=sys.stderr))
    say(f"{scenario.name} ({scenario.executor} executor"
        + (f", {len(scenario.variants)} variants)" if scenario.variants else ")"))
    try:
        with target as staging:
            results = run_scenario(sf, progress=say)
            if overrides:
                results["overrides"] = overrides
            write_results_into(results, staging)
    except KvsimError as e:
        print(f"kvsim run: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(finite({k: v for k, v in public(results).items() if k != "calls"}),
                         sort_keys=True, allow_nan=False))
    failed = failed_calls(results)
    unexpected = {api: n for api, n in failed.items() if api not in scenario.expect_failures}
    say(f"{len(results['calls'])} calls, {results['offload']['pages']} pages offloaded, "
        f"{len(results['violations'])} invariant violations, {len(results['deadlocks'])} "
        f"deadlocks; report in {out}/report.md")
    if unexpected:
        listed = ", ".join(f"{api} x{n}" for api, n in unexpected.items())
        print(f"kvsim run: {sum(unexpected.values())} call(s) failed that the scenario does not "
              f"expect ({listed}); see calls.csv (declare expected ones in expect_failures)",
              file=sys.stderr)
    return 1 if results["violations"] or unexpected else 0


def validate_command(args: argparse.Namespace) -> int:
    """Everything ``kvsim run`` checks before it starts, without running: the file, every
    variant, the presets, and what this machine needs. A file with a ``sweep:`` block is checked
    as a sweep (``kvsim sweep`` checks each point's scenario the same way)."""
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import missing_requirement
    from kvsim.scenario.source import load_yaml

    try:
        data, _ = load_yaml(args.scenario)
        if isinstance(data, dict) and "sweep" in data:
            from kvsim.sweep.points import sweep_points
            from kvsim.sweep.spec import load_sweep, load_sweep_scenario

            sweep = load_sweep(args.scenario, sets=args.set)
            points = sweep_points(sweep)
            for point in points:
                try:
                    load_sweep_scenario(point.scenario_file, point.overrides())
                except KvsimError as e:
                    raise KvsimError(f"sweep point {point.params_json}: {e}") from None
            print(f"{args.scenario}: ok: sweep {sweep.name}, {len(points)} points")
            return 0
        sf = load_scenario_file(args.scenario, args.set)
        for scenario in (sf.base, *(s for _, s in sf.variants)):
            missing = missing_requirement(scenario)
            if missing:
                raise KvsimError(f"{args.scenario}: valid, but cannot run on this machine: "
                                 f"{missing}")
    except KvsimError as e:
        print(f"kvsim validate-scenario: {e}", file=sys.stderr)
        return 2
    sc = sf.base
    print(f"{args.scenario}: ok: {sc.name}, executor {sc.executor}, workload {sc.workload.kind}, "
          f"{len(sc.manager.layers)} layers, {len(sc.manager.levels)} levels, "
          f"{len(sc.variants)} variants")
    return 0


def report_command(args: argparse.Namespace) -> int:
    from kvsim.report.scenario_report import write_report

    out = Path(args.results_dir)
    try:
        results = json.loads((out / "results.json").read_text())
        for vdir in sorted((out / "variants").glob("*/")) if (out / "variants").exists() else []:
            write_report(json.loads((vdir / "results.json").read_text()), vdir)
        write_report(results, out)
    except (OSError, json.JSONDecodeError, KeyError) as e:
        print(f"kvsim report: {out}: {e}", file=sys.stderr)
        return 2
    print(f"kvsim report: redrew {out}/report.md")
    return 0
