"""The measured GIL hand-over: the model (kvsim.sim.gil), the modelled thread start, the
estimator (kvsim.calibration.gil_handover) and the preset fields that carry it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import simpy

from kvsim.calibration import gil_fit
from kvsim.calibration import gil_handover as gh
from kvsim.errors import ConfigError
from kvsim.hardware import load_hardware
from kvsim.model.cpu_cost import load_cpu_model
from kvsim.model.handover import Handover
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


def fixed(seconds: float, **fields) -> Handover:
    """A hand-over whose every hold lasts ``seconds`` (with one worker waiting)."""
    return Handover(hold=((0.0, 1.0), (seconds, seconds)), **fields)


def run_hogs(seed, handover=None, names=("a", "b", "c"), seconds=5.0):
    env = simpy.Environment()
    gil = Gil(env, switch_interval_s=1e9, handover=handover or fixed(0.5), seed=seed)
    log: list = []
    for n in names:
        env.process(hog(env, gil, n, seconds, log))
    env.run()
    return gil, log, env.now


def test_a_holder_is_taken_over_after_a_measured_hold_by_a_random_waiter_repeatably():
    gil, log, end = run_hogs(seed=1)
    assert end == pytest.approx(15.0)  # the work is conserved: 3 x 5 s, one at a time
    assert gil.takeovers > 20  # 15 s of holds of 0.5 s while others wait
    times = [t for _n, t in log]
    # Every hold lasts 0.5 s while others wait (the exponent is 0: however many).
    assert all(b - a == pytest.approx(0.5) for a, b in zip(times, times[1:]) if b < 10.0)
    takers = [n for n, _ in log]
    assert set(takers) == {"a", "b", "c"}
    assert run_hogs(seed=1)[1] == log  # the same seed, the same schedule
    assert run_hogs(seed=2)[1] != log  # who takes over is drawn


def test_the_waiter_exponent_shortens_or_lengthens_a_hold_with_the_waiters():
    def first_hold(exponent, waiters):
        """All start at 0, one holds, the others wait: when the first takeover comes."""
        _gil, log, _end = run_hogs(0, fixed(1.0, waiter_exponent=exponent),
                                   names=tuple(f"t{i}" for i in range(waiters + 1)), seconds=3.0)
        return log[1][1]

    assert first_hold(0.0, 3) == pytest.approx(1.0)
    assert first_hold(1.0, 3) == pytest.approx(1.0 / 3)
    assert first_hold(-0.5, 4) == pytest.approx(2.0)
    # A holder taken over queues again at once and counts among the next hold's waiters.
    _gil, log, _end = run_hogs(0, fixed(1.0, waiter_exponent=1.0), names=("a", "b"), seconds=3.0)
    assert [t for _n, t in log[:3]] == pytest.approx([0.0, 1.0, 2.0])


def test_with_a_recent_taker_share_of_one_the_last_to_wait_takes_over():
    _gil, log, _end = run_hogs(0, fixed(0.5, recent_taker_share=1.0), seconds=2.0)
    takers = [n for n, _t in log]
    # a holds first; b then c queue (in that order); c, the last to wait, takes over; then a,
    # who lost the GIL last, and so on: the oldest waiter waits longest.
    assert takers[:4] == ["a", "c", "a", "c"]


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
    gil = Gil(env, handover=fixed(1e9), seed=seed)  # takeovers never come
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
    t_main = takeover_time({"handover": fixed(1e9, starter_takeover_per_s=100.0), "seed": 0,
                            "starter": "main"}, "main", 0.001)
    assert t_main < 1.0  # 100/s: well before the worker's 10 s; a worker's hold would never end
    assert takeover_time({"handover": fixed(1e9), "seed": 0, "starter": "main"}, "main",
                         0.001) == pytest.approx(10.0)  # no rate: when the holder finishes


def python_cpu(**fields):
    """The H200 Python-manager preset with its measured hand-over replaced by ``fields``."""
    plain = {"gil_handover": None, "thread_start_us": 0.0}
    return replace(load_cpu_model("kvsim-python-h200host"), **(plain | fields))


def simulate(cpu, threads=4, probes=40, seed=0):
    manager, fillers = gh.bench_manager()
    executor = SimExecutor(manager, load_hardware("h200-sxm"), cpu,
                           SimOptions(lock_policy="writer", gil_seed=seed))
    return executor.run(gh.bench_threads(manager, fillers, threads, probes, 2048))


def test_a_python_manager_run_starts_its_threads_one_by_one_from_the_main_thread():
    handover = fixed(0.02, starter_takeover_per_s=20.0)
    run = simulate(python_cpu(thread_start_us=100.0, gil_handover=handover))
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
    plain = simulate(python_cpu(gil_handover=handover))
    assert plain.thread_starts == {}
    assert min(c.start for c in plain.calls if c.thread == "probe3") < 1e-3


def test_the_estimator_times_the_holds_on_hand_made_records():
    # t (ms): a holds 0-3 (3 calls), b took over (a still has calls) and holds 3-5, a 5-6 and
    # finishes, b 6-7 and finishes. b was started at 0.5 and ran at 0.6; a at 0 and 0.1.
    ms = 1e-3
    calls = [("a", 0.1 * ms, 1 * ms), ("a", 1 * ms, 2 * ms), ("a", 2 * ms, 3 * ms),
             ("b", 0.6 * ms, 4 * ms), ("b", 4 * ms, 5 * ms),
             ("a", 3 * ms, 6 * ms),
             ("b", 5 * ms, 7 * ms)]
    run = gh.HandoverRun(calls, {"a": (0.0, 0.1 * ms), "b": (0.5 * ms, 0.6 * ms)})
    one = gh.estimate_one(run)
    # Holds are timed between first completions: a's from 1 ms to b's 4 ms (b was waiting
    # from 0.5 ms, earlier), b's 4 -> 6 ms, a's 6 -> 7 ms; a then finished, so its last hold
    # was cut short, not taken over. b's first completion needed no Thread.start() in between
    # (that came at 0.5 ms), so the first two were worker takeovers.
    assert one["holds"] == [(pytest.approx(3 * ms), 1, True), (pytest.approx(2 * ms), 1, True),
                            (pytest.approx(1 * ms), 1, False)]
    # The main thread waited 0.1 -> 0.5 ms to start b, with one worker (a) holding, none
    # waiting (counted as one), and took the GIL over (a was mid-hold).
    assert one["starter_waits_s"] == [(pytest.approx(0.4 * ms), 1)]
    assert one["starter_takeovers"] == 1
    est = gh.estimate([run, run])
    assert est["worker_takeovers"] == 4 and est["holds"] == 6
    assert est["worker_takeover_per_s"] == pytest.approx(4 / (12 * ms))
    lo, hi = est["worker_takeover_interval_per_s"]
    assert lo < est["worker_takeover_per_s"] < hi
    # All holds had one waiter, so the exponent is not identified: the likelihood is flat and
    # the first grid point that reaches its maximum is taken.
    assert est["waiter_exponent"] == -1.0


def test_the_waiter_exponent_is_the_maximum_likelihood_one():
    # Exponential holds with hazard 10 * n ** -0.5: two waiters hold sqrt(2) times as long.
    rng = np.random.default_rng(0)
    holds = [(float(rng.exponential(1 / (10 * n ** -0.5))), n, True)
             for n in (1, 4) for _ in range(4000)]
    assert gh.waiter_exponent(holds) == pytest.approx(-0.5, abs=0.06)
    assert gh.waiter_exponent([(1.0, 2, False)]) == 0.0  # no takeover: nothing to go on


def test_the_estimator_recovers_the_holds_the_simulator_was_given():
    table = ((0.0, 0.5, 0.9, 1.0), (0.001, 0.01, 0.03, 0.06))
    cpu = python_cpu(thread_start_us=100.0,
                     gil_handover=Handover(hold=table, starter_takeover_per_s=8.0))
    est = gh.estimate(gh.simulate(cpu, runs=3, threads=6, probes=1500))
    assert est["worker_takeovers"] > 300
    assert abs(est["waiter_exponent"]) <= 0.15  # the model's holds do not depend on waiters

    def cdf(ms):  # the recovered distribution's P(hold <= ms)
        return np.interp(ms, est["hold_quantiles_ms"], est["hold_probs"])

    assert cdf(10.0) == pytest.approx(0.5, abs=0.08)
    assert cdf(30.0) == pytest.approx(0.9, abs=0.05)
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
    assert est["hold_s"] >= 0 and len(est["starter_waits_ms"]) == 2
    assert gh.thread_start_cost(samples=5)["us"] > 0


def test_cpu_presets_carry_the_gil_fields_and_reject_bad_values(tmp_path):
    data = json.loads(load_cpu_model.__globals__["CPU_PRESET_DIR"].joinpath(
        "kvsim-python-h200host.json").read_text())
    src = {"source": "test"}
    data |= {"gil_hold_ms": {"value": {"probs": [0, 0.5, 1], "quantiles_ms": [1, 5, 50]}, **src},
             "gil_hold_waiter_exponent": {"value": -0.5, **src},
             "gil_recent_taker_share": {"value": 0.3, **src},
             "gil_starter_takeover_per_s": {"value": 6.0, **src},
             "thread_start_us": {"value": 80.0, **src}}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    cpu = load_cpu_model(path)
    assert cpu.gil_handover == Handover(hold=((0.0, 0.5, 1.0), (0.001, 0.005, 0.05)),
                                        waiter_exponent=-0.5, recent_taker_share=0.3,
                                        starter_takeover_per_s=6.0)
    assert cpu.thread_start_us == 80.0
    for key, bad, message in (
            ("gil_starter_takeover_per_s", {"value": -1, **src}, "gil_starter_takeover_per_s"),
            ("gil_recent_taker_share", {"value": 1.5, **src}, "gil_recent_taker_share"),
            ("gil_hold_ms", {"value": {"probs": [0, 0.5, 1], "quantiles_ms": [1, 50, 5]}, **src},
             "gil_hold_ms"),  # falls
            ("gil_hold_ms", {"value": [1, 2]}, "gil_hold_ms")):
        path.write_text(json.dumps(data | {key: bad}))
        with pytest.raises(ConfigError, match=message):
            load_cpu_model(path)
    del data["gil_hold_ms"]
    path.write_text(json.dumps(data))
    assert load_cpu_model(path).gil_handover is None  # CPython's switch-interval rule


def test_a_simulated_run_with_the_measured_hand_over_is_repeatable():
    cpu = python_cpu(thread_start_us=100.0, gil_handover=Handover(
        hold=((0.0, 0.5, 1.0), (0.001, 0.005, 0.05)), waiter_exponent=-0.5,
        recent_taker_share=0.3, starter_takeover_per_s=50.0))

    def times(seed):
        return [(c.thread, c.start, c.end) for c in simulate(cpu, seed=seed).calls]

    assert times(3) == times(3)
    assert times(3) != times(4)


def test_validate_pools_as_many_simulated_runs_as_measured_ones(tmp_path, monkeypatch):
    """Three of call E's committed H200 probe runs (packed): three measured, so three
    predictions with their own GIL seeds, pooled."""
    from pathlib import Path

    from kvsim.calibration.validate import validate

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    measured = [root / "reports" / "validation-h200" / "call-e" / "measured" / f"probe{i}"
                for i in (6, 25, 37)]
    result = validate("scenarios/validation/h200_probe_during_resize.yaml", measured, None, None,
                      None)
    assert result["predicted_runs"] == 3
    assert result["probe"]["all"]["predicted_count"] == 3 * 8 * 400
    assert result["probe"]["all"]["measured_count"] == 3 * 8 * 400


def test_km_quantiles_are_the_kaplan_meier_estimate():
    probs = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    # No censoring: the empirical quantiles (the smallest duration reaching each probability).
    waits = [(w, True) for w in (1.0, 2.0, 3.0, 4.0)]
    assert gh.km_quantiles(waits, probs) == [1.0, 1.0, 2.0, 3.0, 4.0]
    # One cut short at 1.5 only says it was longer: 2 and 3 each carry 3/8 after it.
    cut = [(1.0, True), (1.5, False), (2.0, True), (3.0, True)]
    assert gh.km_quantiles(cut, probs) == [1.0, 1.0, 2.0, 3.0, 3.0]
    assert gh.km_quantiles([(1.0, False)], probs) is None


def test_raw_runs_load_by_thread_count():
    raw = [{"threads": 2, "calls": [["a", 0.0, 1.0]], "thread_starts": {"a": [0, 0], "b": [0, 1]}},
           {"calls": [["a", 0.0, 1.0]], "thread_starts": {"a": [0, 0], "b": [0, 1], "c": [1, 2]}}]
    runs = gh.runs_from_json(raw)
    assert sorted(runs) == [2, 3]  # without "threads": the threads started
    assert runs[2][0].calls == [("a", 0.0, 1.0)] and runs[3][0].thread_starts["c"] == (1, 2)


def test_the_python_manager_model_starves_the_writer_only_under_reader_preference():
    """Bug scenario 3 with this project's Python manager (the preset measured on the H200): the
    woken writer must get the GIL before it can take the lock, and under reader preference the
    probing threads get in first, as measured (reports/bugs/hw-vs-sim.md)."""
    from pathlib import Path

    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import run_scenario

    root = Path(__file__).resolve().parents[1]
    sf = load_scenario_file(root / "scenarios" / "bugs" / "probe_starvation.yaml",
                            ["cpu_model=kvsim-python-h200host"])
    variants = run_scenario(sf)["variants"]
    buggy = variants["buggy"]
    assert buggy["starved"] and buggy["starvation"]["readers_entered_while_waiting"] > 0
    assert not variants["fixed"]["starved"]
    assert variants["fixed"]["starvation"]["readers_entered_while_waiting"] == 0


# Probes per thread of the fit tests' "measured" runs: fewer than the benchmark's, so that they
# also check that the fit simulates the benchmark as it was measured.
FIT_PROBES = 400


def test_the_fit_finds_the_knobs_that_made_the_latencies():
    """"Measured" runs made by the simulator itself at hold scale 2 and taker share 0.5, with
    the seeds the fit uses: the fit's grid point with those knobs reproduces them exactly."""
    import math

    truth = Handover(hold=((0.0, 0.5, 1.0), (0.001, 0.004, 0.02)), starter_takeover_per_s=20.0)
    cpu = python_cpu(thread_start_us=100.0)
    made = replace(cpu, gil_handover=replace(truth, hold=(truth.hold[0], (0.002, 0.008, 0.04)),
                                             recent_taker_share=0.5))
    measured = {n: gh.simulate(made, math.ceil(1600 / (n * FIT_PROBES)), threads=n,
                               probes=FIT_PROBES, seed=1000 * n) for n in (2, 4)}
    result = gil_fit.fit(cpu, truth, measured, shares=(0.0, 0.5), exponents=(0.0,),
                         scales=(1.0, 2.0), sim_probes=1600, processes=1)
    assert (result["hold_scale"], result["recent_taker_share"]) == (2.0, 0.5)
    assert result["loss"] == 0.0 and len(result["evaluations"]) == 4
    # (the premise: the runs' count is not the default, which the fit must not fall back to)
    assert FIT_PROBES != gh.BENCH_PROBES
    assert result["probes_per_thread"] == {2: FIT_PROBES, 4: FIT_PROBES}
    assert result["handover"].hold[1] == pytest.approx((0.002, 0.008, 0.04))
    others = [r["loss"] for r in result["evaluations"] if r["loss"] > 0]
    assert len(others) == 3  # the other points miss the targets


