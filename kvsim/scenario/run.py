"""Running a scenario: workload through an executor, variants, results directory.

Executors:

* ``plan`` runs every call through the manager in order and records, per call, the plan it
  produced and the tier occupancy after it. It attaches no time.
* ``sim`` runs the setup calls untimed, then the workload's threads in the SimPy model
  (:mod:`kvsim.sim.executor`) on the scenario's hardware and CPU cost presets.

Both check the manager's invariants (after every call, or every exclusive call for ``sim``); what
they find goes to ``violations``. A scenario with ``variants`` runs once as written and once per
variant (its ``set`` overrides applied); each variant's summary, with its error against any
``reference`` figures, goes under ``variants``.

The results directory is written to a temporary sibling first and renamed into place when
complete, so a failed run never leaves a directory that looks finished.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.errors import KvsimError
from kvsim.manager import KVCacheManager
from kvsim.manager.invariants import find_violations
from kvsim.runtime.steps import Call, Sleep, Until, Workload
from kvsim.scenario.schema import Scenario, Variant, parse_scenario
from kvsim.scenario.source import Source, apply_overrides, load_yaml
from kvsim.workloads import (
    burst_resize,
    concurrent_probe,
    gil_antagonist,
    mooncake,
    op_trace,
    seed_concurrency,
)

RESULTS_SCHEMA_VERSION = 1
CSV_FIELDS = ("index", "thread", "phase", "api", "ok", "start_ms", "latency_ms", "lock_wait_ms",
              "cpu_ms", "copies_done_ms", "offloaded_pages", "offloaded_bytes", "onboarded_pages",
              "onboarded_bytes", "dropped_pages", "error")


@dataclass
class ScenarioFile:
    """A loaded scenario file: its data, where each value came from, the scenario as written
    and each variant's scenario (all validated when the file is loaded)."""

    data: dict
    source: Source
    base: Scenario
    variants: tuple[tuple[Variant, Scenario], ...] = ()


def load_scenario_file(path: str | Path, overrides: list[str] | None = None) -> ScenarioFile:
    """Load, override and validate a scenario file and every variant; raises ScenarioError
    naming the file, line and field (or the option) of the first problem."""
    data, source = load_yaml(path)
    if not isinstance(data, dict):
        raise source.error((), "must be a mapping")
    if overrides:
        apply_overrides(data, source, overrides)
    sf = ScenarioFile(data, source, parse_scenario(data, source))
    sf.variants = tuple((v, variant_scenario(sf, v)) for v in sf.base.variants)
    return sf


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    return load_scenario_file(path, overrides).base


def variant_scenario(sf: ScenarioFile, variant: Variant) -> Scenario:
    """The scenario with ``variant``'s overrides applied; an error in what an override set is
    blamed on that override's line."""
    data = copy.deepcopy(sf.data)
    data.pop("variants", None)
    source = Source(sf.source.filename, dict(sf.source.lines), dict(sf.source.options))
    for dotted, value in variant.overrides:
        here = ("variants", variant.name, "set", dotted)
        line = sf.source.line_of(here)
        keys: list[Any] = [int(k) if k.isdigit() else k for k in str(dotted).split(".")]
        target: Any = data
        for k in keys[:-1]:
            if isinstance(target, dict):
                target = target.setdefault(k, {})
            elif isinstance(target, list) and isinstance(k, int) and k < len(target):
                target = target[k]
            else:
                raise sf.source.error(here, "no such field in the scenario")
        if isinstance(target, dict) or (isinstance(target, list) and isinstance(keys[-1], int)
                                        and keys[-1] < len(target)):
            target[keys[-1]] = value
        else:
            raise sf.source.error(here, "no such field in the scenario")
        source.options[tuple(keys)] = f"{sf.source.filename}:{line}: variant {variant.name!r}"
    return parse_scenario(data, source)


WORKLOAD_BUILDERS = {
    "burst_resize": burst_resize.workload,
    "concurrent_probe": concurrent_probe.workload,
    "gil_antagonist": gil_antagonist.workload,
    "seed_concurrency": seed_concurrency.workload,
    "mooncake": mooncake.workload,
    "op_trace": op_trace.workload,
}


def build_workload(scenario: Scenario, manager: KVCacheManager) -> Workload:
    build = WORKLOAD_BUILDERS[scenario.workload.kind]
    return build(scenario.manager, scenario.workload, manager, scenario.seed)


