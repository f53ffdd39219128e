"""``kvsim bench``: speed benchmarks (figures for notes, never tests)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="speed benchmarks (figures for notes, not tests)")
    bench.add_argument("name", help="benchmark name: burst-resize, sim-scenarios")
    bench.add_argument("--root", default=".", help="repository root (for sim-scenarios)")
    bench.add_argument("--runs", type=int, default=10)
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--quiet", action="store_true")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
