"""One measured run of the GIL hand-over benchmark per given thread count, appended to a JSON
Lines file: the fit set of the simulator's GIL model, made between the validation scenario's runs
(tools/interleaved_runs.sh) so both see the machine in the same state.

    python3 tools/gil_bench_runs.py OUT.jsonl THREADS [THREADS ...]

Each line: {"threads", "probes_per_thread", "probe_tokens", "calls": [[thread, start_s, end_s]],
"thread_starts": {thread: [start_called_s, began_s]}}. One warm-up run (the first thread count)
comes first and is not written.
"""

from __future__ import annotations

import json
import sys

from kvsim.calibration import gil_handover as gh


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, counts = argv[0], [int(a) for a in argv[1:]]
    gh.measure(0, threads=counts[0])  # the warm-up run alone
    with open(out, "a") as f:
        for n in counts:
            (run,) = gh.measure(1, threads=n, warm_up=False)
            f.write(json.dumps({"threads": n, "probes_per_thread": gh.BENCH_PROBES,
                                "probe_tokens": gh.BENCH_PROBE_TOKENS, "calls": run.calls,
                                "thread_starts": run.thread_starts}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
