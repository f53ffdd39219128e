"""``kvsim sweep`` and ``kvsim sweep-report``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvsim.errors import KvsimError


def add_backend_options(p: argparse.ArgumentParser) -> None:
    """--backend, --workers, --scheduler: where a sweep's points run (kvsim sweep, kvsim tiers)."""
    p.add_argument("--backend", choices=("local", "dask"), default="local",
                   help="where the points run: local processes (default) or a Dask cluster")
    p.add_argument("--workers", type=int, help="worker processes (default: CPU count)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="dask: an existing scheduler (default: a LocalCluster)")


def backend_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the backend options, or None."""
    if args.workers is not None and args.workers < 1:
        return "--workers must be >= 1"
    if args.scheduler and args.backend != "dask":
        return "--scheduler needs --backend dask"
    return None


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a scenario over a grid of parameters into one table",
                       description="Run SCENARIO once per point of a parameter grid (or a sample "
                       "of it) and write one table (Parquet and CSV) plus a capacity-planning "
                       "report. Without --param, the file's 'sweep:' block defines the sweep.")
    p.add_argument("scenario", help="scenario YAML file (may carry a 'sweep:' block)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a dotted scenario field and its values (YAML scalars), e.g. "
                        "--param sim.copy_path=auto,select; repeat for a grid")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fixed override for every point")
    p.add_argument("--sample", type=int, help="draw N points instead of the whole grid")
    p.add_argument("--method", choices=("grid", "random", "lhs"),
                   help="grid (every point; default without --sample), random or lhs "
                        "(default with --sample)")
    p.add_argument("--seed", type=int, help="sweep seed (default: the sweep block's, else 0)")
    add_backend_options(p)
    p.add_argument("--out", help="output directory (default reports/sweeps/<scenario name>)")
    p.add_argument("--csv", action="store_true",
                   help="also print the table as CSV on stdout (results.csv is always written)")
    p.add_argument("--latency-target-ms", type=float, help="for the report's cheapest configuration")
    p.add_argument("--no-report", action="store_true", help="write the table only")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)

    r = sub.add_parser("sweep-report", help="capacity-planning report from a sweep table")
    r.add_argument("table", help="results.parquet of a sweep")
    r.add_argument("--out", help="output directory (default: the table's)")
    r.add_argument("--latency-target-ms", type=float,
                   help="mark the cheapest configuration meeting this latency")
    r.add_argument("--latency-metric", help="the latency column for the Pareto view "
                   "(default: resize_copies_done_p50_ms, else resize_p50_ms, else probe_p99_ms)")
    r.add_argument("--cost", help="a numeric cost column (default: the rank of hardware preset "
                   "(cfg_hw_rank), then tier bytes)")
    r.add_argument("--quiet", action="store_true",
                   help="do not print the report's path on stderr")
    r.set_defaults(func=run_report)


def run(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim sweep: {m}", file=sys.stderr))
    problem = backend_problem(args)
    if problem:
        print(f"kvsim sweep: {problem}", file=sys.stderr)
        return 2
    try:
        from kvsim.sweep.runner import run_sweep
        from kvsim.sweep.spec import load_sweep

        sweep = load_sweep(args.scenario, args.param, args.set, args.method, args.sample, args.seed)
        outcome = run_sweep(sweep, args.out, args.backend, args.workers, args.scheduler,
                            progress=say, report=not args.no_report,
                            latency_target_ms=args.latency_target_ms)
    except (KvsimError, ImportError) as e:
        print(f"kvsim sweep: {e}", file=sys.stderr)
        return 2
    if args.csv:
        sys.stdout.write(outcome.table.to_csv(index=False, lineterminator="\n"))
    say(f"{outcome.points} points: {outcome.ran} run, {outcome.skipped} already done, "
        f"{outcome.failed} failed; table in {outcome.out_dir}/results.parquet"
        + (f", report in {outcome.report}" if outcome.report else ""))
    for err in outcome.errors[:5]:
        say(f"  error: {err}")
    return 1 if outcome.failed else 0


def run_report(args: argparse.Namespace) -> int:
    try:
        from kvsim.output_dir import open_output_dir
        from kvsim.sweep.report import write_sweep_report
        from kvsim.sweep.table import read_table

        table = read_table(args.table)
        out = open_output_dir(Path(args.out) if args.out else Path(args.table).parent,
                              "--out" if args.out else "the table's directory")
        path = write_sweep_report(table, out, latency_target_ms=args.latency_target_ms,
                                  latency_metric=args.latency_metric, cost=args.cost)
    except (KvsimError, ImportError, OSError, ValueError) as e:
        print(f"kvsim sweep-report: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"kvsim sweep-report: {path}", file=sys.stderr)
    return 0
