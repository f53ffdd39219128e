"""Readers stopped mid-call: how much of a hold the thread spent off its CPU (issue 23, item 6 of
the concurrency README's call-3 misses, measured).

The hardware executor records each manager call's wall time (``cpu_ms``, ``perf_counter``) and
its thread's CPU time in it (``thread_cpu_ms``, ``time.thread_time``; slim results keep both).
Their difference is time the thread was off its CPU inside the call: waiting for the GIL, or
descheduled (a merely slow vCPU counts as CPU). The simulator's counterpart is a call's hold less
its priced CPU (``cpu_ms``): the GIL waits and pipeline steps the model puts inside the hold.

Per case of a concurrency call (runs under ``MEASURED/v``, as ``kvsim.calibration.concurrency_judge``
loads them), and with ``--cpu-model`` the judge's prediction of the same runs:

* ``readers``: every shared call's manager wall, thread CPU and off-CPU time (median, p90), the
  share of calls more than 0.1 ms off their CPU, and off-CPU over wall summed over the calls;
* ``bottleneck``: for each run's longest writer wait (lock requested to granted), the hold by
  another thread that overlapped the wait and was released last before the grant (what the
  writer waited for to the end): its hold, manager wall, thread CPU and off-CPU (measured), or
  hold, priced CPU and hold less priced CPU (predicted); medians over the runs.

    python tools/hold_off_cpu.py MEASURED_DIR --out FILE.json [--cpu-model PRESET] [--case NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _q(values: list[float], q: float) -> float | None:
    return round(float(np.quantile(values, q)), 4) if values else None


def _median(values: list[float]) -> float | None:
    return _q(values, 0.5)


def readers(calls: list[dict]) -> dict:
    """The shared calls' wall, thread CPU and off-CPU figures (module docstring)."""
    rows = [(c["cpu_ms"], c["thread_cpu_ms"]) for c in calls
            if c["mode"] == "shared" and c.get("thread_cpu_ms") is not None and c["cpu_ms"]]
    if not rows:
        return {"calls": 0}
    wall = [w for w, _ in rows]
    cpu = [t for _, t in rows]
    off = [max(0.0, w - t) for w, t in rows]
    return {"calls": len(rows),
            "wall_ms": {"p50": _q(wall, 0.5), "p90": _q(wall, 0.9)},
            "thread_cpu_ms": {"p50": _q(cpu, 0.5), "p90": _q(cpu, 0.9)},
            "off_cpu_ms": {"p50": _q(off, 0.5), "p90": _q(off, 0.9)},
            "share_off_over_0.1ms": round(sum(o > 0.1 for o in off) / len(off), 4),
            "off_over_wall": round(sum(off) / sum(wall), 4)}


def bottleneck(calls: list[dict]) -> dict | None:
    """For the longest writer wait of a run: the hold by another thread released last before
    the grant, among those overlapping the wait; None when no writer waited for a holder."""
    held = [c for c in calls if c.get("lock_granted_ms") is not None
            and c.get("lock_released_ms") is not None]
    writers = [c for c in held if c["mode"] == "exclusive"]
    if not writers:
        return None
    w = max(writers, key=lambda c: c["lock_granted_ms"] - c["lock_requested_ms"])
    req, grant = w["lock_requested_ms"], w["lock_granted_ms"]
    others = [c for c in held if c["thread"] != w["thread"] and c["lock_granted_ms"] < grant
              and c["lock_released_ms"] > req]
    if not others:
        return None
    last = max(others, key=lambda c: min(c["lock_released_ms"], grant))
    hold = last["lock_released_ms"] - last["lock_granted_ms"]
    out = {"writer_wait_ms": grant - req, "mode": last["mode"], "hold_ms": hold,
           "manager_ms": last["cpu_ms"], "thread_cpu_ms": last.get("thread_cpu_ms")}
    if out["thread_cpu_ms"] is not None:
        out["off_cpu_ms"] = max(0.0, last["cpu_ms"] - out["thread_cpu_ms"])
    else:
        out["hold_less_manager_ms"] = hold - last["cpu_ms"]
    return out


def summary(runs: list[dict]) -> dict:
    """``readers`` over every run's calls and the runs' ``bottleneck`` medians."""
    calls = [c for r in runs for c in r["calls"]]
    per_run = [b for r in runs if (b := bottleneck(r["calls"])) is not None]
    keys = sorted({k for b in per_run for k, v in b.items() if isinstance(v, float | int)
                   and not isinstance(v, bool)})
    return {"runs": len(runs), "readers": readers(calls),
            "bottleneck": {"runs": len(per_run),
                           "shared": sum(b["mode"] == "shared" for b in per_run),
                           **{k: _median([b[k] for b in per_run if b.get(k) is not None])
                              for k in keys}},
            "bottleneck_per_run": per_run}


def main(argv: list[str] | None = None) -> int:
    from kvsim.calibration.concurrency_judge import (
        CASES,
        cpu_model_arg,
        default_root,
        load_runs,
        predict_runs,
    )

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("measured")
    p.add_argument("--out", required=True)
    p.add_argument("--cpu-model", default=None)
    p.add_argument("--case", action="append", default=None)
    a = p.parse_args(argv)
    _manifest, runs, _lost = load_runs(Path(a.measured))
    out: dict = {"what": __doc__.split("\n\n")[0], "measured_dir": a.measured,
                 "cpu_model": a.cpu_model, "cases": {}}
    for case in CASES:
        done = [r for r in runs.get(case.name, []) if r.status == "ok"]
        if (a.case and case.name not in a.case) or not done:
            continue
        row = {"measured": summary([r.results for r in done])}
        if a.cpu_model:
            row["predicted"] = summary(predict_runs(case, [r.round for r in done],
                                                    cpu_model_arg(a.cpu_model), default_root()))
        out["cases"][case.name] = row
        m, pr = row["measured"], row.get("predicted", {})
        print(f"{case.name}: readers off-CPU p50 {m['readers'].get('off_cpu_ms', {}).get('p50')} ms "
              f"(share of wall {m['readers'].get('off_over_wall')}); bottleneck hold "
              f"{m['bottleneck'].get('hold_ms')} ms, thread CPU {m['bottleneck'].get('thread_cpu_ms')}, "
              f"off-CPU {m['bottleneck'].get('off_cpu_ms')}; predicted hold "
              f"{pr.get('bottleneck', {}).get('hold_ms')}, priced "
              f"{pr.get('bottleneck', {}).get('manager_ms')}", file=sys.stderr)
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