def test_the_probes_per_thread_are_read_from_the_runs_and_must_agree():
    starts = {"a": (0.0, 0.0), "b": (0.0, 0.0)}
    run = gh.HandoverRun([("a", 0.0, 1.0), ("b", 1.0, 2.0), ("a", 2.0, 3.0), ("b", 3.0, 4.0)],
                         starts)
    assert gh.probes_per_thread([run, run]) == 2
    short = gh.HandoverRun(run.calls[:3], starts)  # b made one probe
    with pytest.raises(ValueError, match=r"different numbers of probes: \[1, 2\]"):
        gh.probes_per_thread([run, short])
    idle = gh.HandoverRun(run.calls[:2], starts | {"c": (0.0, 0.0)})  # c made none
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        gh.probes_per_thread([idle])


def test_fit_targets_count_probes_over_three_times_the_median():
    calls = [("a", 0.0, 1.0)] * 6 + [("a", 0.0, 3.5), ("a", 0.0, 5.0)]
    t = gil_fit.targets([gh.HandoverRun(calls, {})])
    assert (t.probes, t.interrupted_share, t.interrupted_median_s) == (8, 0.25, 4.25)


def test_the_starter_rate_is_estimated_at_the_exponent_the_model_scales_it_by():
    # 4 takeovers over 1 s with one worker waiting and 1 s with four: exposure 2 s at exponent
    # 0, 1 + 4 ** -1 = 1.25 s at -1.
    waits = [(1.0, 1), (1.0, 4)]
    assert gh.starter_rate(waits, 4, 0.0) == pytest.approx(2.0)
    assert gh.starter_rate(waits, 4, -1.0) == pytest.approx(3.2)
    assert gh.starter_rate([], 0, -1.0) is None
    est = {"starter_waits_ms": [[1000.0, 1], [1000.0, 4]], "starter_takeovers": 4}
    assert gh.starter_observations(est) == ([(1.0, 1), (1.0, 4)], 4)


