"""Where a reader's lock hold goes, per case of a concurrency call (issue 23, a diagnostic).

For every shared (reader) call of every run under ``MEASURED/v``: its hold (``lock_released_ms
- lock_granted_ms``) less its manager time (``cpu_ms + submit_ms``): what is left is the pipeline
between grant and release and the ``release()`` call itself, where a release that blocks on the
``threading.Condition``'s own mutex (and then waits for the GIL) shows; and the reader's lock
wait (call records: it includes the wait for that mutex before the lock log's request). Per
case: the median and 90th percentile of both, and the share of holds with more than 0.1 ms left
over.

    python tools/reader_hold_split.py MEASURED_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvsim.calibration.packed import read_json  # noqa: E402


def split(measured: Path) -> dict:
    out = {}
    for cdir in sorted(p for p in (measured / "v").iterdir() if p.is_dir()):
        left, waits = [], []
        for rd in sorted(p for p in cdir.iterdir() if (p / "results.json.xz").is_file()):
            for c in read_json(rd / "results.json.xz")["calls"]:
                if c["mode"] == "shared" and c["lock_granted_ms"] is not None \
                        and c["lock_released_ms"] is not None:
                    left.append(c["lock_released_ms"] - c["lock_granted_ms"] - c["cpu_ms"]
                                - (c["submit_ms"] or 0.0))
                    waits.append(c["lock_granted_ms"] - c["lock_requested_ms"])
        if not left:
            continue
        a, w = np.array(left), np.array(waits)
        out[cdir.name] = {"shared_calls": int(a.size),
                          "hold_less_manager_ms_p50": round(float(np.median(a)), 4),
                          "hold_less_manager_ms_p90": round(float(np.quantile(a, 0.9)), 4),
                          "share_over_0.1ms": round(float((a > 0.1).mean()), 4),
                          "reader_wait_ms_p50": round(float(np.median(w)), 4),
                          "reader_wait_ms_p90": round(float(np.quantile(w, 0.9)), 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    result = {"what": __doc__.split("\n\n")[0], "measured": argv[0], "cases": split(Path(argv[0]))}
    Path(argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    for name, row in result["cases"].items():
        print(name, row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
