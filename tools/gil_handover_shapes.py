"""The GIL hand-over benchmark (kvsim.calibration.gil_handover) over several call shapes and
thread counts: how the measured takeover rates depend on them. Writes one JSON.

    python3 tools/gil_handover_shapes.py OUT.json [--runs 3]

Per shape: the pooled estimate (with the takeovers per second of hold by number of other live
threads, ``holds_by_waiters``) and the median call time, with calls that saw a takeover included
(what a probe costs under contention). (Files made before the hold model report
``worker_takeovers_by_waiters``: the same split per second of each waiting thread.)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone

from kvsim.calibration import gil_handover as gh

SHAPES = [(6, 400, 2048), (6, 400, 4096), (4, 400, 4096), (8, 400, 4096), (6, 200, 8192)]


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
                     "runs": args.runs, **est,
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
        print(f"{r['threads']}x{r['probes_per_thread']}x{r['probe_tokens']}: takeovers "
              f"{r['worker_takeover_per_s']:.1f}/s of hold ({r['worker_takeovers']}), waiter "
              f"exponent {r['waiter_exponent']:+.2f}, starter "
              f"{r['starter_takeover_per_s'] or 0:.1f}/s ({r['starter_takeovers']}), "
              f"median call {r['median_call_us']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
