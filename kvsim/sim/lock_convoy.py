"""The manager lock of a Python manager with the Condition's own mutex (CPU preset ``lock_mutex``).

:class:`hw.rwlock.ThreadedSharedMutex` runs every acquire, release and woken re-test inside
``with self._cond``, and ``threading.Condition`` guards itself with a mutex (an RLock). With
``lock_mutex`` the simulator models that mutex (:class:`kvsim.sim.rwlock.CondMutex`) and drives
the lock through it, as CPython does:

* **acquire**: take the GIL, then the mutex (:func:`take_mutex`); log the request, test it
  (``lock_test_us`` of Python, holding both; the first test taken out of ``python_call_us`` as
  without the mutex), release the mutex; granted, go on; else wait (``Condition.wait`` releases
  the mutex and the GIL);
* **woken** by a release (``notify_all`` wakes every waiter): ``lock_wake_us`` later the thread
  runs, takes the GIL, then the mutex, and re-tests;
* **release**: take the GIL and the mutex, ``lock_release_us`` of Python (taken out of
  ``python_call_us`` too), release the lock (waking every waiter), release the mutex.

:func:`take_mutex` is CPython's lock: free, it is taken at once; held, the thread releases the
GIL and blocks; a release wakes one blocked thread, which ``lock_wake_us`` later takes the mutex
if it is still free and then queues for the GIL *holding it*. A holder of the mutex that loses the
GIL (asked to drop it mid-test, or queuing after a blocked take) makes every other lock operation
block behind it: with a busy GIL the lock's operations form a convoy, and readers inside the lock
are held there by their own release.

Each function is a generator the executor (:class:`kvsim.sim.executor.SimExecutor`) drives with
``yield from``; ``ex`` is the executor.
"""

from __future__ import annotations

from kvsim.runtime import pipeline
from kvsim.runtime.records import LockHazardError


def take_mutex(ex, thread: str, api: str):
    """Hold the Condition's mutex, and the GIL, when this returns."""
    m = ex.mutex
    before = ex._waiting.get(thread)
    yield from ex._take_gil(thread, api)
    if not m.take(thread):
        ex.gil.release_fully(thread)  # a blocking lock acquire runs without the GIL
        first = False
        while True:
            ex._waiting[thread] = ("lock mutex", api)
            yield m.block(thread, first)
            if ex.cpu.lock_wake_us > 0.0:
                yield from ex._wait(ex.cpu.lock_wake_us * 1e-6)
            if m.take(thread):
                break
            first = True  # taken meanwhile by a thread that held the GIL: first in line again
        yield from ex._take_gil(thread, api)  # holding the mutex
    if before is None:
        ex._waiting.pop(thread, None)
    else:
        ex._waiting[thread] = before


def acquire(ex, e: pipeline.AcquireLock):
    """The lock in ``e.mode`` through the mutex; returns None or the hazard."""
    thread, api = e.thread, e.api
    test_s = ex.lock_test_s(thread)
    retest_s = ex.lock_retest_s()
    wake_s = ex.cpu.lock_wake_us * 1e-6
    ex._waiting[thread] = ("lock mutex", api)
    yield from take_mutex(ex, thread, api)
    try:
        request = ex.lock.acquire(thread, e.mode, api, defer_test=True)
        if (yield request) is not None:  # nested under the thread's own exclusive hold
            ex.mutex.release(thread)
            ex._waiting.pop(thread, None)
            return None
    except LockHazardError as hazard:
        ex.mutex.release(thread)
        ex._waiting.pop(thread, None)
        return hazard
    if test_s > 0.0:  # the uncontended acquire's test, already in python_call_us
        ex._prepaid[thread] = ex._prepaid.get(thread, 0.0) + test_s
    pay_s = test_s
    while True:
        if pay_s > 0.0:
            ex._waiting[thread] = ("lock test", api)
            yield from ex._python(thread, pay_s, api)
        ex._waiting[thread] = ("lock", api)
        request = ex.lock.retry(thread)
        ex.mutex.release(thread)
        if request.triggered:  # granted
            yield request
            break
        ex.gil.release_fully(thread)  # Condition.wait: releases the mutex and the GIL
        ex._check_deadlock(thread)
        yield request  # a release woke it
        ex._waiting[thread] = ("lock wake-up", api)
        if wake_s > 0.0:
            yield from ex._wait(wake_s)
        yield from take_mutex(ex, thread, api)
        pay_s = retest_s
    ex._waiting.pop(thread, None)
    return None


def release(ex, e: pipeline.ReleaseLock):
    """Release ``e.thread``'s hold through the mutex (``lock_release_us`` holding it)."""
    thread = e.thread
    api = ex.log.current_api.get(thread, "")
    yield from take_mutex(ex, thread, api)
    release_s = ex.cpu.lock_release_us * 1e-6
    if release_s > 0.0:
        ex._prepaid[thread] = ex._prepaid.get(thread, 0.0) + release_s
        yield from ex._python(thread, release_s, api)
    ex.lock.release(thread)
    ex.mutex.release(thread)
