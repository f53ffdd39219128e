"""What both executors check and count around one manager call, whatever their clock.

* :func:`account_copies` -- pages and bytes moved, onto the call's record;
* :class:`DisciplineCheck` -- the lock-discipline checker: a digest of the shared state around a
  call made without the exclusive lock; any difference is a violation (:class:`DigestCache`
  spares the digest before when nothing ran since the last one);
* :func:`invariant_violations` -- the invariant checker's findings as violation records.
"""

from __future__ import annotations

from kvsim.manager.fingerprint import state_digest
from kvsim.manager.invariants import find_violations
from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch, WorkCounts
from kvsim.runtime.records import CallRecord


def account_copies(rec: CallRecord, copies: list[CopyBatch], counts: WorkCounts) -> None:
    for b in copies:
        if b.kind == "offload":
            rec.offloaded_pages += b.num_pages
            rec.offloaded_bytes += b.num_bytes
        elif b.kind == "onboard":
            rec.onboarded_pages += b.num_pages
            rec.onboarded_bytes += b.num_bytes
    rec.dropped_pages = counts.pages_dropped


class DigestCache:
    """The last digest taken and whether it still describes the manager: valid until a call
    runs unchecked (``invalidate``, before an exclusive call). Only for a driver whose calls never
    overlap in real time (the simulator); real threads take a fresh digest every time."""

    def __init__(self) -> None:
        self.digest: dict[str, object] | None = None

    def invalidate(self) -> None:
        self.digest = None


class DisciplineCheck:
    """Digest before, compare after: a call that mutated shared state without holding the lock
    exclusively yields one violation naming the API, thread, time and the state touched. With a
    :class:`DigestCache`, the digest before is the last one taken when nothing ran since."""

    def __init__(self, manager: KVCacheManager, enabled: bool,
                 cache: DigestCache | None = None) -> None:
        self.manager = manager
        self.cache = cache
        if not enabled:
            self.before = None
            if cache is not None:
                cache.invalidate()
        elif cache is not None and cache.digest is not None:
            self.before = cache.digest
        else:
            self.before = state_digest(manager)

    def violation(self, rec: CallRecord, lock_held: str, time: float) -> dict | None:
        if self.before is None:
            return None
        after = state_digest(self.manager)
        if self.cache is not None:
            self.cache.digest = after
        touched = [k for k in self.before if self.before[k] != after[k]]
        if not touched:
            return None
        return {"kind": "lock-discipline", "index": rec.index, "thread": rec.thread,
                "api": rec.api, "time": time, "lock_held": lock_held, "state": touched,
                "problem": f"{rec.api} on {rec.thread} mutated {', '.join(touched)} holding "
                           f"{lock_held} lock (needs exclusive)"}


def invariant_violations(manager: KVCacheManager, rec: CallRecord, time: float) -> list[dict]:
    return [{"kind": "invariant", "index": rec.index, "thread": rec.thread, "api": rec.api,
             "time": time, "problem": problem} for problem in find_violations(manager)]
