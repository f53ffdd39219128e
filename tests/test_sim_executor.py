"""The SimPy executor end to end, on toy hardware with hand-checkable costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import execute

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """\
name: toy_sim
executor: sim
hardware: toy-hardware.json
cpu_model: toy-cpu.json
sim:
  lock_policy: {policy}
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [32 KiB, 32 KiB]
  levels:
    - {{name: gpu, quota_bytes: 4 MiB}}
    - {{name: host, quota_bytes: 64 MiB}}
workload:
{workload}
"""

BURST = """\
  kind: burst_resize
  history_tokens: 160
  capacity_tokens: 160
  filler_requests: 2
"""

PROBE = """\
  kind: concurrent_probe
  probe_threads: 8
  probes_per_thread: 25
  probe_tokens: 128
  resize_start_us: 5
  background:
    history_tokens: 160
    capacity_tokens: 160
    filler_requests: 2
"""

# One probing thread, a probe every millisecond, the resize long after: no contention.
ONE_PROBER = PROBE.replace("probe_threads: 8", "probe_threads: 1").replace(
    "resize_start_us: 5", "resize_start_us: 1000000") + "  probe_interval_us: 1000\n"


def scenario(tmp_path, workload=BURST, policy="reader", extra=""):
    path = DATA / f"_{tmp_path.name}.yaml"
    path.write_text(SCENARIO.format(policy=policy, workload=workload) + extra)
    try:
        return load_scenario_file(path)
    finally:
        path.unlink()


def test_burst_resize_latency_is_the_sum_of_its_formula_terms(tmp_path):
    results = execute(scenario(tmp_path).base)
    (call,) = [c for c in results["calls"] if c["phase"] == "growth"]
    # 40 blocks of 64 KiB on a 64-page GPU tier filled with 64 committed pages: 40 evicted.
    assert call["offloaded_pages"] == 40
    counts = call["counts"]
    assert counts["pages_allocated"] == 40 and counts["pages_migrated"] == 40
    cpu_us = 1.0 + 0.5 * 40 + 1.0 * 40 + 0.1 * counts["stats_scan_units"]
    assert call["cpu_ms"] == pytest.approx(cpu_us / 1e3)
    submit_us = 5.0 + 0.5 * 40  # ce-batch on the toy PCIe link: per call + per descriptor
    assert call["submit_ms"] == pytest.approx(submit_us / 1e3)
    python_us = 2.0  # entering and leaving the binding
    assert call["latency_ms"] == pytest.approx((cpu_us + submit_us + python_us) / 1e3)
    # Copies run after submission: 40 x 64 KiB at the toy batch curve's 50 GB/s plateau.
    copy_s = 40 * 65536 / 50e9
    assert call["copies_done_ms"] - call["lock_released_ms"] == pytest.approx(copy_s * 1e3)
    assert results["link"]["bytes"]["offload"] == 40 * 65536
    assert results["violations"] == [] and results["deadlocks"] == []


def test_waiting_for_copies_makes_the_call_include_them(tmp_path):
    sf = scenario(tmp_path, extra="")
    sf.data["sim"]["wait_for_copies"] = True
    from kvsim.scenario.schema import parse_scenario

    results = execute(parse_scenario(sf.data, sf.source))
    (call,) = [c for c in results["calls"] if c["phase"] == "growth"]
    assert call["start_ms"] + call["latency_ms"] >= call["copies_done_ms"]


def test_reader_and_writer_preference_differ_for_probes_during_a_resize(tmp_path):
    reader = execute(scenario(tmp_path, PROBE, "reader").base)
    writer = execute(scenario(tmp_path, PROBE, "writer").base)
    r_wait = reader["lock"]["starvation"]["longest_writer_wait_ms"]
    w_wait = writer["lock"]["starvation"]["longest_writer_wait_ms"]
    assert reader["lock"]["starvation"]["readers_entered_while_waiting"] > 0
    assert writer["lock"]["starvation"]["readers_entered_while_waiting"] == 0
    assert w_wait < r_wait  # writer preference bounds the resize's wait ...
    # ... and makes the probes that meet the resize wait for its hold instead
    assert writer["probe"]["during_exclusive_hold"]["count"] > 0
    assert writer["probe"]["during_exclusive_hold"]["max_ms"] >= writer["api"]["KvCache.resize"][
        "latency"]["max_ms"] - w_wait - 1e-9
    assert reader["api"]["KVCacheManager.probe_reuse"]["count"] == 200


def test_a_binding_that_keeps_the_gil_while_a_callback_needs_it_is_reported_stuck(tmp_path):
    from kvsim.hardware import load_hardware
    from kvsim.manager import KVCacheManager
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.runtime.apis import Api
    from kvsim.runtime.steps import Call, Sleep
    from kvsim.scenario.schema import parse_scenario
    from kvsim.sim.executor import SimExecutor, SimOptions

    sf = scenario(tmp_path)
    sc = parse_scenario(sf.data, sf.source)
    mgr = KVCacheManager(sc.manager)
    a = mgr.create_kv_cache(priority_callback=lambda block, lc: 50)
    b = mgr.create_kv_cache()
    assert a.resume() and b.resume() and b.resize(8)
    options = SimOptions(gil_release={"KvCache.commit": False})
    ex = SimExecutor(mgr, load_hardware(DATA / "toy-hardware.json"),
                     load_cpu_model(DATA / "toy-cpu.json"), options)

    def antagonist():  # holds the lock, then needs the GIL for its priority callback
        yield Call("t", Api.RESIZE, {}, lambda: a.resize.with_plan(40))

    def victim():  # a binding that blocks on the lock without releasing the GIL
        yield Sleep(0.5e-6)
        yield Call("t", Api.COMMIT, {}, lambda: b.commit.with_plan(list(range(8))))

    run = ex.run({"a": antagonist(), "b": victim()})
    stuck = {s.thread: s for s in run.stuck}
    assert set(stuck) == {"a", "b"}
    assert stuck["a"].waits_for == "GIL" and "manager lock (exclusive)" in stuck["a"].holds
    assert stuck["b"].waits_for == "manager lock" and "GIL" in stuck["b"].holds
    # With the fix (the binding releases the GIL first) both finish.
    mgr2 = KVCacheManager(sc.manager)
    a2 = mgr2.create_kv_cache(priority_callback=lambda block, lc: 50)
    b2 = mgr2.create_kv_cache()
    assert a2.resume() and b2.resume() and b2.resize(8)
    a, b = a2, b2
    ex2 = SimExecutor(mgr2, load_hardware(DATA / "toy-hardware.json"),
                      load_cpu_model(DATA / "toy-cpu.json"), SimOptions())
    assert ex2.run({"a": antagonist(), "b": victim()}).stuck == []


def test_sim_results_are_deterministic(tmp_path):
    import json

    from kvsim.scenario.results import public

    one = json.dumps(public(execute(scenario(tmp_path, PROBE).base)), sort_keys=True)
    two = json.dumps(public(execute(scenario(tmp_path, PROBE).base)), sort_keys=True)
    assert one == two


def test_a_threads_first_call_pays_the_cpu_presets_first_call_factor(tmp_path):
    """first_call_factor scales the host work (manager CPU and copy submission) of each workload
    thread's first call only."""
    import json

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    preset["first_call_factor"] = {"value": 3.0, "source": "test fixture"}
    slow_cpu = DATA / f"_{tmp_path.name}-cpu.json"
    slow_cpu.write_text(json.dumps(preset))
    try:
        from kvsim.scenario.schema import parse_scenario

        def run(workload, cpu):
            sf = scenario(tmp_path, workload)
            return execute(parse_scenario({**sf.data, "cpu_model": cpu}, sf.source))

        base, slow = run(BURST, "toy-cpu.json"), run(BURST, slow_cpu.name)
        probes = run(PROBE, slow_cpu.name)
    finally:
        slow_cpu.unlink()
    (b,) = [c for c in base["calls"] if c["phase"] == "growth"]
    (s,) = [c for c in slow["calls"] if c["phase"] == "growth"]
    assert s["cpu_ms"] == pytest.approx(3 * b["cpu_ms"])
    assert s["submit_ms"] == pytest.approx(3 * b["submit_ms"])
    # Later calls of a thread run at the preset's own costs: one probe thread's identical probes.
    mine = [c for c in probes["calls"] if c["thread"] == "probe0"]
    assert mine[0]["cpu_ms"] == pytest.approx(3 * mine[1]["cpu_ms"])
    assert mine[1]["cpu_ms"] == pytest.approx(mine[2]["cpu_ms"])


