"""The executor's queue shortcuts (kvsim.sim.environment) change nothing but speed.

Each run below goes twice, with and without the shortcuts, and must give the same results file
byte for byte (including the SimPy event count, which counts the events a shortcut skipped):
the C++ CPU model, the Python manager's preset (GIL hand-over draws, lock re-tests, the
Condition's mutex), a deadlock, a starvation, schedule exploration (jittered delays), copies on
the stream and a timed trace replay.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REPO

from kvsim.calibration import concurrency_judge as cj
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.results import results_json
from kvsim.scenario.run import execute
from kvsim.sim.environment import CountingEnvironment
from kvsim.sim.executor import SimExecutor


def _both(scenario) -> tuple[str, str]:
    assert CountingEnvironment.shortcuts
    fast = results_json(execute(scenario))
    CountingEnvironment.shortcuts = False
    try:
        slow = results_json(execute(scenario))
    finally:
        CountingEnvironment.shortcuts = True
    return fast, slow


def _variant(file: str, name: str):
    return dict((v.name, s) for v, s in load_scenario_file(REPO / file).variants)[name]


CPP_CASES = [("scenarios/bugs/gil_deadlock.yaml", "buggy"),
             ("scenarios/bugs/probe_starvation.yaml", "buggy"),
             ("scenarios/bugs/probe_drain.yaml", "fixed"),
             ("scenarios/traces/mooncake_sample.yaml", None)]


@pytest.mark.parametrize("file,variant", CPP_CASES)
def test_cpp_manager_runs_are_unchanged(file, variant):
    scenario = load_scenario_file(REPO / file).base if variant is None else _variant(file, variant)
    fast, slow = _both(scenario)
    assert fast == slow


@pytest.mark.parametrize("case", ["gil_deadlock.buggy", "seed_concurrency_tests.buggy",
                                  "probe_starvation.fixed"])
def test_python_manager_runs_are_unchanged(case):
    """The Python manager's preset: GIL hand-over draws, lock re-tests, the Condition's mutex."""
    scenario = cj.case_scenario(cj.CASE_BY_NAME[case], "sim", "kvsim-python-h200host", REPO)
    fast, slow = _both(scenario)
    assert fast == slow


def test_schedule_exploration_is_unchanged():
    scenario = _variant("scenarios/bugs/probe_starvation.yaml", "buggy")
    scenario = replace(scenario, sim=replace(scenario.sim, schedule_seed=3))
    fast, slow = _both(scenario)
    assert fast == slow


def test_the_shortcuts_are_taken():
    """Not vacuous: a timed replay's run takes most of its events by shortcut."""
    steps = []
    step = CountingEnvironment.step

    def counting(self):
        steps.append(1)
        step(self)

    scenario = load_scenario_file(REPO / "scenarios/traces/mooncake_sample.yaml").base
    CountingEnvironment.step = counting
    try:
        events = execute(scenario)["sim"]["events"]
    finally:
        CountingEnvironment.step = step
    assert len(steps) < events / 2


# -- the two shortcuts' own rules -------------------------------------------------------------------
def _inside_a_step(env: CountingEnvironment, body) -> list:
    """Run ``body(env)`` as the sole callback of an event processed by ``env.step``."""
    out: list = []
    env.timeout(0).callbacks.append(lambda _e: out.append(body(env)))
    env.step()
    return out


def test_fast_forward_stops_short_of_a_queued_event():
    env = CountingEnvironment()
    env.timeout(1.0)  # due at 1.0
    assert _inside_a_step(env, lambda e: e.fast_forward(1.0)) == [False]  # same instant: it wins
    assert env.now == 0.0
    assert _inside_a_step(env, lambda e: e.fast_forward(0.5)) == [True]
    assert env.now == 0.5
    assert env.events_processed == 3  # two steps and one skipped timeout


def test_fast_forward_needs_the_sole_callback():
    env = CountingEnvironment()
    seen = []
    event = env.timeout(0)
    event.callbacks += [lambda _e: seen.append(env.fast_forward(1.0)), lambda _e: seen.append(env.now)]
    env.step()
    assert seen == [False, 0.0]


