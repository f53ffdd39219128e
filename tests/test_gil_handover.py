"""The measured GIL hand-over: the model (kvsim.sim.gil), the modelled thread start, the
estimator (kvsim.calibration.gil_handover) and the preset fields that carry it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import simpy

from kvsim.calibration import gil_handover as gh
from kvsim.errors import ConfigError
from kvsim.hardware import load_hardware
from kvsim.sim.cpu_cost import load_cpu_model
from kvsim.sim.executor import MAIN_THREAD, SimExecutor, SimOptions
from kvsim.sim.gil import Gil


def hog(env, gil, name, seconds, log):
    """Runs Python for ``seconds``, honouring drop requests as SimExecutor._python does."""
    remaining = seconds
    while remaining > 1e-12:  # (float time: a remainder below that never elapses)
        yield gil.acquire(name)
        log.append((name, env.now))
        start = env.now
        yield env.timeout(remaining) | gil.drop_requested
        remaining -= env.now - start
        gil.release_fully(name)


def run_hogs(seed, rate=2.0, names=("a", "b", "c"), seconds=5.0):
    env = simpy.Environment()
    gil = Gil(env, switch_interval_s=1e9, takeover_per_s=rate, seed=seed)
    log: list = []
    for n in names:
        env.process(hog(env, gil, n, seconds, log))
    env.run()
    return gil, log, env.now


def test_waiters_take_the_gil_over_at_random_times_repeatably_per_seed():
    gil, log, end = run_hogs(seed=1)
    assert end == pytest.approx(15.0)  # the work is conserved: 3 x 5 s, one at a time
    assert gil.takeovers > 3  # a rate of 2/s per waiter over 15 s: many hand-overs
    assert gil.forced_switches == 0  # (no switch interval here: only takeovers)
    takers = [n for n, _ in log]
    assert set(takers) == {"a", "b", "c"}
    assert run_hogs(seed=1)[1] == log  # the same seed, the same schedule
    assert run_hogs(seed=2)[1] != log


def test_without_a_takeover_rate_the_switch_interval_rule_holds():
    env = simpy.Environment()
    gil = Gil(env, switch_interval_s=1.0)
    log: list = []
    for n in ("a", "b"):
        env.process(hog(env, gil, n, 3.0, log))
    env.run()
    assert gil.takeovers == 0
    assert [t for _, t in log] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # FIFO, every interval


def first_waiter_served(seed: int) -> str:
    """A holder blocks while three threads wait; the one that gets the GIL first."""
    env = simpy.Environment()
    gil = Gil(env, takeover_per_s=1e-9, seed=seed)  # takeovers practically never come
    order: list = []

    def blocker():
        yield gil.acquire("holder")
        yield env.timeout(1.0)
        gil.release_fully("holder")  # blocks: someone waiting gets the GIL

    def waiter(name):
        yield env.timeout(0.5)
        yield gil.acquire(name)
        order.append(name)
        yield env.timeout(0.1)
        gil.release_fully(name)

    env.process(blocker())
    for n in ("w1", "w2", "w3"):
        env.process(waiter(n))
    env.run()
    assert sorted(order) == ["w1", "w2", "w3"]
    return order[0]


def test_a_holder_that_blocks_hands_the_gil_to_a_random_waiter():
    assert len({first_waiter_served(seed) for seed in range(12)}) > 1  # not FIFO


def takeover_time(gil_args: dict, name: str, at: float) -> float:
    """A worker runs Python for 10 s; ``name`` asks for the GIL at ``at``: when it gets it."""
    env = simpy.Environment()
    gil = Gil(env, **gil_args)
    log: list = []
    env.process(hog(env, gil, "worker", 10.0, log))

    def late():
        yield env.timeout(at)
        yield gil.acquire(name)
        log.append((name, env.now))
        gil.release_fully(name)

    env.process(late())
    env.run()
    (t,) = [t for n, t in log if n == name]
    return t


def test_the_starter_gets_its_own_rate():
    t_main = takeover_time({"takeover_per_s": 1e-9, "seed": 0, "starter": "main",
                            "starter_takeover_per_s": 100.0}, "main", 0.001)
    assert t_main < 1.0  # 100/s: well before the worker's 10 s; the workers' rate would never


def python_cpu(**fields):
    """The H200 Python-manager preset with its measured hand-over replaced by ``fields``."""
    plain = {"gil_takeover_per_s": 0.0, "gil_starter_takeover_per_s": 0.0,
             "gil_takeover_delay": None, "thread_start_us": 0.0}
    return replace(load_cpu_model("kvsim-python-h200host"), **(plain | fields))


def simulate(cpu, threads=4, probes=40, seed=0):
    manager, fillers = gh.bench_manager()
    executor = SimExecutor(manager, load_hardware("h200-sxm"), cpu,
                           SimOptions(lock_policy="writer", gil_seed=seed))
    return executor.run(gh.bench_threads(manager, fillers, threads, probes, 2048))


def test_a_python_manager_run_starts_its_threads_one_by_one_from_the_main_thread():
    run = simulate(python_cpu(thread_start_us=100.0, gil_takeover_per_s=50.0,
                              gil_starter_takeover_per_s=20.0))
    starts = run.thread_starts
    assert sorted(starts) == ["probe0", "probe1", "probe2", "probe3"]
    ordered = [starts[f"probe{i}"] for i in range(4)]
    for called, began in ordered:
        assert began >= called + 100e-6 - 1e-12  # Thread.start() runs on the main thread first
    for (_c, began), (called_next, _b) in zip(ordered, ordered[1:]):
        assert called_next >= began  # the main thread starts the next once this one has run
    first_call = {t: min(c.start for c in run.calls if c.thread == t) for t in starts}
    assert all(first_call[t] >= starts[t][1] for t in starts)
    assert MAIN_THREAD not in {c.thread for c in run.calls}
    # Without thread_start_us every thread starts at time 0, as before.
    plain = simulate(python_cpu(gil_takeover_per_s=50.0))
    assert plain.thread_starts == {}
    assert min(c.start for c in plain.calls if c.thread == "probe3") < 1e-3


def test_the_estimator_counts_takeovers_and_exposure_on_hand_made_records():
    # t (ms): a holds 0-3 (3 calls), b took over (a still has calls) and holds 3-5, a 5-6 and
    # finishes, b 6-7 and finishes. b was started at 0.5 and ran at 0.6; a at 0 and 0.1.
    ms = 1e-3
    calls = [("a", 0.1 * ms, 1 * ms), ("a", 1 * ms, 2 * ms), ("a", 2 * ms, 3 * ms),
             ("b", 0.6 * ms, 4 * ms), ("b", 4 * ms, 5 * ms),
             ("a", 3 * ms, 6 * ms),
             ("b", 5 * ms, 7 * ms)]
    run = gh.HandoverRun(calls, {"a": (0.0, 0.1 * ms), "b": (0.5 * ms, 0.6 * ms)})
    one = gh.estimate_one(run)
    # b's first hold needs a Thread.start() between a's last completion (3 ms) and b's first
    # completion (4 ms) to be the starter's: there is none (0.5 ms), so two worker takeovers
    # (a->b at 3 ms, b->a at 5 ms); a's hand-over at 6 ms is its end.
    assert one["worker_takeovers"] == 2
    # exposure: a's hold 0.1-3 with b waiting from 0.5 (2.5 ms), b's 3-5 with a (2 ms), a's
    # 5-6 with b (1 ms), b's 6-7 with nobody.
    assert one["worker_exposure_s"] == pytest.approx(5.5 * ms)
    assert one["starter_waits_s"] == [pytest.approx(0.4 * ms)]
    # a lost the GIL at 3 ms and took it back at 5 ms; b lost it at 5 ms and got it back at 6 ms
    # because a finished (cut short: b's own delay was longer than 1 ms).
    assert sorted(one["worker_waits"]) == [(pytest.approx(1 * ms), False),
                                           (pytest.approx(2 * ms), True)]
    assert one["starter_takeovers"] == 1  # a was mid-hold when b was started
    est = gh.estimate([run, run])
    assert est["worker_takeover_per_s"] == pytest.approx(4 / (11 * ms))
    lo, hi = est["worker_takeover_interval_per_s"]
    assert lo < est["worker_takeover_per_s"] < hi


def test_the_estimator_recovers_the_rates_the_simulator_was_given():
    cpu = python_cpu(thread_start_us=100.0, gil_takeover_per_s=40.0, gil_starter_takeover_per_s=8.0)
    est = gh.estimate(gh.simulate(cpu, runs=3, threads=6, probes=1500))
    lo, hi = est["worker_takeover_interval_per_s"]
    assert lo <= 40.0 <= hi and est["worker_takeovers"] > 300
    lo, hi = est["starter_takeover_interval_per_s"]
    assert lo <= 8.0 <= hi


def test_the_benchmark_runs_on_real_threads_and_records_what_the_estimate_needs():
    runs = gh.measure(runs=1, threads=3, probes=60)
    (run,) = runs
    assert sorted(run.thread_starts) == ["probe0", "probe1", "probe2"]
    assert len(run.calls) == 180
    for called, began in run.thread_starts.values():
        assert began >= called
    est = gh.estimate(runs)
    assert est["worker_exposure_s"] >= 0 and len(est["starter_waits_ms"]) == 2
    assert gh.thread_start_cost(samples=5)["us"] > 0


def test_cpu_presets_carry_the_gil_fields_and_reject_bad_values(tmp_path):
    data = json.loads(load_cpu_model.__globals__["CPU_PRESET_DIR"].joinpath(
        "kvsim-python-h200host.json").read_text())
    src = {"source": "test"}
    data |= {"gil_takeover_per_s": {"value": 30.0, **src},
             "gil_starter_takeover_per_s": {"value": 6.0, **src},
             "thread_start_us": {"value": 80.0, **src}}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    cpu = load_cpu_model(path)
    assert (cpu.gil_takeover_per_s, cpu.gil_starter_takeover_per_s, cpu.thread_start_us) == \
        (30.0, 6.0, 80.0)
    data["gil_takeover_per_s"]["value"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="gil_takeover_per_s"):
        load_cpu_model(path)


def test_a_simulated_run_with_the_measured_hand_over_is_repeatable():
    cpu = python_cpu(thread_start_us=100.0, gil_takeover_per_s=200.0, gil_starter_takeover_per_s=50.0)

    def times(seed):
        return [(c.thread, c.start, c.end) for c in simulate(cpu, seed=seed).calls]

    assert times(3) == times(3)
    assert times(3) != times(4)


def test_validate_pools_as_many_simulated_runs_as_measured_ones(tmp_path, monkeypatch):
    """The committed H200 probe runs: five measured, so five predictions with their own GIL
    seeds, pooled."""
    from pathlib import Path

    from kvsim.calibration.validate import validate

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    measured = [root / "reports" / "validation-h200" / "measured" / f"probe{i}" for i in (1, 2, 3)]
    result = validate("scenarios/validation/h200_probe_during_resize.yaml", measured, None, None,
                      None)
    assert result["predicted_runs"] == 3
    assert result["probe"]["all"]["predicted_count"] == 3 * 8 * 400
    assert result["probe"]["all"]["measured_count"] == 3 * 8 * 400


def test_delay_quantiles_are_the_kaplan_meier_estimate():
    probs = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    # No censoring: the empirical quantiles (the smallest wait reaching each probability).
    waits = [(w, True) for w in (1.0, 2.0, 3.0, 4.0)]
    assert gh.delay_quantiles(waits, probs) == [1.0, 1.0, 2.0, 3.0, 4.0]
    # A wait cut short at 1.5 only says the delay was longer: 2 and 3 each carry 3/8 after it.
    cut = [(1.0, True), (1.5, False), (2.0, True), (3.0, True)]
    assert gh.delay_quantiles(cut, probs) == [1.0, 1.0, 2.0, 3.0, 3.0]
    assert gh.delay_quantiles([(1.0, False)], probs) is None


def test_the_simulator_draws_each_waiters_delay_from_a_measured_table():
    every_2s = {"seed": 0, "takeover_delay": ((0.0, 1.0), (2.0, 2.0))}  # every delay is 2 s
    assert Gil(simpy.Environment(), **every_2s).takeover_per_s == pytest.approx(0.5)  # 1 / mean
    assert takeover_time(every_2s, "b", 1.0) == 3.0  # queued at 1 s, took over 2 s later


def test_the_estimator_recovers_a_delay_table_the_simulator_was_given():
    table = ((0.0, 0.5, 0.9, 1.0), (0.001, 0.01, 0.1, 0.2))
    cpu = python_cpu(thread_start_us=100.0, gil_takeover_delay=table, gil_starter_takeover_per_s=10.0)
    est = gh.estimate(gh.simulate(cpu, runs=4, threads=6, probes=1500))
    assert est["worker_waits_taken_over"] > 300

    def cdf(ms):  # the recovered distribution's P(delay <= ms)
        return np.interp(ms, est["worker_delay_quantiles_ms"], est["worker_delay_probs"])

    assert cdf(10.0) == pytest.approx(0.5, abs=0.08)
    assert cdf(100.0) == pytest.approx(0.9, abs=0.05)


def test_a_preset_delay_table_is_read_and_checked(tmp_path):
    data = json.loads(load_cpu_model.__globals__["CPU_PRESET_DIR"].joinpath(
        "kvsim-python-h200host.json").read_text())
    data["gil_takeover_delay_ms"] = {"value": {"probs": [0, 0.5, 1], "quantiles_ms": [1, 5, 50]},
                                     "source": "test"}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    assert load_cpu_model(path).gil_takeover_delay == ((0.0, 0.5, 1.0), (0.001, 0.005, 0.05))
    data["gil_takeover_delay_ms"]["value"]["quantiles_ms"] = [1, 50, 5]  # falls
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="gil_takeover_delay_ms"):
        load_cpu_model(path)


def test_the_python_manager_model_starves_the_writer_only_under_reader_preference():
    """Bug scenario 3 with this project's Python manager (the preset measured on the H200): the
    woken writer must get the GIL before it can take the lock, and under reader preference the
    probing threads get in first, as measured (reports/bugs/hw-vs-sim.md)."""
    from pathlib import Path

    from kvsim.scenario.run import load_scenario_file, run_scenario

    root = Path(__file__).resolve().parents[1]
    sf = load_scenario_file(root / "scenarios" / "bugs" / "probe_starvation.yaml",
                            ["cpu_model=kvsim-python-h200host"])
    variants = run_scenario(sf)["variants"]
    buggy = variants["buggy"]
    assert buggy["starved"] and buggy["starvation"]["readers_entered_while_waiting"] > 0
    assert not variants["fixed"]["starved"]
    assert variants["fixed"]["starvation"]["readers_entered_while_waiting"] == 0