def test_a_call_after_a_sleep_pays_the_cpu_presets_after_sleep_time(tmp_path):
    """after_sleep_us adds host time to a thread's first call after it slept, interpolated on
    the sleep's length; back-to-back calls and presets without it pay nothing extra."""
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.scenario.schema import parse_scenario

    plain, cold = _preset_files(tmp_path, after_sleep_us=[[500, 50.0], [2000, 80.0]])
    try:
        def run(cpu):
            sf = scenario(tmp_path, ONE_PROBER)
            out = execute(parse_scenario({**sf.data, "cpu_model": cpu}, sf.source))
            return [c["latency_ms"] for c in out["calls"] if c["thread"] == "probe0"]

        base, slow = run(plain.name), run(cold.name)
        model = load_cpu_model(cold)
    finally:
        plain.unlink()
        cold.unlink()
    assert model.after_sleep_s(0.001) == pytest.approx(60e-6)  # 50 + 30 * 500 / 1500 us
    assert model.after_sleep_s(0.0002) == pytest.approx(20e-6)
    assert model.after_sleep_s(0.01) == pytest.approx(80e-6)
    assert slow[0] == pytest.approx(base[0])  # the first probe did not follow a sleep
    for b, s in zip(base[1:], slow[1:]):
        assert s - b == pytest.approx(0.060, abs=1e-9)