def _invoke_untimed(call: Call) -> tuple[object, str]:
    try:
        return call.invoke(), ""
    except KvsimError as e:
        return None, f"{type(e).__name__}: {e}"


def _occupancy(manager: KVCacheManager) -> list[dict[str, int]]:
    out = []
    for level in range(manager.layout.num_levels):
        rows = manager.get_storage_statistics(level)
        out.append({k: sum(r[k] for r in rows) for k in ("total", "free", "evictable")})
    return out


# -- the plan executor -----------------------------------------------------------------------

def _execute_plan(scenario: Scenario) -> dict:
    manager = KVCacheManager(scenario.manager)
    workload = build_workload(scenario, manager)
    records: list[dict] = []
    violations: list[dict] = []

    def run(call: Call, thread: str) -> None:
        result, error = _invoke_untimed(call)
        plan = manager.last_plan
        manager.last_plan = None  # consumed, as the other executors do (kvsim.runtime.checks)
        ok = not error and result is not False and (plan is None or plan.ok)
        records.append({
            "index": len(records), "thread": thread, "phase": call.phase, "api": call.api,
            "args": call.args, "ok": ok,
            "result": result if isinstance(result, bool) else None,
            "offloaded_pages": plan.offloaded_pages if plan else 0,
            "offloaded_bytes": plan.offloaded_bytes if plan else 0,
            "onboarded_pages": plan.onboarded_pages if plan else 0,
            "onboarded_bytes": plan.onboarded_bytes if plan else 0,
            "dropped_pages": plan.counts.pages_dropped if plan else 0,
            "copy_batches": len(plan.copies) if plan else 0,
            "counts": plan.counts.to_dict() if plan else {},
            "occupancy": _occupancy(manager),
            "error": error,
        })
        for problem in find_violations(manager):
            violations.append({"kind": "invariant", "index": len(records) - 1, "api": call.api,
                               "problem": problem})

    for call in workload.setup:
        run(call, "setup")
    for name, call in _merge_by_time(workload.make_threads()):
        run(call, name)
    per_api: dict[str, dict[str, int]] = {}
    for r in records:
        row = per_api.setdefault(r["api"], {"count": 0, "ok": 0, "failed": 0})
        row["count"] += 1
        row["ok" if r["ok"] else "failed"] += 1
    return _common(scenario, manager, records, violations) | {
        "api": per_api,
        "lock": {"modelled": False, "note": "the plan executor models no time and no lock"},
        "starvation": None,
        "deadlocks": [],
    }


def _merge_by_time(threads: dict) -> Iterator[tuple[str, Call]]:
    """The threads' calls in the order of their nominal times (``Until``/``Sleep``; calls take no
    time here), ties by thread name: a plan-only replay of concurrent threads."""
    import heapq

    clocks = {name: 0.0 for name in threads}
    heap = [(0.0, name) for name in sorted(threads)]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        for step in threads[name]:
            if isinstance(step, Call):
                yield name, step
                heapq.heappush(heap, (clocks[name], name))
                break
            if isinstance(step, Sleep):
                clocks[name] += step.seconds
            elif isinstance(step, Until):
                clocks[name] = max(clocks[name], step.time)
            heapq.heappush(heap, (clocks[name], name))
            break


# -- the sim executor --------------------------------------------------------------------------

