"""The GIL hand-over benchmark (kvsim.calibration.gil_handover) over several call shapes and
thread counts: how the measured takeover rates depend on them. Writes one JSON.

    python3 tools/gil_handover_shapes.py OUT.json [--runs 3]

Per shape: the pooled estimate, the worker takeover rate by number of waiting threads (W), and
the median call time, with calls that saw a takeover included (what a probe costs under
contention).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections import defaultdict
from datetime import datetime, timezone

from kvsim.calibration import gil_handover as gh

SHAPES = [(6, 400, 2048), (6, 400, 4096), (4, 400, 4096), (8, 400, 4096), (6, 200, 8192)]


def by_waiters(runs: list[gh.HandoverRun]) -> dict[int, dict]:
    """Worker takeovers and exposure split by the number of other live threads during a hold."""
    count: dict[int, int] = defaultdict(int)
    exposure: dict[int, float] = defaultdict(float)
    for run in runs:
        last = {}
        for t, _s, e in run.calls:
            last[t] = max(e, last.get(t, e))
        holds = gh._holds(run.calls)
        alive = {t: v[0] for t, v in run.thread_starts.items()}
        called = sorted(alive.values())
        for i, (th, frm, to, _first) in enumerate(holds):
            w = sum(1 for t, a in alive.items() if t != th and a <= frm and last.get(t, -1.0) > to)
            exposure[w] += (to - frm) * w
            if i + 1 < len(holds) and last[th] > to and \
                    not any(to <= c <= holds[i + 1][3] for c in called):
                count[w] += 1
    return {w: {"takeovers": count[w], "exposure_s": exposure[w],
                "per_s": count[w] / exposure[w] if exposure[w] else None}
            for w in sorted(exposure)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    for threads, probes, tokens in SHAPES:
        print(f"{threads} threads x {probes} probes of {tokens} tokens", file=sys.stderr)
        runs = gh.measure(args.runs, threads, probes, tokens)
        est = gh.estimate(runs)
        est.pop("per_run")
        rows.append({"threads": threads, "probes_per_thread": probes, "probe_tokens": tokens,
                     "runs": args.runs, **est, "by_waiters": by_waiters(runs),
                     "median_call_us": statistics.median(
                         (e - s) * 1e6 for r in runs for _t, s, e in r.calls)})
    doc = {"what": "GIL hand-over benchmark (kvsim.calibration.gil_handover.measure) per shape",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"node": platform.node(), "python": platform.python_version(),
                       "platform": platform.platform()},
           "shapes": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for r in rows:
        print(f"{r['threads']}x{r['probes_per_thread']}x{r['probe_tokens']}: worker "
              f"{r['worker_takeover_per_s']:.1f}/s ({r['worker_takeovers']}), starter "
              f"{r['starter_takeover_per_s'] or 0:.1f}/s ({r['starter_takeovers']}), "
              f"median call {r['median_call_us']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
