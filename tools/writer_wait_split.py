"""What a writer's lock wait is made of, measured against predicted (issue 23, concurrency).

For every exclusive (writer) call of every judged run of the concurrency validation
(``kvsim.calibration.concurrency_judge``), and of the simulator's prediction of the same run
(the judge's: same case, same seed, the GIL hand-over's draws seeded by the run's round), from
the calls' ``lock_requested_ms`` / ``lock_granted_ms`` / ``lock_released_ms`` and ``thread``:

* ``wait_ms``: granted - requested;
* ``holders_ms``: from the request to the last release, before the grant, of a hold by another
  thread that overlapped the wait (``last_release``): the time spent waiting for holders,
  readers that overtook it included; 0 when no hold overlapped the wait (the lock was free);
* ``latency_ms``: granted - max(requested, last_release): the release-to-grant latency (a free
  lock: the lock's own cost, from the pipeline's stamp before ``acquire`` to the one after it);
* ``overtook``: holds by other threads granted after the request and before the grant;
* ``free``: no hold by another thread overlapped the wait;
* ``woken``: other threads waiting at ``last_release`` (requested before it, granted at or after
  the writer's grant): the waiters a ``threading.Condition.notify_all`` woke with the writer.

``derived`` gives the two optional CPU-preset terms (``lock_test_us``, ``lock_wake_us``) by the
rules stated beside them, from the measured runs and this prediction.

The hardware executor stamps ``lock_released_ms`` after :meth:`hw.rwlock.ThreadedSharedMutex.release`
returns, so a releaser that loses the GIL between its release and its stamp can stamp a release
after the writer's grant; such a release counts as at the grant (latency 0) and is counted in
``clamped``.

Per case: the longest writer wait of each run (the judge's ``writer wait``, which is the lock
log's; here the call records', which include the pipeline's stamps around ``acquire``), split
as above, median over runs; and, over every writer call of the case's runs, the median and
90th percentile of the release-to-grant latency after a holder, and of the wait on a free lock.

    python tools/writer_wait_split.py MEASURED_DIR --cpu-model PRESET --out FILE.json [--case NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from kvsim.calibration.concurrency_judge import median_of


def writer_rows(calls: list[dict]) -> list[dict]:
    """One row per exclusive call that was granted: its wait split (see the module docstring)."""
    held = [c for c in calls if c.get("lock_granted_ms") is not None]
    rows = []
    for w in held:
        if w["mode"] != "exclusive":
            continue
        req, grant = w["lock_requested_ms"], w["lock_granted_ms"]
        others = [c for c in held if c["thread"] != w["thread"] and c["lock_granted_ms"] < grant
                  and (c["lock_released_ms"] is None or c["lock_released_ms"] > req)]
        rel = [min(c["lock_released_ms"] if c["lock_released_ms"] is not None else grant, grant)
               for c in others]
        last = max(rel) if rel else None
        start = req if last is None else max(req, last)
        woken = 0 if last is None else sum(
            1 for c in held if c["thread"] != w["thread"] and c["lock_requested_ms"] <= last
            and c["lock_granted_ms"] >= grant)
        rows.append({
            "woken": woken,
            "index": w["index"], "thread": w["thread"], "api": w["api"],
            "requested_ms": req, "wait_ms": grant - req,
            "holders_ms": start - req, "latency_ms": grant - start,
            "overtook": sum(1 for c in others if c["lock_granted_ms"] > req),
            "overtook_shared": sum(1 for c in others if c["lock_granted_ms"] > req
                                   and c["mode"] == "shared"),
            "free": last is None,
            "clamped": sum(1 for c in others if c["lock_released_ms"] is not None
                           and c["lock_released_ms"] > grant),
        })
    return rows


def _q(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def summary(runs: list[dict]) -> dict:
    """Per case, from the runs' results (each with ``calls``)."""
    longest, after_holder, free = [], [], []
    for r in runs:
        rows = writer_rows(r["calls"])
        if rows:
            longest.append(max(rows, key=lambda x: x["wait_ms"]))
        after_holder += [x["latency_ms"] for x in rows if not x["free"]]
        free += [x["wait_ms"] for x in rows if x["free"]]
    lat = after_holder
    alone = [x["latency_ms"] for r in runs for x in writer_rows(r["calls"])
             if not x["free"] and x["woken"] == 0]
    return {
        "runs": len(runs),
        "longest_per_run": longest,
        "longest": {k: median_of([x[k] for x in longest]) for k in
                    ("wait_ms", "holders_ms", "latency_ms", "overtook", "overtook_shared")},
        "longest_free_runs": sum(x["free"] for x in longest),
        "judge_per_run": [(r.get("starvation") or {}).get("longest_writer_wait_ms") for r in runs],
        "judge_writer_wait_ms_median": median_of([(r.get("starvation") or {}).get(
            "longest_writer_wait_ms") for r in runs]),
        "writers": sum(len(writer_rows(r["calls"])) for r in runs),
        "after_holder": {"n": len(lat), "p50_ms": _q(lat, 0.5), "p90_ms": _q(lat, 0.9),
                         "max_ms": max(lat) if lat else None},
        "after_holder_alone": {"n": len(alone), "p50_ms": _q(alone, 0.5)},
        "free": {"n": len(free), "p50_ms": _q(free, 0.5), "p90_ms": _q(free, 0.9),
                 "max_ms": max(free) if free else None},
        "clamped": sum(x["clamped"] for r in runs for x in writer_rows(r["calls"])),
    }