def _execute_sim(scenario: Scenario, progress=None) -> dict:
    from kvsim.hardware import load_hardware
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.sim.executor import SimExecutor, SimOptions

    hardware = load_hardware(scenario.hardware)
    cpu = load_cpu_model(scenario.cpu_model)
    manager = KVCacheManager(scenario.manager)
    workload = build_workload(scenario, manager)
    setup_failed = []
    for call in workload.setup:
        result, error = _invoke_untimed(call)
        if error or result is False:
            setup_failed.append({"api": call.api, "args": call.args, "error": error or "False"})
    s = scenario.sim
    options = SimOptions(lock_policy=s.lock_policy, copy_path=s.copy_path,
                         kernel_ctas=s.kernel_ctas, kernel_inflight_bytes=s.kernel_inflight_bytes,
                         aligned=s.aligned, wait_for_copies=s.wait_for_copies,
                         gil_release=dict(s.gil_release), check_invariants=s.check_invariants,
                         check_lock_discipline=s.check_lock_discipline,
                         schedule_seed=s.schedule_seed, jitter=s.jitter,
                         gil_seed=scenario.seed if s.gil_seed is None else s.gil_seed)
    executor = SimExecutor(manager, hardware, cpu, options)
    executor.progress = progress
    wall0 = time.perf_counter()
    run = executor.run(workload.make_threads())
    wall = time.perf_counter() - wall0
    records = [_sim_record(c) for c in run.calls]
    deadlocks = [{"kind": "deadlock", "time": d.time, "cycle": [vars(t) for t in d.cycle]}
                 for d in run.deadlocks]
    cycle_threads = {t.thread for d in run.deadlocks for t in d.cycle}
    stuck = [vars(t) for t in run.stuck if t.thread not in cycle_threads]
    if stuck:
        deadlocks.append({"kind": "stuck", "threads": stuck})
    deadlocks += [{"kind": h.kind, "thread": h.thread, "api": h.api, "time": h.time}
                  for h in run.lock.hazards]
    out = _timed_results(scenario, manager, run, records, deadlocks, hardware) | {
        "cpu_model": cpu.name,
        "sim": {"end_time_s": run.end_time, "events": run.events_processed,
                "options": {k: (dict(v) if k == "gil_release" else v)
                            for k, v in vars(options).items()}},
        "setup_failures": setup_failed,
        "_wall_s": wall,  # not written to results.json (varies run to run)
    }
    return out


def _ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def _execute_hw(scenario: Scenario) -> dict:
    """Real threads, the real lock and (copier ``cuda``) real copies on a GPU.

    With ``hw.warmup_runs`` the whole scenario first runs that many times in this process (fresh
    manager and pools each time, no trace, no verification) and those runs are discarded."""
    from dataclasses import replace

    quiet = replace(scenario, hw=replace(scenario.hw, record_trace=None, verify=False,
                                         warmup_runs=0))
    for _ in range(scenario.hw.warmup_runs):
        _execute_hw_once(quiet)
    return _execute_hw_once(scenario)


def _execute_hw_once(scenario: Scenario) -> dict:
    from hw.executor import HwExecutor, HwOptions, NullCopier
    from kvsim.hardware import load_hardware

    hardware = load_hardware(scenario.hardware)
    manager = KVCacheManager(scenario.manager)
    workload = build_workload(scenario, manager)
    s, h = scenario.sim, scenario.hw
    recorder = None
    if h.record_trace:
        from kvsim.runtime.recording import to_trace_op
        from kvsim.traces.op_trace import OpTraceWriter

        recorder = OpTraceWriter(h.record_trace)
    setup_failed, unrecorded_setup = [], 0
    for call in workload.setup:
        result, error = _invoke_untimed(call)
        if error or result is False:
            setup_failed.append({"api": call.api, "args": call.args, "error": error or "False"})
        if recorder is not None:  # setup at t = 0 on its own thread; the threads start 1 s later
            op = to_trace_op(call, "setup", 0.0, not error and result is not False, result, error,
                             None)
            if op is None:
                unrecorded_setup += 1
            else:
                recorder.write(op)
    pools = None
    if h.copier == "cuda":
        from hw.copier import PoolCopier
        from hw.pools import HostDevicePools

        pools = HostDevicePools(manager.layout, [lv.quota_bytes for lv in scenario.manager.levels],
                                device=h.device, hardware=hardware)
        copier = PoolCopier(pools, hardware, s.copy_path, verify=h.verify, ctas=s.kernel_ctas,
                            inflight_bytes=s.kernel_inflight_bytes)
    else:
        copier = NullCopier()
    # Per-call checks cost real time inside the measured calls: only in --verify runs.
    options = HwOptions(lock_policy=s.lock_policy, wait_for_copies=s.wait_for_copies,
                        check_invariants_per_call=h.verify and s.check_invariants,
                        check_lock_discipline=h.verify and s.check_lock_discipline)
    executor = HwExecutor(manager, copier, options, recorder=recorder, record_offset_s=1.0)
    try:
        run = executor.run(workload.make_threads(), warm_gpu_ms=h.warm_gpu_ms)
        if recorder is not None:
            recorder.close()
    finally:
        if pools is not None:
            pools.close()
    records = [_sim_record(c) for c in run.calls]
    deadlocks = [{"kind": "stuck", "threads": run.stuck}] if run.stuck else []
    out = _timed_results(scenario, manager, run, records, deadlocks, hardware) | {
        "hw": {"copier": copier.name, "verify": h.verify, "thread_errors": run.errors,
               "pages_verified": getattr(copier, "pages_verified", 0),
               "pages_signed": getattr(copier, "pages_signed", 0),
               "end_time_s": run.end_time,
               "recorded_trace": h.record_trace,
               "warmup_runs": h.warmup_runs, "warm_gpu_ms": h.warm_gpu_ms,
               "sm_clock_mhz_at_start": getattr(copier, "sm_clock_mhz_at_start", None),
               "unrecorded_calls": executor.unrecorded + unrecorded_setup if recorder else None},
        "setup_failures": setup_failed,
    }
    return out


