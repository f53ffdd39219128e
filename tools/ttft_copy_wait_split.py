"""Where a serving run's copy wait goes, per admission round, measured against predicted.

A request's copy wait (``kvsim.serving.stats``) is ``copies_landed - admitted``: from the start
of the engine's admission round that took it to the moment its pass had its copies. This tool
splits each round (the requests admitted together, one pass) of a hardware run and of the
simulator's prediction of it into:

* ``calls_ms``: the admission calls' latencies (probe, create, resume, resize, and a failed
  admission's close), of which ``cpu_ms`` (the manager's work), ``submit_ms`` (submitting the
  copies) and ``lock_wait_ms``;
* ``gaps_ms``: the engine's own time between those calls (round start to the last call's end,
  less the calls);
* ``stream_ms``: the last admission call's end to ``copies_landed`` (the pass waiting on the
  copy stream), of which ``device_ms`` (until the last copy submitted before the pass finished
  on the device) and ``after_ms`` (from the later of that and the last call's end to landed:
  the synchronisation's own cost);
* ``pass_ms``: landed to the first token (the pass), and for a hardware run with per-pass CUDA
  events ``prefill_cuda_ms`` (its prefills' CUDA-event time), ``prefill_model_ms`` (their price)
  and ``pass_minus_prefill_ms`` (the pass less the CUDA-event time: the decode and the host's own
  time together);

and, per request, which rounds hold the median request's TTFT. Rows are summarised by the
round's onboarded pages and new tokens.

    python tools/ttft_copy_wait_split.py SCENARIO MEASURED_DIR --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def rounds(results: dict) -> list[dict]:
    """One row per admission round that produced first tokens (in time order)."""
    reqs = [r for r in results["workload_summary"]["per_request"] if r["ttft_ms"] is not None]
    by_admit: dict[float, list[dict]] = defaultdict(list)
    for r in reqs:
        by_admit[round(r["arrival_ms"] + r["queue_ms"], 4)].append(r)
    calls = sorted((c for c in results["calls"] if c["phase"] == "admit"),
                   key=lambda c: c["start_ms"])
    copies = sorted(results["copies"], key=lambda c: c["submitted"])
    rows = []
    ci = 0
    for admitted in sorted(by_admit):
        group = by_admit[admitted]
        landed = admitted + group[0]["copy_wait_ms"]
        first_token = group[0]["arrival_ms"] + group[0]["ttft_ms"]
        while ci < len(calls) and calls[ci]["start_ms"] < admitted - 1e-6:
            ci += 1
        mine = []
        j = ci
        while j < len(calls) and calls[j]["start_ms"] <= landed + 1e-6:
            mine.append(calls[j])
            j += 1
        last_end = max((c["start_ms"] + c["latency_ms"] for c in mine), default=admitted)
        calls_ms = sum(c["latency_ms"] for c in mine)
        before = [c for c in copies if c["submitted"] * 1e3 <= landed + 1e-6]
        last_copy = max((c["finished"] * 1e3 for c in before if c["finished"] is not None),
                        default=None)
        device_ms = 0.0 if last_copy is None else max(0.0, last_copy - last_end)
        after_ms = landed - max(last_end, last_copy if last_copy is not None else last_end)
        onboarded = sum(c["onboarded_pages"] or 0 for c in mine)
        offloaded = sum(c["offloaded_pages"] or 0 for c in mine)
        rows.append({
            "admitted_ms": admitted, "requests": len(group),
            "new_tokens": sum(r["new_tokens"] for r in group),
            "cached_tokens": sum(r["cached_tokens"] for r in group),
            "onboarded_pages": onboarded, "offloaded_pages": offloaded, "calls": len(mine),
            "copy_wait_ms": landed - admitted, "calls_ms": calls_ms,
            "cpu_ms": sum(c["cpu_ms"] or 0 for c in mine),
            "submit_ms": sum(c["submit_ms"] or 0 for c in mine),
            "lock_wait_ms": sum(c["lock_wait_ms"] or 0 for c in mine),
            "gaps_ms": (last_end - admitted) - calls_ms,
            "stream_ms": landed - last_end, "device_ms": device_ms, "after_ms": after_ms,
            "pass_ms": first_token - landed,
            "ttfts_ms": [r["ttft_ms"] for r in group], "queues_ms": [r["queue_ms"] for r in group],
        })
    return rows


def add_pass_prefills(rows: list[dict], results: dict, times) -> None:
    """Hardware runs with ``hw.forward.per_pass``: each round's prefills, their CUDA-event time
    and price, and the pass less that time (the decode priced for the pass is not in the
    record, so this is the decode and the host's own time together). The per-pass list holds
    the passes with prefills in order; each round is one of them."""
    pp = ((results.get("hw") or {}).get("forward") or {}).get("per_pass")
    if not pp or len(pp["prefill_ms"]) != len(rows):
        return
    for row, ms, prefills in zip(rows, pp["prefill_ms"], pp["prefills"]):
        row["prefill_cuda_ms"] = ms
        row["prefill_model_ms"] = sum(times.prefill_seconds(n, c) for n, c in prefills) * 1e3
        row["pass_prefills"] = prefills
        row["pass_minus_prefill_ms"] = row["pass_ms"] - ms


BANDS = ((0, 1, "0 onboarded"), (1, 64, "1-63 pages"), (64, 512, "64-511 pages"),
         (512, 1 << 40, ">= 512 pages"))
KEYS = ("copy_wait_ms", "calls_ms", "cpu_ms", "submit_ms", "gaps_ms", "stream_ms", "device_ms",
        "after_ms")


def summarise(rows: list[dict]) -> dict:
    def med(xs):
        return statistics.median(xs) if xs else None

    out = {"rounds": len(rows), "all": {k: med([r[k] for r in rows]) for k in KEYS}}
    out["all"]["sum_copy_wait_s"] = sum(r["copy_wait_ms"] * r["requests"] for r in rows) / 1e3
    for lo, hi, label in BANDS:
        sel = [r for r in rows if lo <= r["onboarded_pages"] < hi]
        out[label] = {"rounds": len(sel), **{k: med([r[k] for r in sel]) for k in KEYS}}
    return out


def median_request(rows: list[dict]) -> dict:
    """The rounds around the TTFT median: per request (ttft, copy wait, queue), sorted by TTFT,
    the 20 requests in the middle."""
    per = []
    for r in rows:
        for t, q in zip(r["ttfts_ms"], r["queues_ms"]):
            per.append({"ttft_ms": t, "queue_ms": q, "copy_wait_ms": r["copy_wait_ms"],
                        "pass_ms": r["pass_ms"], "new_tokens": r["new_tokens"],
                        "onboarded_pages": r["onboarded_pages"], "calls_ms": r["calls_ms"],
                        "gaps_ms": r["gaps_ms"], "stream_ms": r["stream_ms"]})
    per.sort(key=lambda x: x["ttft_ms"])
    mid = len(per) // 2
    return {"requests": len(per), "middle": per[max(0, mid - 10):mid + 10]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/ttft_copy_wait_split.py")
    ap.add_argument("scenario")
    ap.add_argument("measured")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from kvsim.calibration.ttft_judge import measured_runs, predicted_runs

    measured = measured_runs(Path(args.measured))
    predicted, times = predicted_runs(args.scenario)
    doc = {"scenario": args.scenario, "measured": args.measured, "runs": {}}
    for name in measured:
        m_rows, p_rows = rounds(measured[name]), rounds(predicted[name])
        add_pass_prefills(m_rows, measured[name], times[name])
        doc["runs"][name] = {"measured": {"summary": summarise(m_rows),
                                          "median": median_request(m_rows), "rounds": m_rows},
                             "predicted": {"summary": summarise(p_rows),
                                           "median": median_request(p_rows), "rounds": p_rows}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for name, run in doc["runs"].items():
        for side in ("measured", "predicted"):
            s = run[side]["summary"]
            print(name, side, s["rounds"], {k: None if v is None else round(v, 3)
                                            for k, v in s["all"].items()})
            for _lo, _hi, label in BANDS:
                print("   ", label, {k: None if v is None else round(v, 3)
                                     for k, v in s[label].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