def test_a_call_after_a_sleep_runs_stretched_by_the_cpu_presets_after_sleep_factor(tmp_path):
    """after_sleep_factor multiplies every host cost of a thread's next call after it slept
    (interpolated on the sleep's length, from 1 at 0): the call's CPU and its Python edges; the
    first probe, which followed no sleep, runs as without it."""
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.scenario.schema import parse_scenario

    plain, cold = _preset_files(tmp_path, after_sleep_factor=[[500, 1.5], [2000, 3.0]])
    try:
        def run(cpu):
            sf = scenario(tmp_path, ONE_PROBER)
            out = execute(parse_scenario({**sf.data, "cpu_model": cpu}, sf.source))
            return [c for c in out["calls"] if c["thread"] == "probe0"]

        base, slow = run(plain.name), run(cold.name)
        model = load_cpu_model(cold)
    finally:
        plain.unlink()
        cold.unlink()
    assert model.after_sleep_stretch(0.001) == pytest.approx(2.0)  # 1.5 + 1.5 * 500 / 1500
    assert model.after_sleep_stretch(0.00025) == pytest.approx(1.25)  # from 1 at 0
    assert model.after_sleep_stretch(0.01) == pytest.approx(3.0)
    assert model.after_sleep_stretch(0.0) == 1.0
    assert slow[0]["latency_ms"] == pytest.approx(base[0]["latency_ms"])
    assert slow[0]["cpu_ms"] == pytest.approx(base[0]["cpu_ms"])
    for b, s in zip(base[1:], slow[1:]):  # each slept 1000 us: everything twice as long
        assert s["cpu_ms"] == pytest.approx(2 * b["cpu_ms"])
        assert s["latency_ms"] == pytest.approx(2 * b["latency_ms"], rel=1e-6)


