"""``kvsim replay-cache``: prefix-cache hit rate against capacity (Mooncake's Fig. 9 replay).

    kvsim replay-cache TRACE --format mooncake --capacity-tokens 1M,3M,10M [--tokens-per-block 512]
                       [--engine lru|manager] [--json] [--out DIR] [--skip-bad-lines] [--quiet]

Runs the cache-only replay (:mod:`kvsim.replay.cache_only`) once per capacity. ``--json`` prints
``{"results": [{"capacity_tokens", "input_tokens", "reused_tokens", "hit_rate", ...}, ...],
"max_hit_rate": ...}`` on stdout; otherwise a table. With several capacities (or ``--out``) it
writes ``results.json`` and ``hit_rate.png`` (the curve, with the infinite-cache maximum as a
horizontal line) into ``--out`` (default ``reports/replay-cache/``), atomically. Progress goes to
stderr unless ``--quiet``. Exit status 2 on a bad trace or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.output_dir import ReplacedDir

FORMATS = ("mooncake",)
DEFAULT_OUT = "reports/replay-cache"
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_capacities(text: str) -> list[int]:
    """``"1000000,3M,10m"`` -> ``[1000000, 3000000, 10000000]`` (decimal k/M/G suffixes)."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", item)
        if not m:
            raise argparse.ArgumentTypeError(
                f"capacity {item.strip()!r}: expected a token count such as 3000000 or 3M")
        value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
        if value != int(value) or value < 1:
            raise argparse.ArgumentTypeError(f"capacity {item.strip()!r}: must be a whole number "
                                             "of tokens >= 1")
        out.append(int(value))
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("replay-cache", help="cache-only trace replay: hit rate against capacity",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="trace file (JSONL)")
    p.add_argument("--format", choices=FORMATS, default="mooncake", help="trace format")
    p.add_argument("--capacity-tokens", required=True, type=parse_capacities, metavar="N[,N...]",
                   help="cache capacities in tokens (k/M/G suffixes allowed)")
    p.add_argument("--tokens-per-block", type=int, default=512, metavar="B",
                   help="the manager's tokens per block (default 512)")
    p.add_argument("--engine", choices=("lru", "manager"), default="lru",
                   help="lru (default): the manager's rules on a block map, the same results "
                   "about four times faster; manager: every call through a KVCacheManager")
    p.add_argument("--json", action="store_true", help="print the results object on stdout")
    p.add_argument("--out", help=f"report directory (default {DEFAULT_OUT} with several "
                   "capacities)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip (and count) malformed trace lines instead of failing")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _draw(curve: dict, path: Path, title: str) -> None:
    from kvsim.report.figures import new_figure, save

    rows = sorted(curve["results"], key=lambda r: r["capacity_tokens"])
    xs = [r["capacity_tokens"] / 1e6 for r in rows]
    ys = [r["hit_rate"] for r in rows]
    fig, ax = new_figure(7.0, 4.2)
    ax.plot(xs, ys, marker="o", color="tab:blue", label="LRU cache (kvsim manager)")
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=8)
    ax.axhline(curve["max_hit_rate"], color="tab:red", linestyle="--",
               label=f"infinite cache (max) {curve['max_hit_rate']:.3f}")
    if len(xs) > 1 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(xs, [f"{x:g}M" for x in xs])
    ax.set_xlabel("cache capacity (million tokens)")
    ax.set_ylabel("prefix-cache hit rate (reused / input tokens)")
    ax.set_ylim(0, min(1.0, max(ys + [curve["max_hit_rate"]]) * 1.15 + 0.02))
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    save(fig, path)


def write_report(curve: dict, meta: dict, out_dir: Path) -> None:
    """``results.json`` (the curve plus ``meta``) and ``hit_rate.png`` into ``out_dir``."""
    (out_dir / "results.json").write_text(json.dumps(curve | meta, indent=1, sort_keys=True,
                                                     allow_nan=False) + "\n")
    title = (f"Cache-only replay of {Path(meta['trace']).name} "
             f"({meta['tokens_per_block']} tokens/block)")
    _draw(curve, out_dir / "hit_rate.png", title)


def run(args: argparse.Namespace) -> int:
    from kvsim.manager.limits import MAX_SLOTS, MAX_TOKENS_PER_BLOCK
    from kvsim.replay.cache_only import capacity_curve
    from kvsim.traces.mooncake import load_mooncake

    def say(message: str) -> None:
        if not args.quiet:
            print(f"kvsim replay-cache: {message}", file=sys.stderr, flush=True)

    out = args.out or (DEFAULT_OUT if len(args.capacity_tokens) > 1 else None)
    t0 = time.perf_counter()
    try:
        if not 1 <= args.tokens_per_block <= MAX_TOKENS_PER_BLOCK:
            raise KvsimError(f"--tokens-per-block {args.tokens_per_block}: must be in "
                             f"[1, {MAX_TOKENS_PER_BLOCK}]")
        for capacity in args.capacity_tokens:
            if capacity // args.tokens_per_block > MAX_SLOTS:
                raise KvsimError(f"--capacity-tokens {capacity}: {capacity // args.tokens_per_block}"
                                 f" blocks of {args.tokens_per_block} tokens; at most {MAX_SLOTS} "
                                 "(kvsim.manager.limits)")
        target = None if out is None else ReplacedDir(out)
        trace = load_mooncake(args.trace, skip_bad_lines=args.skip_bad_lines)
    except KvsimError as e:
        print(f"kvsim replay-cache: {e}", file=sys.stderr)
        return 2
    if trace.skipped_lines:
        # Always reported, even with --quiet: results from a partly skipped trace must say so.
        print(f"kvsim replay-cache: {trace.skip_summary()}", file=sys.stderr)
    say(f"{args.trace}: {len(trace)} requests, {trace.input_tokens} input tokens "
        f"({time.perf_counter() - t0:.2f} s to load)")
    try:
        curve = capacity_curve(trace, args.capacity_tokens, args.tokens_per_block,
                               None if args.quiet else say, args.engine)
    except KvsimError as e:
        print(f"kvsim replay-cache: {e}", file=sys.stderr)
        return 2
    say(f"infinite-cache maximum hit rate {curve['max_hit_rate']:.4f}")
    if target is not None:
        meta = {"trace": str(args.trace), "format": args.format,
                "tokens_per_block": args.tokens_per_block, "requests": len(trace),
                "skipped_lines": trace.skipped_lines}
        try:
            with target as staging:
                write_report(curve, meta, staging)
        except KvsimError as e:
            print(f"kvsim replay-cache: {e}", file=sys.stderr)
            return 2
        say(f"wrote {Path(out) / 'results.json'} and {Path(out) / 'hit_rate.png'}")
    if args.json:
        print(json.dumps(curve, sort_keys=True))
    else:
        print(f"{'capacity_tokens':>16} {'hit_rate':>9} {'of max':>7} {'reused_tokens':>14} "
              f"{'input_tokens':>13}")
        best = curve["max_hit_rate"]
        for r in curve["results"]:
            share = f"{r['hit_rate'] / best:.3f}" if best else "-"
            print(f"{r['capacity_tokens']:>16} {r['hit_rate']:>9.4f} {share:>7} "
                  f"{r['reused_tokens']:>14} {r['input_tokens']:>13}")
        print(f"{'infinite':>16} {best:>9.4f} {'1.000':>7}")
    return 0
