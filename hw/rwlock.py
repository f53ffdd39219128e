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

from kvsim.manager.locking import LockMode
from kvsim.sim.records import POLICIES, Acquisition, LockHazard, LockHazardError


class ThreadedSharedMutex:
    def __init__(self, policy: str = "reader", t0: float | None = None, name: str = "manager") -> None:
        if policy not in POLICIES:
            raise ValueError(f"lock policy must be 'reader' or 'writer', got {policy!r}")
        self.policy = policy
        self.name = name
        self.t0 = time.perf_counter() if t0 is None else t0
        self._cond = threading.Condition()
        self.owner: str | None = None
        self.owner_depth = 0
        self.readers: dict[str, int] = {}
        self._writers: deque[Acquisition] = deque()
        self._held: dict[str, list[Acquisition]] = {}
        self.log: list[Acquisition] = []
        self.hazards: list[LockHazard] = []

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def holders(self) -> list[str]:
        with self._cond:
            return [self.owner] if self.owner is not None else sorted(self.readers)

    def acquire(self, thread: str, mode: LockMode, api: str = "") -> Acquisition:
        if mode is LockMode.NONE:
            raise ValueError("LockMode.NONE takes no lock")
        with self._cond:
            acq = Acquisition(thread, api, mode.value, self._now())
            if self.owner == thread:
                self.owner_depth += 1
                acq.granted, acq.nested = acq.requested, True
                self._held.setdefault(thread, []).append(acq)
                self.log.append(acq)
                return acq
            if thread in self.readers:
                kind = "upgrade" if mode is LockMode.EXCLUSIVE else "nested-shared"
                self.hazards.append(LockHazard(kind, thread, api, acq.requested))
                raise LockHazardError(f"{thread}: {api} asks for the {self.name} lock {mode.value} "
                                      f"while holding it shared ({kind}); the real lock would hang")
            self.log.append(acq)
            if mode is LockMode.EXCLUSIVE:
                acq.pending_readers = {id(a) for t in self.readers for a in self._held[t]}
                if not acq.pending_readers:
                    acq.drained_at = acq.requested
                self._writers.append(acq)
                while not (self.owner is None and not self.readers and self._writers[0] is acq):
                    self._cond.wait()
                self._writers.popleft()
                self.owner, self.owner_depth = thread, 0
            else:
                while not (self.owner is None and (self.policy == "reader" or not self._writers)):
                    self._cond.wait()
                self.readers[thread] = 1
                for writer in self._writers:
                    writer.readers_passed += 1
            acq.granted = self._now()
            self._held.setdefault(thread, []).append(acq)
            return acq

    def release(self, thread: str) -> None:
        with self._cond:
            held = self._held.get(thread)
            if not held:
                raise RuntimeError(f"{thread} releases the {self.name} lock it does not hold")
            acq = held.pop()
            acq.released = self._now()
            if acq.nested:
                self.owner_depth -= 1
            elif self.owner == thread:
                self.owner, self.owner_depth = None, 0
            else:
                del self.readers[thread]
                for writer in self._writers:
                    if writer.drained_at is None and id(acq) in writer.pending_readers:
                        writer.pending_readers.discard(id(acq))
                        if not writer.pending_readers:
                            writer.drained_at = acq.released
            if not held:
                del self._held[thread]
            self._cond.notify_all()