def test_copy_submission_may_run_without_the_gil_and_let_other_threads_in(tmp_path):
    """copy_submit_gil_free: that share of a Python manager's copy submission runs without the
    GIL (CUDA calls). In gil_deadlock, one thread's resizes submit copies under the exclusive
    lock while the other runs Python between its calls: with the share, the other thread gets
    the GIL then, asks for the lock and waits behind the holder; without it, it never finds the
    lock held (the holder keeps the GIL to its release)."""
    import json

    from kvsim.scenario.schema import parse_scenario

    preset = json.loads((ROOT / "kvsim/hardware/cpu/kvsim-python-h200host.json").read_text())
    sf = load_scenario_file(ROOT / "scenarios/bugs/gil_deadlock.yaml")

    def exclusive_waits_ms(share: float) -> list[float]:
        path = tmp_path / f"cpu-{share}.json"
        path.write_text(json.dumps(preset | {"copy_submit_gil_free": {"value": share,
                                                                      "source": "test"}}))
        out = execute(parse_scenario({**sf.data, "cpu_model": str(path)}, sf.source))
        assert any(c["offloaded_pages"] or c["onboarded_pages"] for c in out["calls"])
        return [c["lock_wait_ms"] for c in out["calls"]
                if c["mode"] == "exclusive" and c["lock_wait_ms"] is not None]

    held, free = exclusive_waits_ms(0.0), exclusive_waits_ms(1.0)
    assert len(held) == len(free)
    assert max(held) == 0.0
    assert sum(w > 0.005 for w in free) >= 10 and max(free) > 0.05


def test_api_call_us_prices_each_call_by_the_manager_method_it_ran(tmp_path):
    """api_call_us: a call's fixed cost is its plan API's intercept (a capacity setter runs
    KvCache.resize, a destructor KvCache.close), per_call_us for a method not listed; its
    CPU time and recorded terms follow."""
    import json

    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.scenario.schema import parse_scenario

    preset = json.loads((ROOT / "kvsim/hardware/cpu/kvsim-python-h200host.json").read_text())
    sf = load_scenario_file(ROOT / "scenarios/bugs/gil_deadlock.yaml")
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(preset | {"api_call_us": {
        "value": {"KvCache.resize": 500.0, "KvCache.close": 100.0}, "source": "test"}}))
    cpu = load_cpu_model(path)
    assert cpu.api_call_us == {"KvCache.resize": 500.0 * cpu.host_speed_factor,
                               "KvCache.close": 100.0 * cpu.host_speed_factor}
    calls = execute(parse_scenario({**sf.data, "cpu_model": str(path)}, sf.source))["calls"]
    fixed = {c["api"]: c["cpu_terms_us"]["per_call"] for c in calls if c["ok"]}
    assert fixed["KvCache.resize"] == fixed["KvCache.capacity.setter"] == cpu.api_call_us[
        "KvCache.resize"]
    assert fixed["KvCache.close"] == fixed["KvCache.__del__"] == cpu.api_call_us["KvCache.close"]
    assert fixed["KVCacheManager.create_kv_cache"] == fixed["KvCache.resume"] == cpu.per_call_us
    for c in calls:  # the call's CPU is its terms (no spread, no first-call factor here: > =)
        if c["ok"] and c["api"] == "KvCache.close":
            assert c["cpu_ms"] * 1e3 >= sum(c["cpu_terms_us"].values()) - 1e-6


