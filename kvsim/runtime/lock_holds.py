"""Who holds a ReentrantSharedMutex, and how: the bookkeeping both executors' locks share.

:class:`LockHolds` knows nothing of waiting or time; the SimPy lock (:mod:`kvsim.sim.rwlock`) and
the threaded lock (:mod:`hw.rwlock`) decide *when* a request is granted and pass the current time
in, so the same rules for nesting, hazards, release and reader-drain tracking serve both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvsim.runtime.apis import MODE_VALUE, LockMode
from kvsim.runtime.records import POLICIES, Acquisition, LockHazard, LockHazardError

_EXCLUSIVE = MODE_VALUE[LockMode.EXCLUSIVE]


class LockHolds:
    def __init__(self, policy: str, name: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"lock policy must be 'reader' or 'writer', got {policy!r}")
        self.policy = policy
        self.name = name
        self.owner: str | None = None  # exclusive holder
        self.owner_depth = 0
        self.readers: dict[str, int] = {}  # shared holders -> count (always 1; nesting is a hazard)
        self._held: dict[str, list[Acquisition]] = {}
        self.log: list[Acquisition] = []
        self.hazards: list[LockHazard] = []

    def _request(self, thread: str, mode: LockMode, api: str, now: float) -> Acquisition:
        """The record of a new request, or LockHazardError if the real lock would hang on it.

        A request by the exclusive owner is granted at once as a nested no-op (``acq.nested``);
        any other request is logged and returned ungranted, for the caller to queue. An exclusive
        request notes the shared holds it must wait out (see :meth:`_release`).
        """
        if mode is LockMode.NONE:
            raise ValueError("LockMode.NONE takes no lock")
        acq = Acquisition(thread, api, MODE_VALUE[mode], now)
        if self.owner == thread:
            self.owner_depth += 1
            acq.granted, acq.nested = now, True
            self._held.setdefault(thread, []).append(acq)
            self.log.append(acq)
            return acq
        if thread in self.readers:
            kind = "upgrade" if mode is LockMode.EXCLUSIVE else "nested-shared"
            self.hazards.append(LockHazard(kind, thread, api, now))
            raise LockHazardError(
                f"{thread}: {api} asks for the {self.name} lock {mode.value} while holding it "
                f"shared ({kind}); the real lock would hang here")
        self.log.append(acq)
        if mode is LockMode.EXCLUSIVE:
            if self.readers:
                acq.pending_readers = {id(a) for t in self.readers for a in self._held[t]}
            else:
                acq.drained_at = now
        return acq

    def _may_enter(self, acq: Acquisition, queued_writers: Sequence[Acquisition]) -> bool:
        """Whether a queued request may take the lock now (a lock whose waiters re-test, as a
        condition variable's do): a writer when the lock is free and it is the first writer
        queued; a reader when no writer holds it and, under writer preference, none is queued."""
        if acq.mode == _EXCLUSIVE:
            return self.owner is None and not self.readers and queued_writers[0] is acq
        return self.owner is None and (self.policy == "reader" or not queued_writers)

    def _grant(self, acq: Acquisition, now: float, waiting: Iterable[Acquisition]) -> None:
        """Record ``acq`` as held from ``now``; a reader counts as passing every waiting writer."""
        acq.granted = now
        if acq.mode == _EXCLUSIVE:
            self.owner, self.owner_depth = acq.thread, 0
        else:
            self.readers[acq.thread] = 1
            for other in waiting:
                if other.mode == _EXCLUSIVE:
                    other.readers_passed += 1
        self._held.setdefault(acq.thread, []).append(acq)

    def _release(self, thread: str, now: float, waiting: Iterable[Acquisition]) -> Acquisition:
        """End ``thread``'s latest hold; a waiting writer whose last pending reader leaves is drained."""
        held = self._held.get(thread)
        if not held:
            raise RuntimeError(f"{thread} releases the {self.name} lock it does not hold")
        acq = held.pop()
        acq.released = now
        if acq.nested:
            self.owner_depth -= 1
        elif self.owner == thread:
            self.owner, self.owner_depth = None, 0
        else:
            del self.readers[thread]
            for writer in waiting:
                if writer.drained_at is None and id(acq) in writer.pending_readers:
                    writer.pending_readers.discard(id(acq))
                    if not writer.pending_readers:
                        writer.drained_at = now
        if not held:
            del self._held[thread]
        return acq
