"""Write reports/validation-h200/summary.json from the judge files its figures come from.

The judged figures come from different device calls: copy batches and burst resize from call A's
judge (``h200_burst_resize.json``), probe latency from the held-out call E
(``call-e/h200_probe_during_resize.json``). ``kvsim validate --out DIR`` combines every judge file
in one directory; this names the files instead, so the summary says where each figure was made.

    python3 tools/validation_summary.py [--burst FILE] [--probe FILE] [--replication FILE] [--out FILE]

A replication call's probe judge (default ``call-f/``, pre-registered in its PROTOCOL.md) adds
``probe_replication_*`` beside the main call's probe figures. Issue 23's judges add
``plan_batches`` (the copy model on plan-shaped batches, held out: median and 90th percentile;
the seed burst's and the largest onboard batch's GB/s by the selector's pick) and
``concurrency`` (every shipped concurrency case: errors and verdicts), each naming its files.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvsim.calibration.validate import combine  # noqa: E402

V = Path("reports/validation-h200")
PLAN = Path("plan-batches")  # relative to the validation directory (V)
PLAN_REFIT = PLAN / "2026-12-04-refit-judge-summary.json"
PLAN_SELECT = PLAN / "2026-12-04-select-judge.json.xz"
PLAN_FULL = PLAN / "2026-12-03-plan-batches.json.xz"
PLAN_JUDGE2 = PLAN / "2026-12-04-judge-2-summary.json"  # PROTOCOL-2.md's held-out judge
PLAN_JUDGE3 = PLAN / "2026-12-04-judge-3-summary.json"  # PROTOCOL-3.md's judge (fit and judge in one run)
CONCURRENCY = Path("concurrency") / "judge" / "concurrency-judge.json"
# Every pre-registered concurrency call's verdict judge, oldest first (PROTOCOL.md, then
# PROTOCOL-3 onwards): summary.json carries the latest present as "concurrency", and the tallies
# of the others beside it, under these keys. A new call moves the range's end.
CONCURRENCY_CALLS = (("concurrency_first_call", CONCURRENCY),
                     *((f"concurrency_call_{n}",
                        Path("concurrency") / f"judge-{n}" / "concurrency-judge.json")
                       for n in range(3, 15)))

# What summary.json says about the probe figures' history; each number names its file.
PROBE_HISTORY = {
    "call_c_72_runs_before_fixes_p99_ape_pct": "h200_probe_during_resize.json",
    "call_d_42_runs_before_fixes_p99_ape_pct": "replication/summary.json",
    "call_c_rejudged_p99_ape_pct": "rejudged/call-c-summary.json",
    "call_d_rejudged_p99_ape_pct": "rejudged/call-d-summary.json",
}


# Call E's protocol ran until a set time: 110 runs were made, runs 54-110 came back in an archive
# over the device tool's return limit and were lost with the machine (README, "Call E").
CALL_E_NOTE = ("call E: runs 1-53 judged; runs 54-110 were measured but lost (their archive was "
               "over the device tool's 16 MiB return limit) and are not in any figure")


def _p99(path: Path) -> float:
    data = json.loads(path.read_text())
    if "probe" in data:  # a judge file
        return data["probe"]["all"]["p99"]["ape_pct"]
    return data["probe_p99_ape_pct"]  # a summary


def _copy_bench_date(judge: dict) -> str:
    """The copy bench's measurement date, from its provenance (call A measured copies and bursts
    in one device call)."""
    bench = json.loads((ROOT / judge["copy_bench"]["file"]).read_text())  # repo-relative
    return bench["provenance"]["date_utc"][:10]


def _machine_date(probe: Path) -> str:
    """The probe call's date: the first line of its ``machine.txt`` (``date`` on the GPU machine,
    written by tools/interleaved_runs.sh), e.g. ``Thu Dec  3 07:03:07 AM UTC 2026``."""
    path = probe.parent / "machine.txt"
    line = path.read_text().splitlines()[0]
    try:
        return datetime.strptime(" ".join(line.split()), "%a %b %d %I:%M:%S %p UTC %Y").strftime("%Y-%m-%d")
    except ValueError:
        raise SystemExit(f"{path}:1: field 'date': cannot read {line!r} as `date` output") from None


def _judge(path: Path, probe: bool) -> dict:
    """A ``kvsim validate`` judge file; with ``probe``, one of a probe scenario."""
    data = json.loads(path.read_text())
    if "burst_resize" not in data or "scenario" not in data:
        raise SystemExit(f"{path}: not a kvsim validate judge file (no 'burst_resize'/'scenario')")
    if probe and not data["probe"]:
        raise SystemExit(f"{path}: field 'probe' is empty: not a probe scenario's judge")
    return data


def _replication(path: Path, root: Path) -> dict:
    """A replication call's probe figures, judged like the main call's, under ``probe_replication_``
    (the hold-overlap figures stay with the main call)."""
    part = combine([_judge(path, probe=True)])
    out = {f"probe_replication_{k[len('probe_'):]}": v for k, v in part.items()
           if k.startswith("probe_") and not k.startswith("probe_overlapping")}
    out["probe_replication_from"] = str(path.relative_to(root))
    out["probe_replication_date"] = _machine_date(path)
    return out


def build(burst: Path, probe: Path, root: Path, note: str | None = None,
          replication: Path | None = None) -> dict:
    judged = [_judge(burst, probe=False), _judge(probe, probe=True)]
    out = combine(judged)
    out["copy_and_burst_from"] = str(burst.relative_to(root))
    out["copy_and_burst_date"] = _copy_bench_date(judged[0])
    out["probe_from"] = str(probe.relative_to(root))
    out["probe_date"] = _machine_date(probe)
    out["date"] = max(out["copy_and_burst_date"], out["probe_date"])  # the latest measurement
    if replication is not None:
        out.update(_replication(replication, root))
        out["date"] = max(out["date"], out["probe_replication_date"])
    if note:
        out["probe_note"] = note
    files = {k: f for k, f in PROBE_HISTORY.items() if (root / f).exists()}
    out["probe_history"] = {k: _p99(root / f) for k, f in files.items()}
    out["probe_history_files"] = files
    if (root / PLAN_REFIT).exists():
        out["plan_batches"] = plan_batches(root)
    present = [(key, path) for key, path in CONCURRENCY_CALLS if (root / path).exists()]
    if present:
        *earlier_calls, (_, latest) = present
        out["concurrency"] = concurrency(root, latest)
        for key, path in earlier_calls:
            earlier = concurrency(root, path)
            out[key] = {"from": earlier["from"], "tally": earlier["tally"]}
    return out


def _pick(row: dict) -> dict:
    """One batch of the select-only judge: its pick and the GB/s it reached."""
    return {"batch": row["batch"], "direction": row["direction"], "path": row["pick"],
            "device_gbps": row.get("pick_gated_gbps"),
            "select_end_to_end_gbps": row["bytes"] / row["select_ms"] / 1e6}


def plan_batches(root: Path) -> dict:
    """The copy model on plan-shaped batches (held out) and the selector's seed-burst rates."""
    from kvsim.calibration.packed import read_json
    from kvsim.calibration.plan_batches import measured_points

    refit = json.loads((root / PLAN_REFIT).read_text())
    sel = read_json(root / PLAN_SELECT)
    burst = {name: _pick(sel[name]) for name in ("seed_burst", "onboard_largest")}
    # the largest onboard batch of the shipped scenarios' plans
    shipped = max((r for r in sel["rows"] if r["batch"].startswith("scenario/onboard/")),
                  key=lambda r: r["pages"], default=None)
    if shipped is not None:
        burst["shipped_onboard_largest"] = _pick(shipped)
    # every path and CTA count on the seed burst (offload) and the largest shipped onboard batch,
    # from the full 2026-12-03 run: device (gated) GB/s where gated, else end to end
    full = read_json(root / PLAN_FULL)
    points, _ = measured_points(full)
    size = {b["id"]: b["bytes"] for b in full["batches"]}
    by_path = {}
    for name in ("seed_burst", "shipped_onboard_largest"):
        if name in burst:
            bid = burst[name]["batch"]
            by_path[bid] = {k: {"gbps": size[bid] / m.get("gated", m.get("issue")) / 1e9,
                                "timing": "gated" if "gated" in m else "issue"}
                            for k, m in sorted(points.get(bid, {}).items()) if k != "select"}
    out = {"model_judge_median_ape_pct": refit["model"]["judge"]["median_ape_pct"],
           "model_judge_p90_ape_pct": refit["model"]["judge"]["p90_ape_pct"],
           "model_judge_points": refit["model"]["judge"]["count"],
           "targets": refit["targets"],
           "selector_within_same_file": f"{refit['selector']['within']}/{refit['selector']['judged']}",
           "selector_within_remeasured": f"{sel['within']}/{sel['judged']}",
           "burst": burst, "by_path_2026_12_03": by_path,
           "from": [str(V / PLAN_REFIT), str(V / PLAN_SELECT), str(V / PLAN_FULL)]}
    if (root / PLAN_JUDGE2).exists():
        j = json.loads((root / PLAN_JUDGE2).read_text())
        burst2 = next((v for v in j["seed_burst"].values() if v["source"] == "seed_burst"), {})
        out["protocol2"] = {
            "model_all_median_ape_pct": j["model"]["all"]["median_ape_pct"],
            "model_all_p90_ape_pct": j["model"]["all"]["p90_ape_pct"],
            "model_all_points": j["model"]["all"]["count"],
            "device_all_median_ape_pct": j["device"]["all"]["median_ape_pct"],
            "device_all_p90_ape_pct": j["device"]["all"]["p90_ape_pct"],
            "host_all_median_ape_pct": j["host"]["all"]["median_ape_pct"],
            "selector_within_same_file": f"{j['selector']['within']}/{j['selector']['judged']}",
            "seed_burst_offload": {"path": burst2.get("pick"), "device_gbps": burst2.get("pick_gated_gbps"),
                                   "end_to_end_gbps": burst2.get("pick_issue_gbps")},
            "onboard_largest": {"batch": j["onboard_largest"]["batch"],
                                "path": j["onboard_largest"]["pick"],
                                "device_gbps": j["onboard_largest"]["pick_gated_gbps"],
                                "end_to_end_gbps": j["onboard_largest"]["pick_issue_gbps"]},
            "device_gbps_by_path": j["gated_gbps_by_path"],
            "verdict": j["verdict_protocol2"],
            "from": str(V / PLAN_JUDGE2)}
    if (root / PLAN_JUDGE3).exists():
        j = json.loads((root / PLAN_JUDGE3).read_text())
        out["protocol3"] = {
            "model_judge_median_ape_pct": j["model"]["judge"]["median_ape_pct"],
            "model_judge_p90_ape_pct": j["model"]["judge"]["p90_ape_pct"],
            "model_judge_points": j["model"]["judge"]["count"],
            "model_fit_median_ape_pct": j["model"]["fit"]["median_ape_pct"],
            "model_fit_p90_ape_pct": j["model"]["fit"]["p90_ape_pct"],
            "device_judge_median_ape_pct": j["device"]["judge"]["median_ape_pct"],
            "device_judge_p90_ape_pct": j["device"]["judge"]["p90_ape_pct"],
            "host_judge_median_ape_pct": j["host"]["judge"]["median_ape_pct"],
            "selector_within_same_file": f"{j['selector']['within']}/{j['selector']['batches']}",
            "seed_burst_offload": {"batch": j["seed_burst"]["batch"], "path": j["seed_burst"]["pick"],
                                   "device_gbps": j["seed_burst"]["pick_gated_gbps"],
                                   "end_to_end_gbps": j["seed_burst"]["pick_issue_gbps"]},
            "onboard_largest": {"batch": j["onboard_largest"]["batch"],
                                "path": j["onboard_largest"]["pick"],
                                "device_gbps": j["onboard_largest"]["pick_gated_gbps"],
                                "end_to_end_gbps": j["onboard_largest"]["pick_issue_gbps"]},
            "device_gbps_by_path": {j[k]["batch"]: j[k]["gated_gbps_by_point"]
                                    for k in ("seed_burst", "onboard_largest")},
            "host_probe_reference_ms": j["fit"]["host_probe"]["reference_ms"],
            "verdict": j["verdict"],
            "from": str(V / PLAN_JUDGE3)}
    return out