BAD_OPTIONAL_FIELDS = [
    *(("after_sleep_us", bad) for bad in ([[0, 5.0]], [[500, 5.0], [400, 6.0]], [[500, -1.0]],
                                          [[500]], [])),
    *(("after_sleep_factor", bad) for bad in ([[0, 1.5]], [[500, 1.5], [400, 2.0]],
                                              [[500, 0.0]], [[500]], [])),
    *(("copy_submit_gil_free", bad) for bad in (1.5, -0.1, True, "half")),
    *(("api_call_us", bad) for bad in ({"KvCache.capacity.setter": 5.0}, {"Nope.call": 5.0},
                                       {"KvCache.resize": -1.0}, {"KvCache.resize": True}, 7.0)),
]


@pytest.mark.parametrize(("key", "bad"), BAD_OPTIONAL_FIELDS)
def test_a_bad_optional_cpu_field_is_refused_naming_the_file_and_key(tmp_path, key, bad):
    import json

    from kvsim.errors import ConfigError
    from kvsim.model.cpu_cost import load_cpu_model

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    preset[key] = {"value": bad, "source": "test fixture"}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(preset))
    with pytest.raises(ConfigError, match=rf"cpu\.json: {key}[.:]"):
        load_cpu_model(path)


def _preset_files(tmp_path, **fields):
    """toy-cpu as a Python manager's preset, plain and with ``fields`` ({"value", "source"})."""
    import json

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    preset["holds_gil"] = True
    # a measured-style GIL hand-over: a holder is taken over after 2-4 us while others wait, so
    # readers hold the lock without the GIL and a writer waits for them
    preset["gil_hold_ms"] = {"value": {"probs": [0, 1], "quantiles_ms": [0.002, 0.004]},
                             "source": "test fixture"}
    plain = DATA / f"_{tmp_path.name}-plain.json"
    plain.write_text(json.dumps(preset))
    for k, v in fields.items():
        preset[k] = {"value": v, "source": "test fixture"}
    other = DATA / f"_{tmp_path.name}-with.json"
    other.write_text(json.dumps(preset))
    return plain, other


def _run_with(tmp_path, workload, cpu, policy="reader"):
    from kvsim.scenario.schema import parse_scenario

    sf = scenario(tmp_path, workload, policy)
    return execute(parse_scenario({**sf.data, "cpu_model": cpu}, sf.source))


def _runs_without_and_with(tmp_path, workload, policy="reader", with_runs=1, **fields):
    """``workload`` run with toy-cpu as a Python manager's preset, plain and (``with_runs``
    times) with ``fields``."""
    plain, other = _preset_files(tmp_path, **fields)
    try:
        return (_run_with(tmp_path, workload, plain.name, policy),
                *(_run_with(tmp_path, workload, other.name, policy) for _ in range(with_runs)))
    finally:
        plain.unlink()
        other.unlink()



def test_lock_test_us_moves_the_acquire_between_request_and_grant(tmp_path):
    """An uncontended Python lock: lock_test_us lies between the lock's request and its grant,
    and comes out of python_call_us, so the call takes as long as without it."""
    base, test = _runs_without_and_with(tmp_path, ONE_PROBER, lock_test_us=0.5)
    b = [c for c in base["calls"] if c["thread"] == "probe0"]
    t = [c for c in test["calls"] if c["thread"] == "probe0"]
    assert len(b) == len(t) == 25
    for x, y in zip(b, t):
        assert x["lock_wait_ms"] == pytest.approx(0.0, abs=1e-12)
        assert y["lock_wait_ms"] == pytest.approx(0.0005, abs=1e-9)
        assert y["latency_ms"] == pytest.approx(x["latency_ms"], abs=1e-9)


def _first_release_to_grant_ms(results):
    """For each exclusive call that waited for another thread's hold: its grant less the first
    release of such a hold during its wait (the earliest that can have woken it)."""
    calls = [c for c in results["calls"] if c["lock_granted_ms"] is not None]
    out = []
    for w in calls:
        if w["mode"] != "exclusive":
            continue
        rel = [c["lock_released_ms"] for c in calls if c["thread"] != w["thread"]
               and c["lock_granted_ms"] < w["lock_granted_ms"]
               and c["lock_released_ms"] > w["lock_requested_ms"]]
        if rel and w["lock_granted_ms"] > w["lock_requested_ms"]:
            out.append(w["lock_granted_ms"] - min(rel))
    return out


