"""The ``kvsim`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.name == "sim-scenarios":
        from pathlib import Path

        from kvsim.bench import sim_scenarios

        print(json.dumps(sim_scenarios.run(Path(args.root), runs=args.runs if args.runs != 10 else 3),
                         sort_keys=True, indent=None if args.json else 1))
        return 0
    if args.name != "burst-resize":
        print(f"kvsim bench: unknown benchmark {args.name!r} (known: burst-resize, sim-scenarios)",
              file=sys.stderr)
        return 2
    from kvsim.bench import burst_resize

    progress = None if args.quiet or args.json else (lambda m: print(m, file=sys.stderr))
    result = burst_resize.run(runs=args.runs, progress=progress)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key in ("offloaded_pages", "offloaded_bytes", "median_ms", "stats_off_median_ms",
                    "no_eviction_median_ms", "per_page_stats_median_ms"):
            print(f"{key:>28}: {result[key]}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from kvsim.scenario.run import run_scenario_cli

    return run_scenario_cli(args)


def _cmd_validate_scenario(args: argparse.Namespace) -> int:
    """Everything ``kvsim run`` checks before it starts, without running: the file, every
    variant, the presets, and what this machine needs. A file with a ``sweep:`` block is checked
    as a sweep (``kvsim sweep`` checks each point's scenario the same way)."""
    from kvsim.errors import KvsimError
    from kvsim.scenario.run import load_scenario_file, missing_requirement
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


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="speed benchmarks (figures for notes, not tests)")
    bench.add_argument("name", help="benchmark name: burst-resize, sim-scenarios")
    bench.add_argument("--root", default=".", help="repository root (for sim-scenarios)")
    bench.add_argument("--runs", type=int, default=10)
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--quiet", action="store_true")
    bench.set_defaults(func=_cmd_bench)

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
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=_cmd_run)

    check = sub.add_parser("validate-scenario", help="check a scenario file without running it")
    check.add_argument("scenario")
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    check.set_defaults(func=_cmd_validate_scenario)

    report = sub.add_parser("report", help="redraw a results directory's report and figures")
    report.add_argument("results_dir")
    report.set_defaults(func=_cmd_report)

    from kvsim import cli_copy_model
    from kvsim.scenario import explore

    cli_copy_model.add_parser(sub)
    explore.add_parser(sub)
    from kvsim import cli_detect

    cli_detect.add_parser(sub)
    from kvsim import cli_replay

    cli_replay.add_parser(sub)
    from kvsim.sweep import cli as sweep_cli

    sweep_cli.add_parser(sub)  # kvsim sweep, kvsim sweep-report
    from kvsim.calibration import calibrate

    calibrate.add_parser(sub)
    from kvsim.calibration import validate

    validate.add_parser(sub)
    for command in sub.choices.values():  # so that a command's errors show its own usage
        command.set_defaults(_parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
