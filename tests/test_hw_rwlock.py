"""The threaded ReentrantSharedMutex (hw/rwlock.py) on real Python threads: no GPU needed.

Orderings are forced with the lock's own log (a request is logged before it waits), so the tests
assert who got in before whom, never how long anything took.
"""

from __future__ import annotations

import threading

import pytest

from hw.rwlock import ThreadedSharedMutex
from kvsim.runtime.apis import LockMode
from kvsim.runtime.records import LockHazardError

EX, SH = LockMode.EXCLUSIVE, LockMode.SHARED


def start_holder(lock: ThreadedSharedMutex, name: str, mode: LockMode, leave: threading.Event):
    def body():
        lock.acquire(name, mode)
        leave.wait()
        lock.release(name)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def wait_until_requested(lock: ThreadedSharedMutex, count: int) -> None:
    done = threading.Event()
    for _ in range(10_000):
        if len(lock.log) >= count:
            return
        done.wait(0.001)
    raise AssertionError(f"only {len(lock.log)} of {count} requests reached the lock")


def acquisition(lock, thread):
    return next(a for a in lock.log if a.thread == thread)


@pytest.mark.parametrize("policy", ["reader", "writer"])
def test_a_waiting_writer_and_a_later_reader_are_ordered_by_the_policy(policy):
    lock = ThreadedSharedMutex(policy)
    lock.acquire("r1", SH)
    w_leaves, r2_leaves = threading.Event(), threading.Event()
    w = start_holder(lock, "w", EX, w_leaves)
    wait_until_requested(lock, 2)
    r2 = start_holder(lock, "r2", SH, r2_leaves)
    wait_until_requested(lock, 3)
    if policy == "reader":
        r2_leaves.set()
        r2.join(timeout=30)
        assert not r2.is_alive(), "reader preference: r2 passes the waiting writer"
        assert acquisition(lock, "w").granted is None
        lock.release("r1")
        w_leaves.set()
        w.join(timeout=30)
        assert acquisition(lock, "w").readers_passed == 1
    else:
        lock.release("r1")
        w_leaves.set()
        w.join(timeout=30)
        r2_leaves.set()
        r2.join(timeout=30)
        writer, reader = acquisition(lock, "w"), acquisition(lock, "r2")
        assert writer.released <= reader.granted, "writer preference: r2 queues behind w"
        assert writer.readers_passed == 0
    assert lock.holders() == []
    # The writer arrived while r1 held the lock shared: drained when r1 (the only holder then) left.
    assert acquisition(lock, "w").drained_at == acquisition(lock, "r1").released


def test_nested_acquisition_by_the_exclusive_owner_is_a_no_op():
    lock = ThreadedSharedMutex()
    outer = lock.acquire("t", EX)
    inner = lock.acquire("t", SH)
    assert inner.nested and not outer.nested and lock.owner_depth == 1
    lock.release("t")
    assert lock.holders() == ["t"]
    lock.release("t")
    assert lock.holders() == [] and lock.owner is None


@pytest.mark.parametrize(("second", "kind"), [(EX, "upgrade"), (SH, "nested-shared")])
def test_a_request_the_real_lock_would_hang_on_is_refused_and_recorded(second, kind):
    lock = ThreadedSharedMutex()
    lock.acquire("t", SH, api="probe")
    with pytest.raises(LockHazardError, match=kind):
        lock.acquire("t", second, api="resize")
    assert [(h.kind, h.thread, h.api) for h in lock.hazards] == [(kind, "t", "resize")]
    assert lock.holders() == ["t"] and len(lock.log) == 1  # the refused request changed nothing
    lock.release("t")
    assert lock.holders() == []


def test_bad_requests_are_refused_without_changing_the_lock():
    with pytest.raises(ValueError, match="lock policy"):
        ThreadedSharedMutex("fair")
    lock = ThreadedSharedMutex()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release("nobody")
    with pytest.raises(ValueError, match="NONE"):
        lock.acquire("t", LockMode.NONE)
    assert lock.log == [] and lock.holders() == []