def test_process_now_takes_only_the_next_event_nobody_waits_on():
    env = CountingEnvironment()

    def body(e):
        first = e.event().succeed()
        second = e.event().succeed()
        return e.process_now(second), e.process_now(first)

    [(second_taken, first_taken)] = _inside_a_step(env, body)
    assert (second_taken, first_taken) == (False, True)

    env = CountingEnvironment()

    def waited_on(e):
        ev = e.event().succeed()
        ev.callbacks.append(lambda _x: None)
        return e.process_now(ev)

    assert _inside_a_step(env, waited_on) == [False]

    def failed(e):
        ev = e.event().fail(RuntimeError("x"))
        ev.defused = True
        return e.process_now(ev)

    assert _inside_a_step(CountingEnvironment(), failed) == [False]


def test_succeed_now_only_when_nothing_is_due_at_this_instant():
    env = CountingEnvironment()
    assert _inside_a_step(env, lambda e: e.succeed_now()) == [True]  # an empty queue
    assert env.events_processed == 2  # the step and the event it stands for

    def due_now(e):
        e.timeout(0)  # due now: an event made now would come after it
        return e.succeed_now(), e.events_processed

    assert _inside_a_step(env, due_now) == [(False, 3)]
    env = CountingEnvironment()
    env.timeout(1.0)  # due later: nothing comes between
    assert _inside_a_step(env, lambda e: e.succeed_now()) == [True]
    seen = []
    event = CountingEnvironment().timeout(0)
    event.callbacks += [lambda _e: seen.append(event.env.succeed_now()), lambda _e: None]
    event.env.step()
    assert seen == [False]  # not the sole callback


def test_a_free_gil_is_taken_without_an_event_and_a_held_one_is_not():
    from kvsim.sim.gil import Gil

    env = CountingEnvironment()
    gil = Gil(env)
    assert gil.take_if_free("a") is False  # outside a step: a grant would be queued
    assert gil.owner is None and gil.acquisitions == 0
    assert _inside_a_step(env, lambda e: gil.take_if_free("a")) == [True]
    assert gil.owner == "a" and gil.acquisitions == 1 and not gil.is_free()
    assert _inside_a_step(env, lambda e: gil.take_if_free("b")) == [False]
    assert gil.owner == "a" and gil.acquisitions == 1


@pytest.mark.parametrize("file,variant", CPP_CASES + [
    ("scenarios/concurrency/probe_during_resize.yaml", "writer_preference"),
    ("scenarios/seed/h100_pcie_burst_resize.yaml", None)])
def test_inline_effects_change_nothing(file, variant, monkeypatch):
    """SimExecutor's inline effects (a C++ manager's Python, CPU time, lock and copies done
    without a generator where they end at once) give the results of its timed handlers, byte
    for byte; and they are taken."""
    scenario = load_scenario_file(REPO / file).base if variant is None else _variant(file, variant)
    taken = []
    python_at_once = SimExecutor._python_at_once

    def counted(self, *args):
        taken.append(1)
        return python_at_once(self, *args)

    monkeypatch.setattr(SimExecutor, "_python_at_once", counted)
    inline = results_json(execute(scenario))
    assert taken
    monkeypatch.setattr(SimExecutor, "inline_effects", False)
    taken.clear()
    assert results_json(execute(scenario)) == inline
    assert not taken


@pytest.mark.parametrize("file,variant", [("scenarios/bugs/probe_starvation.yaml", "buggy"),
                                          ("scenarios/traces/mooncake_sample.yaml", None)])
def test_uncontended_lock_grants_without_an_event_change_nothing(file, variant, monkeypatch):
    """A free lock granted on the spot (ReentrantSharedMutex.take_now) gives the results of the
    grant through an event, byte for byte; it is taken with the shortcuts, never without."""
    from kvsim.sim.rwlock import ReentrantSharedMutex

    scenario = load_scenario_file(REPO / file).base if variant is None else _variant(file, variant)
    taken = []
    take_now = ReentrantSharedMutex.take_now

    def counted(self, *args):
        taken.append(CountingEnvironment.shortcuts)
        return take_now(self, *args)

    monkeypatch.setattr(ReentrantSharedMutex, "take_now", counted)
    fast, slow = _both(scenario)
    assert fast == slow
    assert taken and all(taken)  # taken on the fast run only
