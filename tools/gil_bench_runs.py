"""One measured run of the GIL hand-over benchmark per given thread count, appended to a JSON
Lines file: the fit set of the simulator's GIL model, made between the validation scenario's runs
(tools/interleaved_runs.sh) so both see the machine in the same state.

    python3 tools/gil_bench_runs.py OUT.jsonl THREADS [THREADS ...] [--probes N]

``--probes``: probes per thread (default the benchmark's,
:data:`kvsim.calibration.gil_handover.BENCH_PROBES`).

Each line: {"threads", "probes_per_thread", "probe_tokens", "calls": [[thread, start_s, end_s]],
"thread_starts": {thread: [start_called_s, began_s]}}. One warm-up run (the first thread count)
comes first and is not written.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvsim.calibration import gil_handover as gh


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("threads", type=int, nargs="+")
    ap.add_argument("--probes", type=int, default=gh.BENCH_PROBES)
    args = ap.parse_args(argv)
    if args.probes < 1 or min(args.threads) < 1:
        ap.error("--probes and every thread count must be at least 1")
    gh.measure(0, threads=args.threads[0], probes=args.probes)  # the warm-up run alone
    with open(args.out, "a") as f:
        for n in args.threads:
            (run,) = gh.measure(1, threads=n, probes=args.probes, warm_up=False)
            f.write(json.dumps({"threads": n, "probes_per_thread": args.probes,
                                "probe_tokens": gh.BENCH_PROBE_TOKENS, "calls": run.calls,
                                "thread_starts": run.thread_starts}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
