"""A run's results object: what both timed executors and the plan executor produce, as data.

:func:`timed_results` turns a :class:`~kvsim.runtime.records.RunResult` into the results object
(stable keys: ``scenario``, ``executor``, ``api``, ``offload``, ``onboard``, ``reuse``, ``lock``,
``deadlocks``, ``violations``, plus ``calls``), :func:`plan_results` does the same for the plan
executor, and :func:`variant_summary` condenses one for a variants table. Keys starting with
``_`` are private to the process (wall times, variants' full results) and never written.
:func:`results_json` is what ``results.json`` holds: strict JSON (no NaN or Infinity), keys
sorted, so the same scenario and seed give byte-identical files.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import statistics
from typing import Any

from kvsim.manager import KVCacheManager
from kvsim.runtime import metrics
from kvsim.runtime.records import CallRecord, RunResult
from kvsim.scenario import json_text
from kvsim.scenario.schema import Scenario, Variant

RESULTS_SCHEMA_VERSION = 1
CSV_FIELDS = ("index", "thread", "phase", "api", "ok", "start_ms", "latency_ms", "lock_wait_ms",
              "cpu_ms", "copies_done_ms", "offloaded_pages", "offloaded_bytes", "onboarded_pages",
              "onboarded_bytes", "dropped_pages", "error")


def _ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def call_record(c: CallRecord) -> dict:
    """One call of a timed run, as results show it (times in milliseconds)."""
    ms = _ms
    return {
        "index": c.index, "thread": c.thread, "phase": c.phase, "api": c.api, "args": c.args,
        "mode": c.mode, "ok": c.ok, "result": c.result if isinstance(c.result, bool) else None,
        "start_ms": ms(c.start), "latency_ms": ms(c.latency), "lock_wait_ms": ms(c.lock_wait),
        "lock_requested_ms": ms(c.lock_requested),
        "lock_granted_ms": ms(c.lock_granted), "lock_released_ms": ms(c.lock_released),
        "cpu_ms": ms(c.cpu_s), "submit_ms": ms(c.submit_s),
        "copies_done_ms": ms(c.copies_done),
        "offloaded_pages": c.offloaded_pages, "offloaded_bytes": c.offloaded_bytes,
        "onboarded_pages": c.onboarded_pages, "onboarded_bytes": c.onboarded_bytes,
        "dropped_pages": c.dropped_pages, "counts": c.counts, "cpu_terms_us": c.cpu_terms_us,
        "error": c.error,
    }


def common(scenario: Scenario, manager: KVCacheManager, records: list[dict],
           violations: list[dict]) -> dict:
    """The keys every executor's results have."""
    growth = [r for r in records if r["phase"] == "growth"]
    committed = manager.get_committed_stats()["life_cycles"]
    # What caches still open have not published yet counts too (KVCM2 keeps reuse and
    # allocation statistics pending in each cache until it commits them).
    pending = [c.pending_stats for c in manager.open_caches()]
    reused = sum(lc["reused_blocks"] for lc in committed) + sum(p["reused_blocks"] for p in pending)
    missed = sum(lc["missed_blocks"] for lc in committed) + sum(p["missed_blocks"] for p in pending)
    by_level = [sum(lc["reused_blocks_by_level"][lv] for lc in committed)
                + sum(p["reused_blocks_by_level"][lv] for p in pending)
                for lv in range(len(manager.layout.level_names))]
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "scenario": {"name": scenario.name, "file": scenario.source_file, "seed": scenario.seed,
                     "description": scenario.description, "workload": scenario.workload.kind}
        | ({"question": scenario.question} if scenario.question else {}),
        "executor": scenario.executor,
        "resolved": resolved_config(scenario),
        "offload": {"pages": sum(r["offloaded_pages"] for r in records),
                    "bytes": sum(r["offloaded_bytes"] for r in records),
                    "growth_pages": sum(r["offloaded_pages"] for r in growth),
                    "growth_bytes": sum(r["offloaded_bytes"] for r in growth)},
        "onboard": {"pages": sum(r["onboarded_pages"] for r in records),
                    "bytes": sum(r["onboarded_bytes"] for r in records)},
        "reuse": {"reused_blocks": reused, "missed_blocks": missed,
                  "hit_rate": reused / (reused + missed) if reused + missed else None,
                  "reused_blocks_by_level": dict(zip(manager.layout.level_names, by_level))},
        "violations": violations,
        "levels": list(manager.layout.level_names),
        "calls": records,
    }