def test_lock_wake_us_delays_a_woken_writer_after_the_first_release(tmp_path):
    """A writer that waited for readers is granted no sooner than lock_wake_us after the first
    release during its wait (a release wakes it; it re-tests lock_wake_us later); without the
    term, sooner than that (writer preference: no reader overtakes it)."""
    policy = "writer"
    base, slow = _runs_without_and_with(tmp_path, PROBE, policy, lock_wake_us=40.0)
    before, after = _first_release_to_grant_ms(base), _first_release_to_grant_ms(slow)
    assert before and after  # the writers did wait for readers
    assert min(before) < 0.040
    assert not slow["deadlocks"]
    assert min(after) >= 0.040 - 1e-9
    assert slow["starvation"]["longest_writer_wait_ms"] >= 0.040


@pytest.mark.parametrize("key", ["lock_test_us", "lock_wake_us"])
def test_a_negative_lock_term_is_refused_naming_the_file_and_key(tmp_path, key):
    import json

    from kvsim.errors import ConfigError
    from kvsim.model.cpu_cost import load_cpu_model

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    preset[key] = {"value": -1.0, "source": "test fixture"}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(preset))
    with pytest.raises(ConfigError, match=rf"cpu\.json: {key}: "):
        load_cpu_model(path)


def test_sleep_retakes_gil_puts_the_wait_for_the_gil_before_the_calls_start(tmp_path):
    """sleep_retakes_gil: a sleep ends only when its thread holds the GIL again (time.sleep does),
    so every call after a sleep starts holding it: its first Python takes python_call_us / 2 and
    its lock request follows at once; without the switch some such calls wait for the GIL inside."""
    paced = PROBE + "  probe_interval_us: 3\n"
    base, moved = _runs_without_and_with(tmp_path, paced, sleep_retakes_gil=True)

    def pre_ms(results):
        out = []
        for t in {c["thread"] for c in results["calls"] if c["thread"].startswith("probe")}:
            mine = sorted((c for c in results["calls"] if c["thread"] == t),
                          key=lambda c: c["start_ms"])
            out += [c["lock_requested_ms"] - c["start_ms"] for c in mine[1:]]
        return out

    half_ms = 2.0 / 2 * 1e-3  # toy-cpu's python_call_us / 2
    assert max(pre_ms(base)) > half_ms + 1e-6
    assert pre_ms(moved) == pytest.approx([half_ms] * len(pre_ms(moved)), abs=1e-9)
    assert not moved["deadlocks"] and all(c["ok"] for c in moved["calls"])


def test_cond_mutex_blocked_threads_are_woken_one_per_release_in_order():
    """The Condition's mutex: taken at once when free; a release wakes the first blocked thread;
    a woken thread that lost the race is first in line again."""
    import simpy

    from kvsim.sim.rwlock import CondMutex

    m = CondMutex(simpy.Environment())
    assert m.take("a") and not m.take("b")
    b, c = m.block("b"), m.block("c")
    m.release("a")
    assert b.triggered and not c.triggered and m.owner is None
    assert m.take("d")  # a thread holding the GIL takes it before the woken b runs
    b2 = m.block("b", first=True)
    m.release("d")
    assert b2.triggered and not c.triggered and m.blocks == 2
    with pytest.raises(RuntimeError):
        m.release("x")