def test_the_fit_gives_the_starter_the_rate_of_its_chosen_exponent():
    import math

    truth = Handover(hold=((0.0, 0.5, 1.0), (0.001, 0.004, 0.02)), starter_takeover_per_s=20.0,
                     waiter_exponent=-1.0)
    cpu = python_cpu(thread_start_us=100.0)
    made = replace(cpu, gil_handover=truth)
    measured = {n: gh.simulate(made, math.ceil(1600 / (n * FIT_PROBES)), threads=n,
                               probes=FIT_PROBES, seed=1000 * n) for n in (2, 4)}
    starter = ([(0.01, 1), (0.01, 3)], 2)
    result = gil_fit.fit(cpu, replace(truth, waiter_exponent=0.0), measured, shares=(0.0,),
                         exponents=(0.0, -1.0), scales=(1.0,), sim_probes=1600, processes=1,
                         starter=starter)
    assert result["waiter_exponent"] == -1.0
    rate = gh.starter_rate(*starter, -1.0)
    assert result["starter_takeover_per_s"] == pytest.approx(rate)
    assert result["handover"].starter_takeover_per_s == pytest.approx(rate)
    assert rate != pytest.approx(gh.starter_rate(*starter, 0.0))  # the exponent mattered
    without = gil_fit.fit(cpu, truth, measured, shares=(0.0,), exponents=(-1.0,), scales=(1.0,),
                          sim_probes=1600, processes=1)
    assert without["starter_takeover_per_s"] == 20.0  # no waits given: the estimate's rate