def plan_results(scenario: Scenario, manager: KVCacheManager, records: list[dict],
                 violations: list[dict]) -> dict:
    """The plan executor's results (its records already carry plans and occupancy)."""
    per_api: dict[str, dict[str, int]] = {}
    for r in records:
        row = per_api.setdefault(r["api"], {"count": 0, "ok": 0, "failed": 0})
        row["count"] += 1
        row["ok" if r["ok"] else "failed"] += 1
    return common(scenario, manager, records, violations) | {
        "api": per_api,
        "lock": {"modelled": False, "note": "the plan executor models no time and no lock"},
        "starvation": None,
        "deadlocks": [],
    }


def _plain(value: Any) -> Any:
    """A configuration value as JSON: dataclasses as objects, long sequences (a trace's
    requests) as their length."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value] if len(value) <= 64 else f"({len(value)} items)"
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)


def resolved_config(scenario: Scenario) -> dict:
    """The configuration the run used, after defaults and overrides: what a reader needs to
    reproduce it without the scenario file."""
    out = {"manager": _plain(scenario.manager), "workload": _plain(scenario.workload),
           "cpu_model": scenario.cpu_model}
    if scenario.executor != "plan":
        sim = _plain(scenario.sim)
        if scenario.sim.disk is None:  # no disk level in time: as before disks existed
            del sim["disk"], sim["disk_drives"]
        out |= {"hardware": scenario.hardware, "sim": sim}
    if scenario.executor == "hw":
        out["hw"] = _plain(scenario.hw)
    return out


def deadlock_records(run: RunResult) -> list[dict]:
    """Deadlocks (wait-for cycles), threads stuck outside a cycle, and lock hazards."""
    out = [{"kind": "deadlock", "time": d.time, "cycle": [vars(t) for t in d.cycle]}
           for d in run.deadlocks]
    cycle_threads = {t.thread for d in run.deadlocks for t in d.cycle}
    stuck = [vars(t) for t in run.stuck if t.thread not in cycle_threads]
    if stuck:
        out.append({"kind": "stuck", "threads": stuck})
    return out + [{"kind": h.kind, "thread": h.thread, "api": h.api, "time": h.time}
                  for h in run.lock_hazards]


def timed_results(scenario: Scenario, manager: KVCacheManager, run: RunResult,
                  hardware_name: str) -> dict:
    """The results both timed executors (sim, hw) share, from their run."""
    records = [call_record(c) for c in run.calls]
    lock = metrics.lock_summary(run)
    out = common(scenario, manager, records, run.violations) | {
        "api": metrics.per_api(run.calls),
        "lock": lock,
        "starvation": lock["starvation"],
        "deadlocks": deadlock_records(run),
        "link": metrics.link_summary(run),
        "copies": metrics.copies_summary(run),
        "hardware": hardware_name,
    }
    if run.gil.holds:  # for the trace export only: not in results.json (bulky)
        out["_gil_holds"] = [(t, a * 1e3, b * 1e3) for t, a, b in run.gil.holds]
    if any(c.api == "KVCacheManager.probe_reuse" for c in run.calls):
        out["probe"] = metrics.probes_during_holds(run)
    if run.thread_starts:  # when the main thread started each workload thread, and it ran
        out["thread_starts"] = {t: {"start_called_ms": _ms(v[0]),
                                    "began_ms": _ms(v[1]) if len(v) > 1 else None}
                                for t, v in sorted(run.thread_starts.items())}
    return out


def variant_summary(results: dict, variant: Variant | None) -> dict:
    growth = [r for r in results["calls"]
              if r["phase"] == "growth" and r["api"] == "KvCache.resize"]
    out: dict[str, Any] = {
        "offloaded_pages": results["offload"]["growth_pages"],
        "offloaded_bytes": results["offload"]["growth_bytes"],
        "violations": len(results["violations"]),
        "deadlocks": len(results["deadlocks"]),
        "starved": bool((results.get("starvation") or {}).get("starved")),
    }
    latencies = [r["latency_ms"] for r in growth if r.get("latency_ms") is not None]
    if latencies:
        out["resize_p50_ms"] = statistics.median(latencies)
        done = [r["copies_done_ms"] - r["start_ms"] for r in growth if r.get("copies_done_ms")]
        if done:
            out["resize_copies_done_p50_ms"] = statistics.median(done)
        moved = [c for c in results.get("copies", []) if c["api"] == "KvCache.resize"
                 and c.get("seconds")]
        if moved:
            out["resize_copy_ms"] = sum(c["seconds"] for c in moved) * 1e3 / len(growth)
            out["resize_copy_gbps"] = (sum(c["num_bytes"] for c in moved)
                                       / sum(c["seconds"] for c in moved) / 1e9)
            out["copy_ctas"] = sorted({c["ctas"] for c in moved if c["ctas"]}) or None
            out["copy_paths"] = sorted({c["path"] for c in moved})
    failed = sum(1 for r in results["calls"] if not r["ok"])
    out["failed_calls"] = failed + len(results.get("setup_failures", []))
    wait = (results.get("starvation") or {}).get("longest_writer_wait_ms")
    if wait is not None:
        out["longest_writer_wait_ms"] = wait
    if "probe" in results:
        probe = results["api"].get("KVCacheManager.probe_reuse", {}).get("latency", {})
        out["probe_p50_ms"] = probe.get("p50_ms")
        out["probe_p99_ms"] = probe.get("p99_ms")
        out["probe_during_hold"] = results["probe"]["during_exclusive_hold"]
        out["starvation"] = results["lock"].get("starvation")
    if variant is not None and variant.reference:
        comparison = {}
        for metric, ref in variant.reference:
            predicted = out.get(metric)
            comparison[metric] = {
                "reference": ref,
                "predicted": predicted,
                "error_pct": None if predicted is None or not ref else (predicted - ref) / ref * 100,
            }
        out["reference"] = {"source": variant.reference_source, "metrics": comparison}
    return out


def calls_csv(results: dict) -> str:
    """``calls.csv``: one row per call, the columns of :data:`CSV_FIELDS`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in results["calls"]:
        writer.writerow({k: r.get(k, "") for k in CSV_FIELDS})
    return buf.getvalue()


def public(results: dict) -> dict:
    """The results object without run-to-run varying or bulky private fields."""
    return {k: v for k, v in results.items() if not k.startswith("_")}


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def results_json(results: dict) -> str:
    """``results`` as strict JSON (no NaN or Infinity), keys sorted: byte-identical per seed.
    The text of ``json.dumps(finite(public(results)), indent=1, sort_keys=True,
    allow_nan=False)``, written by :func:`kvsim.scenario.json_text.dumps` (twice as fast)."""
    return json_text.dumps(public(results)) + "\n"


def failed_calls(results: dict) -> dict[str, int]:
    """Failed calls per API, setup included, over the run and its variants."""
    counts: dict[str, int] = {}
    runs = [results, *results.get("_variant_results", {}).values()]
    for run in runs:
        for c in run["calls"]:
            if not c["ok"]:
                counts[c["api"]] = counts.get(c["api"], 0) + 1
        for c in run.get("setup_failures", []):
            counts[c["api"]] = counts.get(c["api"], 0) + 1
    return dict(sorted(counts.items()))