def concurrency(root: Path, judge: Path = CONCURRENCY) -> dict:
    """Every concurrency case's errors and verdicts, and the tally per target, from ``judge``."""
    j = json.loads((root / judge).read_text())
    cases = {}
    for name, c in j["cases"].items():
        row = {k: (c[k]["error_pct"] if c[k].get("measured") is not None else None)
               for k in ("writer_wait_ms", "probe_p50_ms", "probe_p99_ms")}
        row["starvation"] = {"measured": c["starvation"]["measured"],
                             "predicted": c["starvation"]["predicted"]}
        row["deadlock"] = {"measured": c["deadlock"]["measured"], "predicted": c["deadlock"]["predicted"]}
        cases[name] = row
    return {"from": str(V / judge), "target_pct": j["target_pct"], "tally": j["tally"],
            "cases": cases}

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst", type=Path, default=ROOT / V / "h200_burst_resize.json")
    ap.add_argument("--probe", type=Path, default=ROOT / V / "call-e" / "h200_probe_during_resize.json")
    ap.add_argument("--out", type=Path, default=ROOT / V / "summary.json")
    ap.add_argument("--note", default=CALL_E_NOTE, help="what summary.json says about the probe runs")
    ap.add_argument("--replication", type=Path, default=ROOT / V / "call-f" / "h200_probe_during_resize.json",
                    help="a replication call's probe judge (left out where the file does not exist)")
    args = ap.parse_args(argv)
    replication = args.replication.resolve() if args.replication.exists() else None
    summary = build(args.burst.resolve(), args.probe.resolve(), args.out.resolve().parent,
                    args.note, replication)
    args.out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in summary.items()
                      if k.endswith("_ape_pct") and not k.startswith("probe_overlapping")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
