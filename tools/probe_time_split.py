"""What a measured probe's time is made of, per case of the concurrency runs (issue 23).

For every ``KVCacheManager.probe_reuse`` call of the ok runs of each case under ``MEASURED/v``
(the hardware executor's call records, pooled over the case's runs), the median of:

* ``latency_ms``: the call, from the pipeline's first stamp to its last (the judge's probe);
* ``manager_cpu_ms``: the record's ``cpu_ms``, the manager's own CPU time in the call;
* ``thread_cpu_ms``: the calling thread's CPU time over the whole call;
* ``lock_wait_ms``: from the lock request to its grant;
* ``off_cpu_ms``: latency less the thread's CPU time (waiting: the lock, the GIL, wake-ups);

and the latency's 99th percentile. Each figure is also given over the same figure of the case's
closed loop (probe_during_resize at ``i0`` with the same lock preference and threads), where
that case is there: how much slower a probe after a sleep runs, part by part.

    python tools/probe_time_split.py MEASURED_DIR [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from kvsim.calibration import concurrency_judge as cj
from kvsim.errors import KvsimError

PARTS = ("latency_ms", "manager_cpu_ms", "thread_cpu_ms", "lock_wait_ms", "off_cpu_ms")


def case_split(runs: list) -> dict | None:
    """The medians (and latency p99) over every ok probe of ``runs``; None without probes."""
    rows = [(c["latency_ms"], c["cpu_ms"], c["thread_cpu_ms"], c["lock_wait_ms"])
            for r in runs if r.status == "ok" for c in r.results["calls"]
            if c["api"] == "KVCacheManager.probe_reuse" and c.get("ok", True)
            and None not in (c.get("latency_ms"), c.get("cpu_ms"), c.get("thread_cpu_ms"),
                             c.get("lock_wait_ms"))]
    if not rows:
        return None
    a = np.array(rows, dtype=float)
    cols = [a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 0] - a[:, 2]]
    out = {k: float(np.median(x)) for k, x in zip(PARTS, cols)}
    return out | {"latency_p99_ms": float(np.quantile(a[:, 0], 0.99)), "probes": len(a)}


def closed_loop_of(name: str) -> str | None:
    """probe_during_resize.P.tT.iN's closed loop (i0); None for other cases."""
    m = re.fullmatch(r"(probe_during_resize\.\w+\.t\d+)\.i\d+", name)
    return f"{m.group(1)}.i0" if m else None


def split(measured: Path) -> dict:
    _, runs, _ = cj.load_runs(measured)
    cases = {name: s for name, rs in sorted(runs.items()) if (s := case_split(rs)) is not None}
    for name, s in cases.items():
        base = cases.get(closed_loop_of(name) or "")
        if base is not None and base is not s:
            s["over_closed_loop"] = {k: round(s[k] / base[k], 3) if base[k] else None
                                     for k in (*PARTS, "latency_p99_ms")}
    return {"measured": str(measured), "definitions": __doc__.split("\n\n")[1], "cases": cases}


def table(result: dict) -> str:
    head = "| case | probes | " + " | ".join(f"{p} (us)" for p in PARTS) + " | p99 (us) |"
    out = [head, "|" + "---|" * (len(PARTS) + 3)]
    for name, s in result["cases"].items():
        ratio = s.get("over_closed_loop", {})
        cells = [f"{s[k] * 1e3:.1f}" + (f" (x{ratio[k]:.2f})" if ratio.get(k) else "")
                 for k in (*PARTS, "latency_p99_ms")]
        out.append(f"| {name} | {s['probes']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("measured", type=Path)
    ap.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    try:
        result = split(args.measured)
    except KvsimError as e:
        print(f"probe_time_split.py: {e}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
