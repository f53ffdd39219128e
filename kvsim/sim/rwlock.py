"""The manager's ReentrantSharedMutex, as a SimPy resource.

Semantics (KVCM2, DESIGN.md section 3):
* exclusive: one holder; shared: any number of holders, never together with an exclusive one;
* a nested acquisition (either mode) by the thread that holds the lock exclusively is a no-op;
* nesting inside a *shared* hold, or upgrading shared -> exclusive, hangs on the real lock. Here it
  is detected at the request and reported as a :class:`LockHazard`; the request fails with
  :class:`LockHazardError` instead of freezing the simulation;
* ``policy="reader"`` (glibc's default): a new reader enters whenever no writer holds the lock,
  even while writers wait, so a stream of readers can starve a writer;
  ``policy="writer"``: a waiting writer blocks new readers. Writers are served in FIFO order.

Every acquisition is recorded (request, grant and release times) for wait/hold statistics.
"""

from __future__ import annotations

from collections import deque

import simpy

from kvsim.manager.locking import LockMode
from kvsim.sim.records import POLICIES, Acquisition, LockHazard, LockHazardError


class ReentrantSharedMutex:
    def __init__(self, env: simpy.Environment, policy: str = "reader", name: str = "manager") -> None:
        if policy not in POLICIES:
            raise ValueError(f"lock policy must be 'reader' or 'writer', got {policy!r}")
        self.env = env
        self.policy = policy
        self.name = name
        self.owner: str | None = None  # exclusive holder
        self.owner_depth = 0
        self.readers: dict[str, int] = {}  # shared holders -> count (always 1; nesting is a hazard)
        self._waiting: deque[tuple[Acquisition, simpy.Event]] = deque()
        self._held: dict[str, list[Acquisition]] = {}
        self.log: list[Acquisition] = []
        self.hazards: list[LockHazard] = []

    # -- queries ------------------------------------------------------------------------------
    def holders(self) -> list[str]:
        return [self.owner] if self.owner is not None else sorted(self.readers)

    def waiting_threads(self) -> list[tuple[str, str]]:
        return [(acq.thread, acq.mode) for acq, _ in self._waiting]

    # -- protocol -----------------------------------------------------------------------------
    def acquire(self, thread: str, mode: LockMode, api: str = "") -> simpy.Event:
        """An event that succeeds when ``thread`` holds the lock in ``mode``."""
        if mode is LockMode.NONE:
            raise ValueError("LockMode.NONE takes no lock")
        acq = Acquisition(thread, api, mode.value, self.env.now)
        event = self.env.event()
        if self.owner == thread:
            self.owner_depth += 1
            acq.granted, acq.nested = self.env.now, True
            self._held.setdefault(thread, []).append(acq)
            self.log.append(acq)
            return event.succeed(acq)
        if thread in self.readers:
            kind = "upgrade" if mode is LockMode.EXCLUSIVE else "nested-shared"
            hazard = LockHazard(kind, thread, api, self.env.now)
            self.hazards.append(hazard)
            return event.fail(LockHazardError(
                f"{thread}: {api} asks for the {self.name} lock {mode.value} while holding it "
                f"shared ({kind}); the real lock would hang here"))
        if mode is LockMode.EXCLUSIVE:
            acq.pending_readers = {id(a) for t in self.readers for a in self._held[t]}
            if not acq.pending_readers:
                acq.drained_at = self.env.now
        self._waiting.append((acq, event))
        self.log.append(acq)
        self._dispatch()
        return event

    def release(self, thread: str) -> None:
        held = self._held.get(thread)
        if not held:
            raise RuntimeError(f"{thread} releases the {self.name} lock it does not hold")
        acq = held.pop()
        acq.released = self.env.now
        if acq.nested:
            self.owner_depth -= 1
        elif self.owner == thread:
            self.owner, self.owner_depth = None, 0
        else:
            del self.readers[thread]
            for waiting, _ in self._waiting:
                if waiting.drained_at is None and id(acq) in waiting.pending_readers:
                    waiting.pending_readers.discard(id(acq))
                    if not waiting.pending_readers:
                        waiting.drained_at = self.env.now
        if not held:
            del self._held[thread]
        self._dispatch()

    def _grant(self, acq: Acquisition, event: simpy.Event) -> None:
        acq.granted = self.env.now
        if acq.mode == LockMode.EXCLUSIVE.value:
            self.owner, self.owner_depth = acq.thread, 0
        else:
            self.readers[acq.thread] = 1
            for other, _ in self._waiting:
                if other.mode == LockMode.EXCLUSIVE.value:
                    other.readers_passed += 1
        self._held.setdefault(acq.thread, []).append(acq)
        event.succeed(acq)

    def _dispatch(self) -> None:
        if self.owner is not None:
            return
        writer_waiting = any(a.mode == LockMode.EXCLUSIVE.value for a, _ in self._waiting)
        # Readers first: all of them under reader preference; under writer preference only
        # while no writer waits.
        if not (self.policy == "writer" and writer_waiting):
            keep: deque = deque()
            for acq, event in self._waiting:
                if acq.mode == LockMode.SHARED.value:
                    self._grant(acq, event)
                else:
                    keep.append((acq, event))
            self._waiting = keep
        if not self.readers and self._waiting:
            for i, (acq, event) in enumerate(self._waiting):
                if acq.mode == LockMode.EXCLUSIVE.value:
                    del self._waiting[i]
                    self._grant(acq, event)
                    break
        # Under writer preference readers queued behind a writer that was just granted stay queued.
