"""The manager's ReentrantSharedMutex, as a SimPy resource.

Semantics (KVCM2's, as the seed PR #18541 describes its lock):
* exclusive: one holder; shared: any number of holders, never together with an exclusive one;
* a nested acquisition (either mode) by the thread that holds the lock exclusively is a no-op;
* nesting inside a *shared* hold, or upgrading shared -> exclusive, hangs on the real lock. Here it
  is detected at the request and reported as a :class:`LockHazard`; the request fails with
  :class:`LockHazardError` instead of freezing the simulation;
* ``policy="reader"`` (glibc's default): a new reader enters whenever no writer holds the lock,
  even while writers wait, so a stream of readers can starve a writer;
  ``policy="writer"``: a waiting writer blocks new readers. Writers are served in FIFO order.

Every acquisition is recorded (request, grant and release times) for wait/hold statistics.

Two ways a waiter gets the lock. By default a release hands it over at once (``_dispatch``), as
a lock whose waiters need nothing else to run. ``recheck=True`` is the hardware executor's lock
(:class:`hw.rwlock.ThreadedSharedMutex`, a condition variable): a release only wakes the waiters,
each must run again (for Python threads: get the GIL) and re-test the condition itself
(:meth:`retry`), and whoever tests first wins; under reader preference a reader that comes along
meanwhile enters and the woken writer waits on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import simpy

from kvsim.runtime.apis import MODE_VALUE, LockMode
from kvsim.runtime.lock_holds import LockHolds
from kvsim.runtime.records import Acquisition, LockHazardError

__all__ = ["CondMutex", "LockHazardError", "ReentrantSharedMutex"]

_EXCLUSIVE, _SHARED = MODE_VALUE[LockMode.EXCLUSIVE], MODE_VALUE[LockMode.SHARED]


class ReentrantSharedMutex(LockHolds):
    def __init__(self, env: simpy.Environment, policy: str = "reader", name: str = "manager",
                 recheck: bool = False) -> None:
        super().__init__(policy, name)
        self.env = env
        self.recheck = recheck
        self._waiting: deque[tuple[Acquisition, simpy.Event]] = deque()

    # -- queries ------------------------------------------------------------------------------
    def holders(self) -> list[str]:
        return [self.owner] if self.owner is not None else sorted(self.readers)

    def waiting_threads(self) -> list[tuple[str, str]]:
        return [(acq.thread, acq.mode) for acq, _ in self._waiting]

    def _waiting_acquisitions(self) -> Iterator[Acquisition]:
        return (acq for acq, _ in self._waiting)

    # -- protocol -----------------------------------------------------------------------------
    def acquire(self, thread: str, mode: LockMode, api: str = "",
                defer_test: bool = False) -> simpy.Event:
        """An event that succeeds when ``thread`` holds the lock in ``mode``.

        A request the real lock would hang on fails the event with :class:`LockHazardError`.
        ``defer_test`` (recheck mode): queue the request without testing it; the event succeeds
        with ``None`` at once, as a wake-up does, and the caller tests it with :meth:`retry`.
        """
        event = self.env.event()
        try:
            acq = self._request(thread, mode, api, self.env.now)
        except LockHazardError as hazard:
            return event.fail(hazard)
        if acq.nested:
            return event.succeed(acq)
        self._waiting.append((acq, event))
        if self.recheck:
            if defer_test:
                return self.env.event().succeed(None)
            return self.retry(thread)
        self._dispatch()
        return event

    def free_for(self, thread: str, mode: LockMode) -> bool:
        """Whether a request of ``thread`` in ``mode`` (not NONE) would be granted on the spot
        by :meth:`acquire`: nothing queued, no holder in its way, and not one the real lock
        would hang on or that nests."""
        return (self.owner is None and not self._waiting and thread not in self.readers
                and (mode is LockMode.SHARED or not self.readers))

    def take_now(self, thread: str, mode: LockMode, api: str = "") -> Acquisition:
        """Grant a request :meth:`free_for` allows, without an event: what :meth:`acquire`
        records, for a caller that knows its event would have been processed at once
        (:meth:`~kvsim.sim.environment.CountingEnvironment.succeed_now`)."""
        now = self.env._now  # (SimPy's now, without its property)
        acq = self._request(thread, mode, api, now)
        self._grant(acq, now, ())
        return acq

    def release(self, thread: str) -> None:
        self._release(thread, self.env._now,
                      self._waiting_acquisitions() if self._waiting else ())
        if self.recheck:
            self._wake_all()
        else:
            self._dispatch()

    # -- recheck mode (a condition variable) ------------------------------------------------------
    def retry(self, thread: str) -> simpy.Event:
        """Recheck mode: test ``thread``'s queued request now (hw.rwlock's condition,
        :meth:`LockHolds._may_enter`). Granted: a succeeded event (value: the acquisition);
        otherwise an event that succeeds with ``None`` at the next release (then retry again)."""
        i, acq = next((i, a) for i, (a, _) in enumerate(self._waiting) if a.thread == thread)
        writers = [a for a, _ in self._waiting if a.mode == _EXCLUSIVE]
        if self._may_enter(acq, writers):
            del self._waiting[i]
            self._grant(acq, self.env.now, self._waiting_acquisitions())
            return self.env.event().succeed(acq)
        wake = self.env.event()
        self._waiting[i] = (acq, wake)
        return wake

    def _wake_all(self) -> None:
        for _acq, event in self._waiting:
            if not event.triggered:
                event.succeed(None)

    def _grant_waiting(self, acq: Acquisition, event: simpy.Event) -> None:
        self._grant(acq, self.env.now, self._waiting_acquisitions())
        event.succeed(acq)

    def _dispatch(self) -> None:
        if self.owner is not None:
            return
        waiting = self._waiting
        if len(waiting) <= 1:
            # Most dispatches (every uncontended acquire and release): no waiter, or one, whom
            # the rules below grant exactly when it is a reader or no reader holds the lock.
            if waiting:
                acq, event = waiting[0]
                if acq.mode == _SHARED or not self.readers:
                    waiting.clear()
                    self._grant_waiting(acq, event)
            return
        writer_waiting = any(a.mode == _EXCLUSIVE for a, _ in self._waiting)
        # Readers first: all of them under reader preference; under writer preference only
        # while no writer waits.
        if not (self.policy == "writer" and writer_waiting):
            keep: deque = deque()
            for acq, event in self._waiting:
                if acq.mode == _SHARED:
                    self._grant_waiting(acq, event)
                else:
                    keep.append((acq, event))
            self._waiting = keep
        if not self.readers and self._waiting:
            for i, (acq, event) in enumerate(self._waiting):
                if acq.mode == _EXCLUSIVE:
                    del self._waiting[i]
                    self._grant_waiting(acq, event)
                    break
        # Under writer preference readers queued behind a writer that was just granted stay queued.


class CondMutex:
    """The mutex of the hardware executor's ``threading.Condition`` (an RLock), for a Python
    manager whose CPU preset sets ``lock_mutex``: every acquire, release and woken re-test of
    :class:`hw.rwlock.ThreadedSharedMutex` runs inside ``with self._cond``.

    CPython's lock: a thread holding the GIL takes a free mutex at once; finding it held, it
    releases the GIL and blocks. A release wakes one blocked thread (:meth:`release`); woken, it
    takes the mutex if it is still free (another thread holding the GIL may have taken it
    meanwhile: then it blocks again, first in line), and only then re-takes the GIL, holding the
    mutex while it queues. :func:`kvsim.sim.lock_convoy.take_mutex` drives those steps; this
    class keeps the owner and the blocked threads."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.owner: str | None = None
        self._blocked: deque[tuple[str, simpy.Event]] = deque()
        self.blocks = 0  # times a thread found the mutex held and blocked

    def take(self, thread: str) -> bool:
        """Take the mutex if it is free; whether ``thread`` holds it now."""
        if self.owner is None:
            self.owner = thread
            return True
        return self.owner == thread

    def block(self, thread: str, first: bool = False) -> simpy.Event:
        """Block ``thread`` on the held mutex: an event that succeeds when a release wakes it
        (``first``: at the head of the line, for a woken thread that lost the race)."""
        event = self.env.event()
        if first:
            self._blocked.appendleft((thread, event))
        else:
            self.blocks += 1
            self._blocked.append((thread, event))
        return event

    def release(self, thread: str) -> None:
        if self.owner != thread:
            raise RuntimeError(f"{thread} releases the lock's mutex held by {self.owner}")
        self.owner = None
        if self._blocked:
            _thread, event = self._blocked.popleft()
            event.succeed()
