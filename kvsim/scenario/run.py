"""Running a scenario: calls through the manager, records, results directory.

The ``plan`` executor runs the workload's calls through the manager and records, per call, the
plan it produced (pages allocated, offloaded, onboarded, dropped; bookkeeping counts) and the tier
occupancy after it. It attaches no time: that is the simulator's job. The invariant checker runs
after every call; what it finds goes to ``violations``.

The results directory is written to a temporary sibling first and renamed into place when
complete, so a failed run never leaves a directory that looks finished.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.manager import KVCacheManager
from kvsim.manager.invariants import find_violations
from kvsim.scenario.schema import Scenario, parse_scenario
from kvsim.scenario.source import apply_overrides, load_yaml
from kvsim.workloads import burst_resize

RESULTS_SCHEMA_VERSION = 1
CSV_FIELDS = ("index", "phase", "api", "cache_id", "ok", "result", "allocated_pages",
              "offloaded_pages", "offloaded_bytes", "onboarded_pages", "onboarded_bytes",
              "dropped_pages", "copy_batches", "stats_commits", "gpu_used", "gpu_evictable",
              "host_used", "error")


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    data, source = load_yaml(path)
    if overrides:
        if not isinstance(data, dict):
            raise source.error((), "must be a mapping")
        apply_overrides(data, source, overrides)
    return parse_scenario(data, source)


def _occupancy(manager: KVCacheManager) -> list[dict[str, int]]:
    out = []
    for level in range(manager.layout.num_levels):
        rows = manager.get_storage_statistics(level)
        out.append({k: sum(r[k] for r in rows) for k in ("total", "free", "evictable")})
    return out


def execute(scenario: Scenario) -> dict:
    """Run the scenario; returns the results object (deterministic for a scenario and seed)."""
    manager = KVCacheManager(scenario.manager)
    records: list[dict] = []
    violations: list[dict] = []
    for index, call in enumerate(burst_resize.calls(scenario.manager, scenario.workload,
                                                    manager, scenario.seed)):
        error = ""
        try:
            result = call.invoke()
        except KvsimError as e:
            result, error = None, f"{type(e).__name__}: {e}"
        plan = manager.last_plan
        occupancy = _occupancy(manager)
        counts = plan.counts
        records.append({
            "index": index,
            "phase": call.phase,
            "api": call.api,
            "cache_id": call.args.get("cache_id", ""),
            "args": call.args,
            "ok": bool(plan.ok and not error and result is not False),
            "result": result if isinstance(result, bool) else None,
            "allocated_pages": counts.pages_allocated,
            "offloaded_pages": plan.offloaded_pages,
            "offloaded_bytes": plan.offloaded_bytes,
            "onboarded_pages": plan.onboarded_pages,
            "onboarded_bytes": plan.onboarded_bytes,
            "dropped_pages": counts.pages_dropped,
            "copy_batches": len(plan.copies),
            "stats_commits": counts.stats_commits,
            "counts": counts.to_dict(),
            "occupancy": occupancy,
            "error": error,
        })
        for problem in find_violations(manager):
            violations.append({"index": index, "api": call.api, "problem": problem})
    return _results(scenario, manager, records, violations)


def _results(scenario: Scenario, manager: KVCacheManager, records: list[dict],
             violations: list[dict]) -> dict:
    per_api: dict[str, dict[str, int]] = {}
    for r in records:
        row = per_api.setdefault(r["api"], {"count": 0, "ok": 0, "failed": 0})
        row["count"] += 1
        row["ok" if r["ok"] else "failed"] += 1
    growth = [r for r in records if r["phase"] == "growth"]
    committed = manager.get_committed_stats()["life_cycles"]
    reused = sum(lc["reused_blocks"] for lc in committed)
    missed = sum(lc["missed_blocks"] for lc in committed)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "scenario": {"name": scenario.name, "file": scenario.source_file, "seed": scenario.seed,
                     "description": scenario.description},
        "executor": scenario.executor,
        "api": per_api,
        "offload": {"pages": sum(r["offloaded_pages"] for r in records),
                    "bytes": sum(r["offloaded_bytes"] for r in records),
                    "growth_pages": sum(r["offloaded_pages"] for r in growth),
                    "growth_bytes": sum(r["offloaded_bytes"] for r in growth)},
        "onboard": {"pages": sum(r["onboarded_pages"] for r in records),
                    "bytes": sum(r["onboarded_bytes"] for r in records)},
        "reuse": {"reused_blocks": reused, "missed_blocks": missed,
                  "hit_rate": reused / (reused + missed) if reused + missed else None},
        "lock": {"modelled": False, "note": "the plan executor models no time and no lock"},
        "deadlocks": [],
        "violations": violations,
        "levels": list(manager.layout.level_names),
        "calls": records,
    }


def _calls_csv(results: dict) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in results["calls"]:
        row = {k: r.get(k, "") for k in CSV_FIELDS}
        occ = r["occupancy"]
        row["gpu_used"] = occ[0]["total"] - occ[0]["free"]
        row["gpu_evictable"] = occ[0]["evictable"]
        row["host_used"] = occ[1]["total"] - occ[1]["free"] if len(occ) > 1 else ""
        writer.writerow(row)
    return buf.getvalue()


def write_results(results: dict, out_dir: Path) -> None:
    """Write results.json, calls.csv and the report into ``out_dir``, atomically."""
    from kvsim.report.scenario_report import write_report

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        (tmp / "calls.csv").write_text(_calls_csv(results))
        write_report(results, tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run_scenario_cli(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario, args.set)
    except KvsimError as e:
        print(f"kvsim run: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("reports") / scenario.name
    if not args.quiet:
        print(f"kvsim run: {scenario.name} ({scenario.executor} executor)", file=sys.stderr)
    results = execute(scenario)
    write_results(results, out)
    if args.json:
        print(json.dumps({k: v for k, v in results.items() if k != "calls"}, sort_keys=True))
    if not args.quiet:
        summary = Counter(r["api"] for r in results["calls"])
        print(f"kvsim run: {sum(summary.values())} calls, "
              f"{results['offload']['pages']} pages offloaded, "
              f"{len(results['violations'])} invariant violations; report in {out}/report.md",
              file=sys.stderr)
    return 1 if results["violations"] else 0
