"""The collector around simulated runs (kvsim.sim.collector): off while a run allocates, back on
after; in a command-line process, what a big run leaves moves to the oldest generation unwalked,
and the next run starts by collecting what the last one left; and no run makes reference
cycles that die while it runs (what makes turning the collector off safe)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import execute
from kvsim.sim.executor import SimExecutor

REPO = Path(__file__).resolve().parents[1]


def test_a_simulated_run_sets_up_with_the_collector_off_and_turns_it_back_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector is off for the set-up calls (a burst's thousands of radix nodes), not only
    the SimPy run, and the caller's thresholds are untouched."""
    from kvsim.scenario import executors

    seen = []
    real_setup = executors.run_setup

    def watched(calls):
        seen.append(gc.isenabled())
        return real_setup(calls)

    monkeypatch.setattr(executors, "run_setup", watched)
    before = gc.get_threshold()
    assert gc.isenabled()
    execute(load_scenario_file(REPO / "scenarios/seed/burst_resize.yaml").base)
    assert seen == [False]
    assert gc.isenabled() and gc.get_threshold() == before


def test_a_collector_turned_off_by_the_caller_stays_off() -> None:
    from kvsim.sim.collector import no_collections

    gc.disable()
    try:
        with no_collections():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_a_big_run_leaves_goes_to_the_oldest_generation_and_the_next_run_collects_it(
        ) -> None:
    """In a process with nothing frozen (a command-line run): the objects a run made that
    outnumber those alive before it leave the young generations uncollected, those of a
    smaller run stay young; either way a reference cycle the run left is freed when the next
    run starts. Where something is frozen (this test process), the frozen objects stay frozen
    and the young ones young. Run in fresh interpreters: this one has frozen its tests."""
    script = """
import gc, weakref
from kvsim.sim.collector import no_collections
class Node:
    pass
frozen_before = %s
if frozen_before:
    keep = [Node() for _ in range(10)]
    gc.freeze()
count = gc.get_freeze_count()
freed = []
def run(extra):
    with no_collections():
        made = [Node() for _ in range(extra)]
        cycle = Node()
        cycle.me = cycle
        weakref.finalize(cycle, freed.append, extra)
        return made, gc.isenabled()
def young(objects):
    ids = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
    return sum(id(o) in ids for o in objects)
alive = len(gc.get_objects()) + gc.get_freeze_count()
small, enabled_inside = run(alive // 10)
small_young = young(small)
big, _ = run(2 * alive)
freed_at_second = len(freed)
big_young = young(big)
sizes = len(small), len(big)
del small, big
run(0)
print(count, gc.get_freeze_count(), sizes[0], small_young, sizes[1], big_young,
      int(enabled_inside), freed_at_second, len(freed), int(gc.isenabled()))
"""
    for frozen_before in (False, True):
        out = subprocess.run([sys.executable, "-c", script % frozen_before], capture_output=True,
                             text=True, check=True).stdout.split()
        before, after, small, small_young, big, big_young, enabled_inside, freed_at_second, \
            freed, enabled = map(int, out)
        assert after == before
        assert enabled_inside == 0 and enabled == 1
        assert small_young == small > 0  # a smaller run's objects stay young
        if frozen_before:
            assert before > 0 and big_young == big  # left where the collector put them
        else:
            assert before == 0 and big_young == 0  # moved to the oldest generation
            assert freed_at_second == 1 and freed == 2  # each cycle freed as the next run starts


@pytest.mark.parametrize("scenario", [
    "scenarios/bugs/seed_concurrency_tests.yaml#buggy",  # lock waits: the deadlock search
    "scenarios/bugs/gil_deadlock.yaml#buggy",  # a deadlock found, the run stopped
    "scenarios/traces/mooncake_sample.yaml#base",
    "scenarios/traces/op_trace_replay.yaml#base",
    "scenarios/seed/burst_resize.yaml#base",
])
def test_a_simulated_run_makes_no_reference_cycle_that_dies_while_it_runs(
        scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every object a run drops while it runs is freed by reference counting: right after the
    executor's run (its manager, executor and records still alive), a collection finds nothing
    unreachable. (A nested function that calls itself did make such cycles, in the deadlock
    search, at every lock wait.)"""
    path, variant = scenario.split("#")
    sf = load_scenario_file(REPO / path)
    chosen = sf.base if variant == "base" else dict((v.name, s) for v, s in sf.variants)[variant]
    found = []
    real_run = SimExecutor.run

    def run(self, threads, until=None):
        gc.collect()
        result = real_run(self, threads, until)
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(type(o).__name__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        return result

    monkeypatch.setattr(SimExecutor, "run", run)
    execute(chosen)
    assert found == []


def test_the_kvsim_command_leaves_what_it_made_to_the_exit_uncollected() -> None:
    """The ``kvsim`` command (and ``python -m kvsim``) runs the command, then freezes what is
    alive, so that the interpreter's exit walks none of it; the command's output and exit
    status are those of ``main``. In a fresh interpreter: nothing frozen before."""
    script = """
import gc, sys
from kvsim.cli import console_main
sys.argv = ["kvsim", "presets", "--kind", "cpu-cost"]
before = gc.get_freeze_count()
code = console_main()
print(before, int(gc.get_freeze_count() > 0), code, file=sys.stderr)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stderr.split() == ["0", "1", "0"]
    assert "kvcm2-cpp" in done.stdout