def _timed_results(scenario: Scenario, manager: KVCacheManager, run, records: list[dict],
                   deadlocks: list[dict], hardware) -> dict:
    """The results both timed executors (sim, hw) share, from a run's records."""
    from kvsim.runtime import metrics

    lock = metrics.lock_summary(run)
    out = _common(scenario, manager, records, run.violations) | {
        "api": metrics.per_api(run.calls),
        "lock": lock,
        "starvation": lock["starvation"],
        "deadlocks": deadlocks,
        "link": metrics.link_summary(run),
        "copies": metrics.copies_summary(run),
        "hardware": hardware.name,
    }
    if any(c.api == "KVCacheManager.probe_reuse" for c in run.calls):
        out["probe"] = metrics.probes_during_holds(run)
    if run.thread_starts:  # when the main thread started each workload thread, and it ran
        out["thread_starts"] = {t: {"start_called_ms": _ms(v[0]),
                                    "began_ms": _ms(v[1]) if len(v) > 1 else None}
                                for t, v in sorted(run.thread_starts.items())}
    return out


def _sim_record(c) -> dict:
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


def _common(scenario: Scenario, manager: KVCacheManager, records: list[dict],
            violations: list[dict]) -> dict:
    growth = [r for r in records if r["phase"] == "growth"]
    committed = manager.get_committed_stats()["life_cycles"]
    reused = sum(lc["reused_blocks"] for lc in committed)
    missed = sum(lc["missed_blocks"] for lc in committed)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "scenario": {"name": scenario.name, "file": scenario.source_file, "seed": scenario.seed,
                     "description": scenario.description, "workload": scenario.workload.kind},
        "executor": scenario.executor,
        "offload": {"pages": sum(r["offloaded_pages"] for r in records),
                    "bytes": sum(r["offloaded_bytes"] for r in records),
                    "growth_pages": sum(r["offloaded_pages"] for r in growth),
                    "growth_bytes": sum(r["offloaded_bytes"] for r in growth)},
        "onboard": {"pages": sum(r["onboarded_pages"] for r in records),
                    "bytes": sum(r["onboarded_bytes"] for r in records)},
        "reuse": {"reused_blocks": reused, "missed_blocks": missed,
                  "hit_rate": reused / (reused + missed) if reused + missed else None},
        "violations": violations,
        "levels": list(manager.layout.level_names),
        "calls": records,
    }


def execute(scenario: Scenario, progress=None) -> dict:
    """Run one scenario (no variants); returns its results object."""
    if scenario.executor == "sim":
        return _execute_sim(scenario, progress)
    if scenario.executor == "hw":
        return _execute_hw(scenario)
    return _execute_plan(scenario)


# -- variants ---------------------------------------------------------------------------------

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


def run_scenario(sf: ScenarioFile, progress=None) -> dict:
    """The scenario as written, plus each variant's summary."""
    results = execute(sf.base, progress)
    if sf.variants:
        results["variants"] = {}
        for i, (variant, scenario) in enumerate(sf.variants):
            if progress is not None:
                progress(f"variant {i + 1}/{len(sf.variants)}: {variant.name}")
            v_results = execute(scenario)
            summary = variant_summary(v_results, variant)
            results["variants"][variant.name] = summary
            results.setdefault("_variant_results", {})[variant.name] = v_results
    return results


# -- output -------------------------------------------------------------------------------------

def _calls_csv(results: dict) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in results["calls"]:
        writer.writerow({k: r.get(k, "") for k in CSV_FIELDS})
    return buf.getvalue()


