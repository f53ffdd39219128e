"""The hardware executor's threads, lock and recorder without a GPU (copier ``none``)."""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.scenario.load import load_scenario
from kvsim.scenario.run import execute

REPO = Path(__file__).resolve().parents[1]
BUGS = REPO / "scenarios" / "bugs"


def test_real_threads_show_reader_starvation_and_writer_preference_bounds_it():
    base = ["executor=hw", "hw.copier=none", "workload.probes_per_thread=60"]
    reader = execute(load_scenario(BUGS / "probe_drain.yaml", base + ["sim.lock_policy=reader"]))
    writer = execute(load_scenario(BUGS / "probe_drain.yaml", base + ["sim.lock_policy=writer"]))
    assert writer["starvation"]["readers_entered_while_waiting"] == 0
    assert not writer["starvation"]["starved"]
    assert reader["executor"] == writer["executor"] == "hw"
    assert reader["api"]["KVCacheManager.probe_reuse"]["count"] == 8 * 60
    assert reader["violations"] == [] and writer["violations"] == []


def test_each_call_records_its_thread_cpu_within_its_wall_time():
    """cpu_terms_us["thread_cpu"]: the manager call's time.thread_time, at most its wall time
    (cpu_ms) up to the clocks' resolution; the rest is time off the CPU inside the call."""
    run = execute(load_scenario(BUGS / "probe_drain.yaml", [
        "executor=hw", "hw.copier=none", "workload.probes_per_thread=20"]))
    timed = [c for c in run["calls"] if c["cpu_ms"] is not None]
    assert timed and all(set(c["cpu_terms_us"]) == {"thread_cpu"} for c in timed)
    # thread_time ticks coarser than perf_counter on some kernels: allow 50 us of slack
    assert all(0.0 <= c["cpu_terms_us"]["thread_cpu"] <= c["cpu_ms"] * 1e3 + 50.0 for c in timed)
    assert sum(c["cpu_terms_us"]["thread_cpu"] for c in timed) > 0.0


def test_a_recorded_hw_run_replays_in_the_simulator(tmp_path):
    trace = tmp_path / "run.jsonl"
    hw = execute(load_scenario(BUGS / "probe_drain.yaml", [
        "executor=hw", "hw.copier=none", "workload.probes_per_thread=5",
        f"hw.record_trace={trace}"]))
    assert hw["hw"]["unrecorded_calls"] == 0
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert {x["thread"] for x in lines} >= {"setup", "resize", "probe0"}
    scenario = tmp_path / "replay.yaml"
    scenario.write_text(f"""name: replay
executor: sim
hardware: h200-sxm
cpu_model: kvcm2-cpp
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [2 KiB, 2 KiB]
  levels:
    - {{name: gpu, quota_bytes: 256 KiB}}
workload:
  kind: op_trace
  trace: {trace}
""")
    sim = execute(load_scenario(scenario))
    from collections import Counter

    replayed = Counter(c["api"] for c in sim["calls"] if c["thread"] != "setup")
    measured = {api: row["count"] for api, row in hw["api"].items()}
    assert dict(replayed) == measured  # the timed calls; setup was recorded on its own thread
    assert Counter(c["thread"] for c in sim["calls"])["setup"] == len(
        [x for x in lines if x["thread"] == "setup"])
    assert all(c["ok"] for c in sim["calls"])


def test_warmup_runs_are_discarded_and_the_measured_run_is_reported(monkeypatch):
    """hw.warmup_runs runs the whole scenario first (fresh managers), then reports one run."""
    import kvsim.scenario.executors as executors

    runs = []
    real = executors._run_hw_once
    monkeypatch.setattr(executors, "_run_hw_once", lambda sc: runs.append(sc) or real(sc))
    out = execute(load_scenario(BUGS / "probe_drain.yaml", [
        "executor=hw", "hw.copier=none", "workload.probes_per_thread=5", "hw.warmup_runs=2"]))
    assert len(runs) == 3
    assert [r.hw.warmup_runs for r in runs] == [0, 0, 2]  # warm-ups do not recurse
    assert out["hw"]["warmup_runs"] == 2 and out["hw"]["warm_gpu_ms"] == 0.0
    assert out["api"]["KVCacheManager.probe_reuse"]["count"] == 8 * 5  # one run's calls


def test_host_overhead_calibration_times_the_lock_and_the_executor():
    from kvsim.calibration.host_overhead import executor_call_overhead, lock_costs

    lock = lock_costs(loops=200, repeats=3)
    assert set(lock) == {"shared", "exclusive"}
    assert all(0 < v["us"] < 1000 and len(v["samples_us"]) == 3 for v in lock.values())
    over = executor_call_overhead(calls=60)
    assert set(over["by_api_us"]) == {"KVCacheManager.probe_reuse", "KvCache.resize"}
    assert over["calls"] == 54 and over["us"] > 0