def test_lock_mutex_costs_nothing_uncontended_and_blocks_under_contention(tmp_path):
    """lock_mutex: one thread alone pays its lock test and release out of python_call_us (the same
    latency as without the mutex); eight threads whose GIL changes hands every 2-4 us find the
    mutex held and block on it, so probes take longer; every call still succeeds, no deadlock."""
    import json

    import numpy as np

    from kvsim.model.cpu_cost import load_cpu_model

    plain, terms = _preset_files(tmp_path, lock_test_us=0.4)
    preset = json.loads(terms.read_text())
    for k, v in (("lock_release_us", 0.4), ("lock_mutex", True)):
        preset[k] = {"value": v, "source": "test fixture"}
    mutex = DATA / f"_{tmp_path.name}-mutex.json"
    mutex.write_text(json.dumps(preset))
    try:
        assert load_cpu_model(mutex).lock_mutex and not load_cpu_model(terms).lock_mutex
        alone = [_run_with(tmp_path, ONE_PROBER, p.name) for p in (terms, mutex)]
        busy = [_run_with(tmp_path, PROBE, p.name, "writer") for p in (terms, mutex)]
    finally:
        for p in (plain, terms, mutex):
            p.unlink()
    a, b = ([c for c in r["calls"] if c["thread"] == "probe0"] for r in alone)
    assert len(a) == len(b) == 25
    for x, y in zip(a, b):
        assert y["latency_ms"] == pytest.approx(x["latency_ms"], abs=1e-9)
        assert y["lock_wait_ms"] == pytest.approx(0.0004, abs=1e-9)
    for r in busy:
        assert not r["deadlocks"] and all(c["ok"] for c in r["calls"])

    def p50(r):
        return float(np.median([c["latency_ms"] for c in r["calls"]
                                if c["api"] == "KVCacheManager.probe_reuse"]))

    assert p50(busy[1]) > p50(busy[0])


def test_a_bad_lock_mutex_switch_is_refused_naming_the_file_and_key(tmp_path):
    import json

    from kvsim.errors import ConfigError
    from kvsim.model.cpu_cost import load_cpu_model

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    preset["lock_mutex"] = {"value": 1, "source": "test fixture"}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(preset))
    with pytest.raises(ConfigError, match=r"cpu\.json: lock_mutex: "):
        load_cpu_model(path)


def test_lock_retest_us_prices_a_woken_waiters_retest_apart_from_the_first_test(tmp_path):
    """lock_retest_us: a writer woken by a release re-tests for that long (holding the GIL), so
    it is granted no sooner than lock_retest_us after the first release during its wait; the
    first test still costs lock_test_us."""
    plain, lock = _preset_files(tmp_path, lock_test_us=0.5, lock_retest_us=40.0)
    try:
        slow = _run_with(tmp_path, PROBE, lock.name, "writer")
    finally:
        plain.unlink()
        lock.unlink()
    after = _first_release_to_grant_ms(slow)
    assert after and min(after) >= 0.040 - 1e-9
    assert not slow["deadlocks"] and all(c["ok"] for c in slow["calls"])


def test_call_cpu_spread_scales_each_calls_cpu_by_a_seeded_draw(tmp_path):
    """call_cpu_spread: each manager call's modelled CPU is multiplied by a draw from the table
    (here 1x-3x), the same draws for the same seed; without it every probe costs the same."""
    runs = _runs_without_and_with(tmp_path, ONE_PROBER, with_runs=2,
                                  call_cpu_spread={"probs": [0, 1], "ratios": [1.0, 3.0]})

    def cpu(r):
        return [c["cpu_ms"] for c in r["calls"] if c["thread"] == "probe0"]

    base = cpu(runs[0])
    assert len(base) == 25 and max(base) == pytest.approx(min(base))  # identical probes
    ratios = [x / base[0] for x in cpu(runs[1])]
    assert all(1.0 - 1e-9 <= x <= 3.0 + 1e-9 for x in ratios) and max(ratios) - min(ratios) > 0.5
    assert cpu(runs[1]) == cpu(runs[2])
    lat = {i: [c["latency_ms"] for c in r["calls"] if c["thread"] == "probe0"]
           for i, r in enumerate(runs)}
    # the latency carries the spread CPU: longer calls by exactly their extra CPU
    assert [b - a for a, b in zip(lat[0], lat[1])] == \
        pytest.approx([x - y for x, y in zip(cpu(runs[1]), base)], abs=1e-9)