def public(results: dict) -> dict:
    """The results object without run-to-run varying or bulky private fields."""
    return {k: v for k, v in results.items() if not k.startswith("_")}


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def results_json(results: dict) -> str:
    """``results`` as strict JSON (no NaN or Infinity), keys sorted: byte-identical per seed."""
    return json.dumps(_finite(public(results)), indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_results_into(results: dict, out_dir: Path) -> None:
    """Write results.json, calls.csv, the variants and the report into ``out_dir``."""
    from kvsim.report.scenario_report import write_report

    (out_dir / "results.json").write_text(results_json(results))
    (out_dir / "calls.csv").write_text(_calls_csv(results))
    for name, v_results in results.get("_variant_results", {}).items():
        vdir = out_dir / "variants" / name
        vdir.mkdir(parents=True)
        (vdir / "results.json").write_text(results_json(v_results))
        write_report(v_results, vdir)
    write_report(results, out_dir)


def write_results(results: dict, out_dir: Path) -> None:
    """Write the results directory ``out_dir``, replacing an earlier kvsim output atomically
    (:class:`kvsim.output_dir.ReplacedDir`)."""
    from kvsim.output_dir import ReplacedDir

    with ReplacedDir(out_dir) as staging:
        write_results_into(results, staging)


def missing_requirement(scenario: Scenario) -> str | None:
    """What this machine lacks to run ``scenario`` (one line saying how to get it), or None."""
    import importlib.util

    if scenario.executor == "hw" and scenario.hw.copier == "cuda":
        for module, what in (("cupy", "CuPy"), ("pynvml", "NVML's Python bindings")):
            if importlib.util.find_spec(module) is None:
                return (f"executor hw with hw.copier cuda needs {what} and an NVIDIA GPU; "
                        f"{module} is not installed: pip install -e '.[hw]' on a GPU machine "
                        "(or --set hw.copier=none: real threads and lock, no copies)")
    return None


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


def run_scenario_cli(args: argparse.Namespace) -> int:
    """``kvsim run``: everything is checked (the file, every variant, the presets, what the
    machine needs, the output directory) before the run starts; exit 2 on bad input, 1 when the
    run found invariant violations or failed calls the scenario does not expect, else 0."""
    from kvsim.output_dir import ReplacedDir

    try:
        overrides = list(args.set) + (["hw.verify=true"] if getattr(args, "verify", False) else [])
        if getattr(args, "record_trace", None):
            overrides.append(f"hw.record_trace={args.record_trace}")
        sf = load_scenario_file(args.scenario, overrides)
        for scenario in (sf.base, *(s for _, s in sf.variants)):
            missing = missing_requirement(scenario)
            if missing:
                raise KvsimError(f"{args.scenario}: {missing}")
        if sf.base.hw.record_trace:
            from kvsim.traces.op_trace import check_trace_target

            check_trace_target(sf.base.hw.record_trace, "--record-trace")
        out = Path(args.out) if args.out else Path("reports") / sf.base.name
        target = ReplacedDir(out, "--out" if args.out else "the report directory")
    except KvsimError as e:
        print(f"kvsim run: {e}", file=sys.stderr)
        return 2
    scenario = sf.base
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim run: {m}", file=sys.stderr))
    say(f"{scenario.name} ({scenario.executor} executor"
        + (f", {len(scenario.variants)} variants)" if scenario.variants else ")"))
    try:
        with target as staging:
            results = run_scenario(sf, progress=say)
            write_results_into(results, staging)
    except KvsimError as e:
        print(f"kvsim run: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_finite({k: v for k, v in public(results).items() if k != "calls"}),
                         sort_keys=True, allow_nan=False))
    failed = failed_calls(results)
    unexpected = {api: n for api, n in failed.items() if api not in scenario.expect_failures}
    say(f"{len(results['calls'])} calls, {results['offload']['pages']} pages offloaded, "
        f"{len(results['violations'])} invariant violations, {len(results['deadlocks'])} "
        f"deadlocks; report in {out}/report.md")
    if unexpected:
        listed = ", ".join(f"{api} x{n}" for api, n in unexpected.items())
        print(f"kvsim run: {sum(unexpected.values())} call(s) failed that the scenario does not "
              f"expect ({listed}); see calls.csv (declare expected ones in expect_failures)",
              file=sys.stderr)
    return 1 if results["violations"] or unexpected else 0