def test_the_host_speed_factor_is_the_benchmark_probe_over_its_modelled_price():
    from kvsim.calibration import host_speed

    cpu = python_cpu()
    same = host_speed.factor(cpu, {2: gh.simulate(cpu, runs=1, threads=2, probes=50)})
    assert same["factor"] == pytest.approx(1.0, rel=0.02)
    assert same["probes"] == 100
    slow = replace(cpu, per_call_us=cpu.per_call_us * 2,
                   unit_us={k: v * 2 for k, v in cpu.unit_us.items()},
                   python_call_us=cpu.python_call_us * 2)
    twice = host_speed.factor(cpu, {2: gh.simulate(slow, runs=1, threads=2, probes=50)})
    assert twice["factor"] == pytest.approx(2.0, rel=0.02)
    with pytest.raises(ValueError, match="already stretched"):
        host_speed.factor(replace(cpu, host_speed_factor=2.0), {})
    with pytest.raises(ValueError, match="no benchmark probes"):
        host_speed.factor(cpu, {})
    field = host_speed.preset_field(twice, "runs.jsonl")
    assert field["value"] == round(twice["factor"], 4) and "runs.jsonl" in field["source"]


def test_the_call_spread_is_the_probes_ratio_to_their_median_over_the_managers_share():
    from kvsim.calibration import host_speed

    cpu = python_cpu()
    (run,) = gh.simulate(cpu, runs=1, threads=2, probes=200)
    # one probe 50 medians long, as another thread's GIL hold would make it (the simulated
    # run's own takeovers make others)
    lat = sorted(end - start for _t, start, end in run.calls)
    t, start, end = run.calls[0]
    slow = gh.HandoverRun([(t, start, start + 50 * lat[len(lat) // 2])] + run.calls[1:],
                          run.thread_starts)
    spread = host_speed.call_spread(cpu, {2: [slow]})
    assert spread["probes"] == 400 and spread["upto_median_x"] is None
    share = spread["manager_share_of_probe"]
    assert 0.0 < share < 1.0
    ratios, over = np.array(spread["ratios"]), np.array(spread["probe_latency_over_median"])
    assert np.all(np.diff(ratios) >= 0) and over[spread["probs"].index(0.5)] == pytest.approx(1.0)
    # a probe r medians long adds (r - 1) medians to the manager's share of it
    assert np.allclose(ratios, np.maximum(1.0 + (over - 1.0) / share, 0.01), rtol=1e-3)
    assert over[-1] > 3.0  # the interrupted probes are in
    kept = host_speed.call_spread(cpu, {2: [slow]}, upto_median_x=3.0)
    lat = np.array([end - start for _t, start, end in slow.calls])
    assert kept["probes"] == int((lat <= 3.0 * np.median(lat)).sum()) < 400
    assert kept["probe_latency_over_median"][-1] <= 3.0
    field = host_speed.spread_field(kept, "bench.jsonl")
    assert field["value"]["ratios"] == kept["ratios"] and "over 3 medians left out" in field["source"]
    with pytest.raises(ValueError, match="over 1"):
        host_speed.call_spread(cpu, {2: [slow]}, upto_median_x=1.0)


def test_a_host_speed_factor_stretches_every_host_cost_of_a_preset(tmp_path):
    base = load_cpu_model.__globals__["CPU_PRESET_DIR"].joinpath("kvsim-python-h200host.json")
    data = json.loads(base.read_text())
    data.pop("host_speed_factor", None)
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    plain = load_cpu_model(path)
    path.write_text(json.dumps(data | {"host_speed_factor": {"value": 1.5, "source": "test"}}))
    slow = load_cpu_model(path)
    assert slow.host_speed_factor == 1.5 and plain.host_speed_factor == 1.0
    for attr in ("per_call_us", "callback_us", "python_call_us", "thread_start_us"):
        assert getattr(slow, attr) == pytest.approx(1.5 * getattr(plain, attr)), attr
    assert slow.unit_us == pytest.approx({k: 1.5 * v for k, v in plain.unit_us.items()})
    assert slow.gil_handover == plain.gil_handover  # the hand-over is timed apart
    assert slow.sources["host_speed_factor"] == "test"
    for bad in (0, -1.0):
        path.write_text(json.dumps(data | {"host_speed_factor": {"value": bad, "source": "t"}}))
        with pytest.raises(ConfigError, match=r"cpu\.json: host_speed_factor"):
            load_cpu_model(path)


def test_a_grid_whose_losses_are_all_equal_is_refused_not_fitted(monkeypatch):
    """Call 4's benchmark runs gave the same loss at all 60 points (the first point was taken
    as the fit): a flat grid now raises, naming the loss and the estimate's median hold."""
    import math

    truth = Handover(hold=((0.0, 0.5, 1.0), (0.001, 0.004, 0.02)), starter_takeover_per_s=20.0)
    cpu = python_cpu(thread_start_us=100.0)
    measured = {2: gh.simulate(replace(cpu, gil_handover=truth),
                               math.ceil(400 / (2 * FIT_PROBES)), threads=2,
                               probes=FIT_PROBES, seed=2000)}
    monkeypatch.setattr(gil_fit, "loss", lambda sim, meas: 81.5)
    with pytest.raises(gil_fit.FlatFitError, match=r"every one of the 2 grid points.*81\.5000"
                       r".*median hold: 4\.000 ms"):
        gil_fit.fit(cpu, truth, measured, shares=(0.0, 0.5), exponents=(0.0,), scales=(1.0,),
                    sim_probes=400, processes=1)
    assert gil_fit.is_flat([{"loss": 1.0}, {"loss": 1.0 + 1e-12}])
    assert not gil_fit.is_flat([{"loss": 1.0}, {"loss": 1.01}])
    assert not gil_fit.is_flat([{"loss": 3.0}])  # one point: nothing to compare


def test_the_bench_runs_tool_appends_one_run_per_thread_count_with_its_probe_count(tmp_path):
    from conftest import load_tool

    out = tmp_path / "bench.jsonl"
    tool = load_tool("gil_bench_runs")
    assert tool.main([str(out), "2", "3", "--probes", "30"]) == 0
    assert tool.main([str(out), "2", "--probes", "20"]) == 0  # appends
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["threads"], r["probes_per_thread"], len(r["calls"])) for r in rows] == \
        [(2, 30, 60), (3, 30, 90), (2, 20, 40)]
    runs = gh.runs_from_json(rows)
    assert gh.probes_per_thread(runs[3]) == 30
    with pytest.raises(ValueError, match=r"\[20, 30\]"):
        gh.probes_per_thread(runs[2])  # two runs of different lengths
    with pytest.raises(SystemExit):
        tool.main([str(out), "2", "--probes", "0"])


def test_the_spread_tool_writes_the_preset_with_the_table_and_refuses_a_cut_at_the_median(tmp_path):
    from conftest import load_tool

    bench = tmp_path / "bench.jsonl"
    assert load_tool("gil_bench_runs").main([str(bench), "2", "--probes", "40"]) == 0
    preset = Path(__file__).resolve().parents[1] / "kvsim" / "hardware" / "cpu" / "kvsim-python-h200host.json"
    tool = load_tool("call_spread_from_bench")
    out = tmp_path / "spread.json"
    assert tool.main([str(preset), str(out), str(bench), "--upto-median-x", "3"]) == 0
    written = json.loads(out.read_text())
    assert set(written) - set(json.loads(preset.read_text())) == {"call_cpu_spread"}
    assert "over 3 medians left out" in written["call_cpu_spread"]["source"]
    with pytest.raises(SystemExit):
        tool.main([str(preset), str(out), str(bench), "--upto-median-x", "1"])


def test_the_spread_tool_takes_the_probes_of_judged_runs(tmp_path):
    from conftest import load_tool

    calls = [{"thread": f"probe{i % 2}", "api": "KVCacheManager.probe_reuse",
              "start_ms": 0.1 * i, "latency_ms": 0.05 + (0.5 if i == 7 else 0.0)} for i in range(40)]
    calls.append({"thread": "resize", "api": "KvCache.resize", "start_ms": 5.0, "latency_ms": 9.0})
    run = tmp_path / "results.json"
    run.write_text(json.dumps({"calls": calls}))
    tool = load_tool("call_spread_from_bench")
    thread, start, end = tool.judged_probes(json.loads(run.read_text())).calls[7]
    assert thread == "probe1" and (start, end) == pytest.approx((0.0007, 0.00125))
    preset = Path(__file__).resolve().parents[1] / "kvsim" / "hardware" / "cpu" / "kvsim-python-h200host.json"
    out = tmp_path / "spread.json"
    assert tool.main([str(preset), str(out), str(run), "--judged"]) == 0
    spread = json.loads(out.read_text())["call_cpu_spread"]
    # 40 probes (the resize is not one), the slow one 11 medians long at the top
    assert "40 probe latencies" in spread["source"]
    assert spread["value"]["ratios"][-1] > spread["value"]["ratios"][-3] > 1.0



def test_gil_fields_are_written_only_from_holds_and_unfitted_ones_pick_a_waiter_at_random():
    """A benchmark that saw no hold ended by a waiter gives no GIL fields (the simulator keeps
    CPython's switch-interval rule); one that did, unfitted, gives a random waiter (share 0)."""
    from kvsim.calibration.cpu_fit import gil_fields

    assert gil_fields({"hold_quantiles_ms": None, "worker_takeovers": 0}, "f.json", "here") == {}
    est = {"hold_probs": [0.0, 0.5, 1.0], "hold_quantiles_ms": [1.0, 5.0, 50.0], "holds": 40,
           "worker_takeovers": 12, "waiter_exponent": -0.25, "starter_takeover_per_s": None}
    fields = gil_fields(est, "f.json", "here")
    assert fields["gil_recent_taker_share"] == {"value": 0.0,
                                                "source": "not fitted: a waiter picked at random"}
    assert fields["gil_hold_ms"]["value"] == {"probs": [0.0, 0.5, 1.0],
                                              "quantiles_ms": [1.0, 5.0, 50.0]}
    assert fields["gil_hold_waiter_exponent"]["value"] == -0.25
    assert "gil_starter_takeover_per_s" not in fields
