"""How far one case's measured figures move from call to call.

Reads the ``concurrency-judge.json`` of several concurrency judges (calls measured on different
hosts with the same cases) and writes, per case and metric (writer wait, probe p50, probe p99),
the measured value of each call, the largest over the smallest, and whether any one prediction
could be within the judges' target of every call's value: largest / smallest <= (1 + t) / (1 - t),
t = the judges' ``target_pct`` / 100. Beside it, per call, the same span between the call's own
runs of each case (``within_call``), to tell a host that moved between calls from noisy runs.
It measures the targets' reach on the lent hosts, not the model: a case whose calls span more
than that cannot be met on all of them by any prediction.

    python3 tools/concurrency_cross_call.py JUDGE_DIR JUDGE_DIR [...] --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

METRICS = ("writer_wait_ms", "probe_p50_ms", "probe_p99_ms")


def _within_call(cases: dict, metric: str, reach: float) -> dict:
    """The same span between one call's runs of each case (``measured_per_run``)."""
    spans = []
    for case in cases.values():
        value = case[metric]
        runs = [r for r in (value.get("measured_per_run") or []) if r and r > 0] \
            if isinstance(value, dict) else []
        if len(runs) >= 2:
            spans.append(max(runs) / min(runs))
    return {"cases_judged": len(spans),
            "median_run_span": round(statistics.median(spans), 3) if spans else None,
            "cases_runs_beyond_reach": sum(s > reach for s in spans)}


def cross_call(judges: dict[str, dict]) -> dict:
    """``judges`` maps a label to a loaded judge JSON; every judge must hold the same cases and
    target."""
    targets = {j["target_pct"] for j in judges.values()}
    if len(targets) != 1:
        raise ValueError(f"the judges' target_pct differ: {sorted(targets)}")
    target = targets.pop() / 100.0
    reach = (1 + target) / (1 - target)
    per_case = {label: j["cases"] for label, j in judges.items()}  # the judge writes {name: case}
    names = [set(c) for c in per_case.values()]
    if any(n != names[0] for n in names):
        raise ValueError("the judges do not hold the same cases")
    out: dict = {"calls": list(judges), "target_pct": target * 100, "reach": reach,
                 "metrics": {}}
    for metric in METRICS:
        rows = {}
        for case in sorted(names[0]):
            values = [c[case][metric] for c in per_case.values()]
            if any(not isinstance(v, dict) or v.get("measured") is None for v in values):
                continue
            measured = [v["measured"] for v in values]
            if min(measured) <= 0:
                continue
            span = max(measured) / min(measured)
            rows[case] = {"measured": measured, "span": round(span, 3),
                          "one_prediction_can_meet_all": span <= reach}
        spans = [r["span"] for r in rows.values()]
        out["metrics"][metric] = {
            "cases": rows,
            "within_call": {label: _within_call(cases, metric, reach)
                            for label, cases in per_case.items()},
            "median_span": round(statistics.median(spans), 3) if spans else None,
            "cases_no_prediction_meets_all": sum(not r["one_prediction_can_meet_all"]
                                                 for r in rows.values()),
            "cases_judged": len(rows)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("judges", nargs="+", type=Path, help="judge directories (concurrency-judge.json)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON to write")
    args = ap.parse_args(argv)
    if len(args.judges) < 2:
        ap.error("give at least two judge directories")
    judges = {}
    for d in args.judges:
        path = d / "concurrency-judge.json"
        if not path.is_file():
            ap.error(f"{path}: no such file")
        judges[str(d)] = json.loads(path.read_text())
    try:
        result = cross_call(judges)
    except ValueError as err:
        ap.error(str(err))
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    for metric, m in result["metrics"].items():
        print(f"{metric}: median span {m['median_span']}x; no one prediction meets every call in "
              f"{m['cases_no_prediction_meets_all']} of {m['cases_judged']} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
