"""A real ReentrantSharedMutex for Python threads, with the simulator's semantics.

Same contract as :class:`kvsim.sim.rwlock.ReentrantSharedMutex`: exclusive or shared; a nested
acquisition by the exclusive owner is a no-op; a request that would hang the real C++ lock
(upgrade, or nesting under a shared hold) raises :class:`LockHazardError` at once; reader
preference lets new readers pass waiting writers, writer preference does not; writers are FIFO.
Every acquisition is logged with ``time.perf_counter`` times (relative to ``t0``) in the same
:class:`Acquisition` records the simulator uses, so one set of metrics serves both executors.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from kvsim.runtime.apis import LockMode
from kvsim.runtime.lock_holds import LockHolds
from kvsim.runtime.records import Acquisition


class ThreadedSharedMutex(LockHolds):
    def __init__(self, policy: str = "reader", t0: float | None = None, name: str = "manager") -> None:
        super().__init__(policy, name)
        self.t0 = time.perf_counter() if t0 is None else t0
        self._cond = threading.Condition()
        self._writers: deque[Acquisition] = deque()

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def holders(self) -> list[str]:
        with self._cond:
            return [self.owner] if self.owner is not None else sorted(self.readers)

    def acquire(self, thread: str, mode: LockMode, api: str = "") -> Acquisition:
        """Block until ``thread`` holds the lock in ``mode``; raise LockHazardError where the
        real lock would hang."""
        with self._cond:
            acq = self._request(thread, mode, api, self._now())
            if acq.nested:
                return acq
            if mode is LockMode.EXCLUSIVE:
                self._writers.append(acq)
            while not self._may_enter(acq, self._writers):
                self._cond.wait()
            if mode is LockMode.EXCLUSIVE:
                self._writers.popleft()
            self._grant(acq, self._now(), self._writers)
            return acq

    def release(self, thread: str) -> None:
        with self._cond:
            self._release(thread, self._now(), self._writers)
            self._cond.notify_all()
