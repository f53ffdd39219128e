"""The lock-discipline checker, the deadlock detector, starvation and the explorer, on small
hand-made cases whose answers are known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvsim.hardware import load_hardware
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig, Outcome, Plan
from kvsim.model.cpu_cost import load_cpu_model
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Sleep, set_capacity
from kvsim.scenario.explore import explore, schedule_seeds
from kvsim.scenario.load import load_scenario_file, variant_scenario
from kvsim.scenario.run import execute
from kvsim.sim.executor import SimExecutor, SimOptions

DATA = Path(__file__).parent / "data"
BUGS = Path(__file__).resolve().parents[1] / "scenarios" / "bugs"


def executor(mgr, **options):
    return SimExecutor(mgr, load_hardware(DATA / "toy-hardware.json"),
                       load_cpu_model(DATA / "toy-cpu.json"), SimOptions(**options))


def manager(drains: bool) -> KVCacheManager:
    cfg = ManagerConfig(layers=(LayerConfig(slot_bytes=(64,)),), levels=(LevelConfig("gpu", 4 * 64),),
                        tokens_per_block=4, probe_drains_root_erasures=drains)
    mgr = KVCacheManager(cfg)
    a = mgr.create_kv_cache(reuse_scope=1)
    assert a.resume() and a.resize(16)
    a.commit(list(range(16)))
    a.close()
    b = mgr.create_kv_cache()
    assert b.resume() and b.resize(16)  # drops all four scope-1 blocks: root 1 queued for erasure
    assert mgr.tree.pending_root_erasures == [1]
    mgr._keep = b  # noqa: SLF001 - keep the cache open for the test's lifetime
    return mgr


@pytest.mark.parametrize("drains, expected", [(True, 1), (False, 0)])
def test_lock_discipline_flags_a_mutation_under_a_shared_lock(drains, expected):
    mgr = manager(drains)
    probe = Call("t", Api.PROBE_REUSE, {}, lambda: mgr.probe_reuse.with_plan([1, 2, 3, 4]))
    run = executor(mgr).run({"p": iter([probe])})
    found = [v for v in run.violations if v["kind"] == "lock-discipline"]
    assert len(found) == expected
    if found:
        v = found[0]
        assert v["api"] == "KVCacheManager.probe_reuse" and v["thread"] == "p"
        assert v["lock_held"] == "shared"
        assert set(v["state"]) == {"radix tree roots", "root-erase queue"}
        assert v["time"] > 0


def test_each_mutation_is_blamed_on_its_own_call_when_digests_are_reused():
    # The simulator reuses the last digest as the next call's "before": a mutating probe, then a
    # clean one, then an exclusive call that changes state, then a clean probe: one violation.
    mgr = manager(False)
    calls = [Call("t", Api.STATUS, {},
                  lambda: Outcome(mgr.tree.drain_root_erasures(), Plan("KvCache.status"))),
             Call("t", Api.PROBE_REUSE, {}, lambda: mgr.probe_reuse.with_plan([1, 2, 3, 4])),
             Call("t", Api.CREATE_KV_CACHE, {}, lambda: mgr.create_kv_cache.with_plan()),
             Call("t", Api.PROBE_REUSE, {}, lambda: mgr.probe_reuse.with_plan([1, 2, 3, 4]))]
    run = executor(mgr).run({"x": iter(calls)})
    found = [v for v in run.violations if v["kind"] == "lock-discipline"]
    assert [(v["index"], v["lock_held"]) for v in found] == [(0, "no")]


def test_no_lock_at_all_is_a_violation_too():
    mgr = manager(False)
    sneaky = Call("t", Api.STATUS, {},
                  lambda: Outcome(mgr.tree.drain_root_erasures(), Plan("KvCache.status")))
    run = executor(mgr).run({"x": iter([sneaky])})
    assert [v["lock_held"] for v in run.violations] == ["no"]


def test_deadlock_cycle_is_reported_and_stops_the_run():
    cfg = ManagerConfig(layers=(LayerConfig(slot_bytes=(64,)),),
                        levels=(LevelConfig("gpu", 64 * 64),), tokens_per_block=4)
    mgr = KVCacheManager(cfg)
    a = mgr.create_kv_cache(priority_callback=lambda block, lc: 50)
    b = mgr.create_kv_cache()
    assert a.resume() and b.resume() and b.resize(8)

    def antagonist():
        yield Call("t", Api.RESIZE, {}, lambda: a.resize.with_plan(40))
        yield Call("t", Api.SUSPEND, {}, a.suspend.with_plan)  # never reached

    def victim():
        yield Sleep(0.5e-6)
        yield Call("t", Api.CAPACITY_SETTER, {}, lambda: set_capacity(b, 12))

    def bystander():  # would run for a long simulated time: the deadlock stops the run early
        for _ in range(1000):
            yield Sleep(1.0)

    run = executor(mgr, gil_release={"KvCache.capacity.setter": False}).run(
        {"a": antagonist(), "b": victim(), "c": bystander()})
    (dl,) = run.deadlocks
    cycle = {t.thread: t for t in dl.cycle}
    assert set(cycle) == {"a", "b"}
    assert cycle["a"].waits_for == "GIL" and cycle["a"].holds == ["manager lock (exclusive)"]
    assert cycle["b"].waits_for == "manager lock" and cycle["b"].holds == ["GIL"]
    assert run.end_time < 1.0  # stopped at the deadlock, not after the bystander's 1000 s


def test_starvation_counts_the_wait_caused_by_overtaking_readers():
    results = execute(load_scenario_file(BUGS / "probe_drain.yaml", ["sim.lock_policy=reader"]).base)
    st = results["starvation"]
    assert st["readers_entered_while_waiting"] > 0 and st["starved"]
    assert 0 < st["wait_caused_by_overtaking_readers_ms"] <= st["longest_writer_wait_ms"]
    writer = execute(load_scenario_file(BUGS / "probe_drain.yaml", ["sim.lock_policy=writer"]).base)
    assert writer["starvation"]["readers_entered_while_waiting"] == 0
    assert not writer["starvation"]["starved"]


def test_explorer_finds_the_buggy_variant_in_every_schedule_and_the_fixed_in_none():
    sf = load_scenario_file(BUGS / "probe_drain.yaml", ["workload.probes_per_thread=3"])
    result = explore(sf, schedules=4, seed=7)
    assert result["variants"]["buggy"]["failing"] == 4
    assert result["variants"]["fixed"]["failing"] == 0
    seeds = [f["schedule_seed"] for f in result["variants"]["buggy"]["failing_schedules"]]
    assert seeds == schedule_seeds(7, 4)
    # The seed reproduces the schedule: the same findings when re-run with it.
    from dataclasses import replace

    buggy = variant_scenario(sf, sf.base.variants[0])
    again = execute(replace(buggy, sim=replace(buggy.sim, schedule_seed=seeds[0])))
    first = result["variants"]["buggy"]["failing_schedules"][0]
    assert len(again["violations"]) == first["violations"]


def test_schedules_really_differ():
    sf = load_scenario_file(BUGS / "probe_drain.yaml", ["workload.probes_per_thread=3"])
    from dataclasses import replace

    base = variant_scenario(sf, sf.base.variants[1])
    ends = {execute(replace(base, sim=replace(base.sim, schedule_seed=s)))["sim"]["end_time_s"]
            for s in (1, 2, 3)}
    assert len(ends) == 3
    same = {execute(replace(base, sim=replace(base.sim, schedule_seed=5)))["sim"]["end_time_s"]
            for _ in range(2)}
    assert len(same) == 1


def test_the_seed_concurrency_tests_pass_in_the_fixed_configuration():
    sf = load_scenario_file(BUGS / "seed_concurrency_tests.yaml", ["workload.probes_per_thread=100"])
    fixed = execute(variant_scenario(sf, next(v for v in sf.base.variants if v.name == "fixed")))
    assert all(c["ok"] for c in fixed["calls"]), [c for c in fixed["calls"] if not c["ok"]][:3]
    assert fixed["violations"] == [] and fixed["deadlocks"] == []
    assert not fixed["starvation"]["starved"]
    apis = {c["api"] for c in fixed["calls"]}
    assert {"KVCacheManager.probe_reuse", "KvCache.resize", "KVCacheManager.get_storage_statistics",
            "KVCacheManager.get_and_reset_iteration_stats", "PlannedDrop.__del__"} <= apis
    buggy = execute(variant_scenario(sf, next(v for v in sf.base.variants if v.name == "buggy")))
    assert buggy["starvation"]["starved"]


@pytest.mark.parametrize("field", ["holders", "lockers", "node", "level", "slot", "last_used",
                                   "planned_drops"])
def test_the_digest_shows_a_change_of_one_page_in_any_column(field):
    """The digest sums the page table's columns as 64-bit words (kvsim.manager.fingerprint.
    checksum): a change of one page's value in any column, whatever its width, must show."""
    from kvsim.manager.fingerprint import checksum, state_digest

    mgr = manager(False)
    before = state_digest(mgr)
    column = getattr(mgr.storage.pages, field)
    page = int(mgr._keep.held_pages()[0])  # noqa: SLF001
    column[page] += 1
    assert state_digest(mgr)["page table"] != before["page table"]
    column[page] -= 1
    assert state_digest(mgr) == before
    odd = np.arange(7, dtype=np.int8)  # not whole words: summed element by element
    assert checksum(odd) == 21 and checksum(np.arange(8, dtype=np.int8)) != checksum(odd)


def test_a_slot_allocator_change_shows_in_the_digest():
    from kvsim.manager.fingerprint import state_digest

    mgr = manager(False)
    before = state_digest(mgr)
    alloc = mgr.storage.allocators[0][0]
    slot = int(np.flatnonzero(alloc.slot_to_page >= 0)[0])
    alloc.slot_to_page[slot] += 1
    assert state_digest(mgr)["slot allocators"] != before["slot allocators"]