def test_a_call_cpu_spread_that_is_not_a_rising_table_of_positive_ratios_is_refused(tmp_path):
    import json

    from kvsim.errors import ConfigError
    from kvsim.model.cpu_cost import cpu_model_from_dict

    preset = json.loads((DATA / "toy-cpu.json").read_text())
    for bad in ({"probs": [0, 1], "ratios": [0.0, 2.0]}, {"probs": [0, 1], "ratios": [2.0, 1.0]},
                {"probs": [0, 0.5], "ratios": [1.0, 2.0]}, {"probs": [0, 1]}):
        with pytest.raises(ConfigError, match=r"cpu\.json: call_cpu_spread: write .*ratios.* "
                                              r"> 0 not falling"):
            cpu_model_from_dict(preset | {"call_cpu_spread": {"value": bad, "source": "t"}},
                                tmp_path / "cpu.json")
    ok = cpu_model_from_dict(preset | {"call_cpu_spread": {
        "value": {"probs": [0, 0.5, 1], "ratios": [0.8, 1.0, 2.5]}, "source": "bench"}},
        tmp_path / "cpu.json")
    assert ok.call_cpu_spread == ((0.0, 0.8), (0.5, 1.0), (1.0, 2.5))
    assert ok.sources["call_cpu_spread"] == "bench"


def test_sleep_overshoot_us_lengthens_each_sleep_by_a_seeded_draw(tmp_path):
    """sleep_overshoot_us: each sleep lasts longer by a draw from the table (here 100-300 us),
    the same draws for the same seed; without it a sleep lasts as asked."""
    runs = _runs_without_and_with(tmp_path, ONE_PROBER, with_runs=2,
                                  sleep_overshoot_us={"probs": [0, 1],
                                                      "quantiles_us": [100.0, 300.0]})

    def gaps(r):
        mine = sorted((c for c in r["calls"] if c["thread"] == "probe0"), key=lambda c: c["start_ms"])
        return [b["start_ms"] - a["start_ms"] - a["latency_ms"] for a, b in zip(mine, mine[1:])]

    assert gaps(runs[0]) == pytest.approx([1.0] * 24, abs=1e-9)
    g = gaps(runs[1])
    assert all(1.1 - 1e-9 <= x <= 1.3 + 1e-9 for x in g) and max(g) - min(g) > 0.05
    assert g == gaps(runs[2])


def test_lock_first_test_us_prices_each_threads_first_acquire_apart_from_later_ones(tmp_path):
    """lock_first_test_us: a thread's first test of a free lock takes that long, later tests
    lock_test_us; without it every test takes lock_test_us. The lone prober (no contention)
    shows it in its call records' lock waits, and the resize thread's one acquire too."""
    plain, first = _runs_without_and_with(tmp_path, ONE_PROBER, lock_test_us=2.0,
                                          lock_first_test_us=15.0)

    def waits_us(r, thread):
        return [c["lock_wait_ms"] * 1e3 for c in r["calls"] if c["thread"] == thread]

    assert waits_us(plain, "probe0") == pytest.approx([0.0] * 25, abs=1e-6)  # no lock test
    probe = waits_us(first, "probe0")
    assert probe[0] == pytest.approx(15.0) and probe[1:] == pytest.approx([2.0] * 24)
    assert waits_us(first, "resize") == pytest.approx([15.0])
    assert all(c["ok"] for c in first["calls"])


def test_lock_test_us_alone_prices_every_acquire_the_same(tmp_path):
    _plain, same = _runs_without_and_with(tmp_path, ONE_PROBER, lock_test_us=2.0)
    waits = [c["lock_wait_ms"] * 1e3 for c in same["calls"]]
    assert waits == pytest.approx([2.0] * len(waits)) and len(waits) == 26
