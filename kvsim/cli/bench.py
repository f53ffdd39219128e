"""``kvsim bench``: speed benchmarks (figures for notes, never tests).

    kvsim bench burst-resize [--runs 10] [--json] [--quiet]
    kvsim bench sim-scenarios [--runs 3] [--root REPO] [--json]

``sim-scenarios`` runs scenario files of the repository; it finds them next to the installed
package (a checkout or an editable install), else in the current directory, unless ``--root``
names the repository. Without ``--json`` both print a short human-readable summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCHMARKS = ("burst-resize", "sim-scenarios")
DEFAULT_RUNS = {"burst-resize": 10, "sim-scenarios": 3}


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="speed benchmarks (figures for notes, not tests)",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("name", help=f"benchmark name: {', '.join(BENCHMARKS)}")
    bench.add_argument("--root", type=Path, metavar="REPO",
                       help="sim-scenarios: the repository whose scenarios/ it runs (default: the "
                            "checkout kvsim is imported from, else the current directory)")
    bench.add_argument("--runs", type=int, metavar="N",
                       help="timed runs, median reported (default 10 for burst-resize, 3 for "
                            "sim-scenarios)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--quiet", action="store_true", help="burst-resize: no progress on stderr")
    bench.set_defaults(func=run)


def scenario_root(root: Path | None) -> Path:
    """The directory holding sim-scenarios' scenario files: ``root`` if given, else the
    repository the kvsim package sits in, else the current directory."""
    from kvsim.bench.sim_scenarios import SCENARIOS
    from kvsim.cli._common import REPO_ROOT
    from kvsim.errors import KvsimError

    def complete(d: Path) -> bool:
        return all((d / rel).is_file() for rel in SCENARIOS)

    if root is not None:
        if not complete(root):
            missing = next(rel for rel in SCENARIOS if not (root / rel).is_file())
            raise KvsimError(f"--root {root}: no {missing} there (give the kvsim repository)")
        return root
    for candidate in (REPO_ROOT, Path.cwd()):
        if complete(candidate):
            return candidate
    raise KvsimError(f"cannot find {SCENARIOS[0]} next to the kvsim package ({REPO_ROOT}) or in "
                     "the current directory; give --root REPO (a kvsim checkout)")


def _sim_summary(result: dict, root: Path) -> list[str]:
    lines = [f"sim-scenarios ({root}): {result['timing']}"]
    for rel, s in result["scenarios"].items():
        reused = f" ({s['variants_reused']} reused)" if s["variants_reused"] else ""
        lines.append(f"  {rel}: {s['runs_including_variants']} runs with variants{reused}, "
                     f"{s['wall_s']:.3f} s, {s['sim_events']} SimPy events, "
                     f"{s['events_per_s']:,.0f} events/s")
    return lines


def run(args: argparse.Namespace) -> int:
    from kvsim.errors import KvsimError

    if args.name not in BENCHMARKS:
        print(f"kvsim bench: unknown benchmark {args.name!r} (known: {', '.join(BENCHMARKS)})",
              file=sys.stderr)
        return 2
    runs = DEFAULT_RUNS[args.name] if args.runs is None else args.runs
    if runs < 1:
        print(f"kvsim bench: --runs {runs}: must be >= 1", file=sys.stderr)
        return 2
    if args.name == "sim-scenarios":
        from kvsim.bench import sim_scenarios

        try:
            root = scenario_root(args.root)
            result = sim_scenarios.run(root, runs=runs)
        except KvsimError as e:
            print(f"kvsim bench: {e}", file=sys.stderr)
            return 2
        print(json.dumps(result, sort_keys=True) if args.json
              else "\n".join(_sim_summary(result, root)))
        return 0
    from kvsim.bench import burst_resize

    progress = None if args.quiet or args.json else (lambda m: print(m, file=sys.stderr))
    result = burst_resize.run(runs=runs, progress=progress)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key in ("offloaded_pages", "offloaded_bytes", "median_ms", "stats_off_median_ms",
                    "no_eviction_median_ms", "per_page_stats_median_ms"):
            print(f"{key:>28}: {result[key]}")
    return 0
