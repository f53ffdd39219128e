"""The simulated ReentrantSharedMutex and GIL, on tiny processes asserting on a log."""

from __future__ import annotations

import pytest
import simpy

from kvsim.runtime.apis import LockMode
from kvsim.sim.gil import Gil
from kvsim.sim.rwlock import LockHazardError, ReentrantSharedMutex

EX, SH = LockMode.EXCLUSIVE, LockMode.SHARED


def holder(env, lock, log, name, mode, start, hold):
    yield env.timeout(start)
    yield lock.acquire(name, mode)
    log.append((name, "in", env.now))
    yield env.timeout(hold)
    lock.release(name)
    log.append((name, "out", env.now))


def run(policy, script):
    env = simpy.Environment()
    lock = ReentrantSharedMutex(env, policy)
    log: list = []
    for args in script:
        env.process(holder(env, lock, log, *args))
    env.run()
    return log, lock


def test_reader_preference_lets_new_readers_pass_a_waiting_writer():
    log, lock = run("reader", [("r1", SH, 0, 10), ("w", EX, 1, 1), ("r2", SH, 2, 10)])
    assert ("r2", "in", 2) in log  # entered while w waited
    assert ("w", "in", 12) in log  # only after both readers left
    assert lock.log[1].readers_passed == 1


def test_writer_preference_blocks_new_readers_behind_a_waiting_writer():
    log, _ = run("writer", [("r1", SH, 0, 10), ("w", EX, 1, 1), ("r2", SH, 2, 10)])
    assert ("w", "in", 10) in log
    assert ("r2", "in", 11) in log


def test_readers_share_and_writers_exclude_in_fifo_order():
    log, _ = run("reader", [("w1", EX, 0, 5), ("w2", EX, 1, 5), ("r1", SH, 2, 1), ("r2", SH, 2, 1)])
    assert log[:2] == [("w1", "in", 0), ("w1", "out", 5)]
    # readers enter together as soon as w1 leaves (reader preference), then w2
    assert ("r1", "in", 5) in log and ("r2", "in", 5) in log and ("w2", "in", 6) in log


def test_nested_acquisition_by_the_exclusive_owner_is_a_no_op():
    env = simpy.Environment()
    lock = ReentrantSharedMutex(env)
    got = []

    def proc():
        yield lock.acquire("t", EX)
        yield lock.acquire("t", SH)  # adjust() -> get_quota() in KVCM2
        yield lock.acquire("t", EX)
        got.append(env.now)
        lock.release("t")
        lock.release("t")
        assert lock.owner == "t"
        lock.release("t")
        assert lock.owner is None

    env.process(proc())
    env.run()
    assert got == [0]


@pytest.mark.parametrize("second, kind", [(EX, "upgrade"), (SH, "nested-shared")])
def test_upgrade_or_nesting_under_a_shared_hold_is_reported_not_hung(second, kind):
    env = simpy.Environment()
    lock = ReentrantSharedMutex(env)
    seen = []

    def proc():
        yield lock.acquire("t", SH)
        try:
            yield lock.acquire("t", second, api="KVCacheManager.resize")
        except LockHazardError as e:
            seen.append(str(e))
        lock.release("t")

    env.process(proc())
    env.run()
    assert seen and kind in seen[0]
    assert lock.hazards[0].kind == kind and lock.hazards[0].api == "KVCacheManager.resize"


def test_bad_policy_and_bad_release():
    env = simpy.Environment()
    with pytest.raises(ValueError):
        ReentrantSharedMutex(env, "fair")
    with pytest.raises(RuntimeError):
        ReentrantSharedMutex(env).release("nobody")


def test_gil_is_fifo_and_reentrant():
    env = simpy.Environment()
    gil = Gil(env)
    log = []

    def thread(name, start, hold):
        yield env.timeout(start)
        yield gil.acquire(name)
        yield gil.acquire(name)  # reentrant
        log.append((name, env.now))
        yield env.timeout(hold)
        assert gil.release_fully(name) == 2

    for args in (("a", 0, 3), ("b", 1, 1), ("c", 2, 1)):
        env.process(thread(*args))
    env.run()
    assert log == [("a", 0), ("b", 3), ("c", 4)]
    assert gil.wait_s == {"b": 2, "c": 2}


def test_a_waiter_forces_a_switch_after_the_switch_interval():
    env = simpy.Environment()
    gil = Gil(env, switch_interval_s=5.0)
    log = []

    def hog():  # runs Python for 20 s, honouring drop requests like SimExecutor._python
        remaining = 20.0
        while remaining > 0:
            yield gil.acquire("hog")
            start = env.now
            yield env.timeout(remaining) | gil.drop_requested
            remaining -= env.now - start
            gil.release_fully("hog")
            log.append(("hog-off", env.now))

    def waiter():
        yield env.timeout(1.0)
        yield gil.acquire("w")
        log.append(("w-on", env.now))
        yield env.timeout(1.0)
        gil.release_fully("w")

    env.process(hog())
    env.process(waiter())
    env.run()
    assert ("w-on", 6.0) in log  # asked at 1, no switch for 5 s: the hog drops at 6
    assert log[-1] == ("hog-off", 21.0)  # the hog resumed at 7 and finished its 20 s
    assert gil.acquisitions == 3


def recheck_run(policy):
    """A reader holds the lock; a writer queues; the reader leaves at 2 and a second reader comes
    at 2.5; the woken writer needs 1 s to run again (a Python thread waiting for the GIL)."""
    env = simpy.Environment()
    lock = ReentrantSharedMutex(env, policy, recheck=True)
    log: list = []

    def reader(name, start, hold):
        yield env.timeout(start)
        request = lock.acquire(name, SH)
        while (yield request) is None:
            request = lock.retry(name)
        log.append((name, "in", env.now))
        yield env.timeout(hold)
        lock.release(name)

    def writer():
        yield env.timeout(1.0)
        request = lock.acquire("w", EX)
        while (yield request) is None:
            yield env.timeout(1.0)  # woken: it has to run before it can test the lock again
            request = lock.retry("w")
        log.append(("w", "in", env.now))
        lock.release("w")

    env.process(reader("r1", 0.0, 2.0))
    env.process(writer())
    env.process(reader("r2", 2.5, 2.0))
    env.run()
    return log


def test_in_recheck_mode_a_woken_writer_must_run_first_and_a_reader_can_barge_in():
    # Reader preference: r2 enters at 2.5 while the woken writer is still on its way (it tests
    # at 3.0, finds r2 inside, waits for r2 to leave at 4.5 and tests again at 5.5).
    assert recheck_run("reader") == [("r1", "in", 0.0), ("r2", "in", 2.5), ("w", "in", 5.5)]
    # Writer preference: the queued writer keeps r2 out; it gets the lock when it has run (3.0),
    # and r2, woken by its release, enters then.
    assert recheck_run("writer") == [("r1", "in", 0.0), ("w", "in", 3.0), ("r2", "in", 3.0)]


def test_without_recheck_a_release_hands_the_lock_to_the_writer_at_once():
    log, _lock = run("reader", [("r1", SH, 0.0, 2.0), ("w", EX, 1.0, 1.0), ("r2", SH, 2.5, 2.0)])
    assert ("w", "in", 2.0) in log and ("r2", "in", 3.0) in log