def derived(cases: dict) -> dict:
    """The two lock terms as the rules in the module docstring take them from ``cases``."""
    free = [x["wait_ms"] for c in cases.values() for x in c["measured"]["longest_per_run"]
            if x["free"]]
    judge_free = [w for c in cases.values() for x, w in zip(
        c["measured"]["longest_per_run"], c["measured"]["judge_per_run"]) if x["free"]]
    m_alone = [(c["measured"]["after_holder_alone"]["n"], c["measured"]["after_holder_alone"]["p50_ms"],
                c["predicted"]["after_holder_alone"]["p50_ms"], n) for n, c in cases.items()]
    m = [x for x in m_alone if x[0] and x[1] is not None and x[2] is not None]
    # Either term is None where no run or case gives it (call 4's model queued no writer).
    free_ms = median_of(judge_free)
    test_us = None if free_ms is None else free_ms * 1e3
    excess = median_of([(a - b) * 1e3 for _k, a, b, _n in m])
    return {
        "lock_test_us": None if test_us is None else round(test_us, 2),
        "lock_test_us_rule": "median of the judge's writer wait (starvation.longest_writer_wait_ms, "
                             "the lock log's) over the runs whose longest writer found the lock "
                             "free (no other thread's hold overlapped its wait)",
        "lock_wake_us": None if excess is None or test_us is None else round(excess - test_us, 2),
        "lock_wake_us_rule": "per case, the median release-to-grant latency of writers granted "
                             "after a holder with no other waiter (woken == 0), measured less "
                             "predicted; the median over the cases with such grants on both "
                             "sides; less lock_test_us (the re-test the woken writer pays)",
        "free_runs": len(judge_free),
        "free_lock_log_wait_ms_median": median_of(judge_free),
        "free_call_record_wait_ms_median": median_of(free),
        "alone_latency": [{"case": n, "n": k, "measured_p50_ms": a, "predicted_p50_ms": b}
                          for k, a, b, n in m],
    }


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
    p.add_argument("--cpu-model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--case", action="append", default=None)
    a = p.parse_args(argv)
    root = default_root()
    cpu = cpu_model_arg(a.cpu_model)
    manifest, runs, _lost = load_runs(Path(a.measured))
    out: dict = {"what": "writer lock waits split into waiting for holders and release-to-grant "
                         "latency (tools/writer_wait_split.py)",
                 "measured_dir": a.measured, "cpu_model": a.cpu_model, "cases": {}}
    for case in CASES:
        if a.case and case.name not in a.case:
            continue
        done = [r for r in runs.get(case.name, []) if r.status == "ok"]
        t0 = time.perf_counter()
        preds = predict_runs(case, [r.round for r in done], cpu, root)
        out["cases"][case.name] = {"measured": summary([r.results for r in done]),
                                   "predicted": summary(preds)}
        print(f"{case.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    out["derived"] = derived(out["cases"])
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
