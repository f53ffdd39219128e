"""``kvsim tiers``: sweep host and disk KV-tier sizes (and links) for a serving scenario, and
report what they buy in hit rate, TTFT and GPU time (:mod:`kvsim.sweep.tiers`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvsim.cli.replay_cache import parse_capacities
from kvsim.errors import KvsimError
from kvsim.sweep.cli import add_backend_options, backend_problem


def parse_tokens(text: str) -> list[int]:
    """``"0,2M,8M"``: token counts with decimal k/M/G suffixes; 0 means no such tier."""
    items = [t.strip() for t in text.split(",")]
    nonzero = [t for t in items if t != "0"]
    parsed = iter(parse_capacities(",".join(nonzero))) if nonzero else iter(())
    return [0 if t == "0" else next(parsed) for t in items]


def parse_names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tiers", help="what a host or disk KV tier buys a serving engine: TTFT, hit rate, GPU time",
        description="Run a serving scenario (workload.kind: serving) once per host-tier size, "
        "disk-tier size and hardware preset, and write a report: hit rate, TTFT p50/p99, GPU "
        "seconds saved against tier size, the break-even of onboarding, and a recommendation.")
    p.add_argument("scenario", help="a serving scenario YAML file (its GPU tier is kept)")
    p.add_argument("--host-tokens", type=parse_tokens, default=[0], metavar="N[,N...]",
                   help="host-tier sizes in tokens of the scenario's architecture, e.g. 0,2M,8M "
                        "(0: no host tier; default 0)")
    p.add_argument("--disk-tokens", type=parse_tokens, default=[0], metavar="N[,N...]",
                   help="disk-tier sizes in tokens (needs --disk; combined with host sizes "
                        "other than 0; default 0)")
    p.add_argument("--disk", type=parse_names, default=[], metavar="NAME[,NAME...]",
                   help="disk drive presets (kvsim/hardware/disks/), e.g. micron-9550-gen5")
    p.add_argument("--drives", type=int, default=1, help="drives striped together (default 1)")
    p.add_argument("--hardware", type=parse_names, default=[], metavar="NAME[,NAME...]",
                   help="hardware presets (their CPU-GPU links; default: the scenario's)")
    add_backend_options(p)
    p.add_argument("--out", help="output directory (default reports/tiers/<scenario name>)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim tiers: {m}", file=sys.stderr))
    problem = "--drives must be >= 1" if args.drives < 1 else backend_problem(args)
    if problem:
        print(f"kvsim tiers: {problem}", file=sys.stderr)
        return 2
    try:
        from kvsim.output_dir import open_output_dir
        from kvsim.sweep.runner import run_sweep
        from kvsim.sweep.tiers import median_prompt_tokens, plan_of, tier_sweep, write_tier_report

        plan = plan_of(args.scenario)
        out = open_output_dir(Path(args.out) if args.out else Path("reports") / "tiers" / plan.name,
                              "--out" if args.out else "the tiers directory")
        sweep = tier_sweep(plan, out, args.host_tokens, args.disk_tokens, args.hardware,
                           args.disk, args.drives)
        t0 = time.perf_counter()
        outcome = run_sweep(sweep, out, args.backend, args.workers, args.scheduler,
                            progress=say, report=False)
        wall = time.perf_counter() - t0
        report = write_tier_report(outcome.table, outcome.out_dir, plan,
                                   median_prompt_tokens(plan), wall)
    except (KvsimError, ImportError) as e:
        print(f"kvsim tiers: {e}", file=sys.stderr)
        return 2
    say(f"{outcome.points} points ({outcome.ran} run, {outcome.skipped} already done, "
        f"{outcome.failed} failed) in {wall:.0f} s; report in {report}")
    for err in outcome.errors[:5]:
        say(f"  error: {err}")
    return 1 if outcome.failed else 0
