"""Plans: what one manager call produced, for an executor to turn into time.

The manager has no clock. Each public call records a :class:`Plan`: the copy batches it issued
(which pages move between which levels, by slot, with their byte counts) and counts of the
bookkeeping it did. The simulator prices the counts with a CPU cost model and the copies with link
and copy-engine models; the hardware executor performs the copies and measures.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields

import numpy as np

COPY_OFFLOAD = "offload"  # to a colder level
COPY_ONBOARD = "onboard"  # to a warmer level
COPY_INTRA = "intra"  # within one level (partial-reuse copies, defragmentation)


@dataclass(frozen=True, slots=True)
class CopyBatch:
    """Pages of one pool group moving from one level to another, in one submission.

    ``src_slots[i]`` is copied to ``dst_slots[i]``; each page is ``page_bytes`` bytes, laid out
    as one slot of each pool of the group (``pool_slot_bytes``).
    """

    src_level: int
    dst_level: int
    pool_group: int
    src_slots: np.ndarray
    dst_slots: np.ndarray
    pool_slot_bytes: tuple[int, ...]

    @property
    def kind(self) -> str:
        if self.dst_level > self.src_level:
            return COPY_OFFLOAD
        if self.dst_level < self.src_level:
            return COPY_ONBOARD
        return COPY_INTRA

    @property
    def page_bytes(self) -> int:
        return sum(self.pool_slot_bytes)

    @property
    def num_pages(self) -> int:
        return int(self.src_slots.size)

    @property
    def num_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "src_level": self.src_level,
            "dst_level": self.dst_level,
            "pool_group": self.pool_group,
            "num_pages": self.num_pages,
            "page_bytes": self.page_bytes,
            "num_bytes": self.num_bytes,
        }


@dataclass(slots=True)
class WorkCounts:
    """Counted units of host-side bookkeeping; the CPU cost model prices each unit."""

    pages_touched: int = 0  # page records read or written (status, LRU, ownership)
    pages_allocated: int = 0  # new page records
    pages_freed: int = 0
    slots_allocated: int = 0
    slots_freed: int = 0
    pages_migrated: int = 0  # pages whose level changed
    pages_dropped: int = 0  # pages dropped at the last level
    eviction_candidates: int = 0  # pages ranked by the eviction policy
    eviction_rounds: int = 0  # (level, pool group) victim selections
    tree_nodes_visited: int = 0
    tree_nodes_created: int = 0
    tree_nodes_removed: int = 0
    blocks_hashed: int = 0
    stats_commits: int = 0  # one per committed statistics delta
    stats_scan_units: int = 0  # (level x pool group) cells re-sampled by those commits
    stats_page_records: int = 0  # per-page statistics records (bytes summed per page)
    callback_calls: int = 0  # priority callback invocations (re-enter Python under the lock)
    events_emitted: int = 0  # event-sink calls (also re-enter Python under the lock)
    roots_erased: int = 0

    def add(self, other: WorkCounts) -> None:
        for name, value in zip(_COUNT_NAMES, _count_values(other)):
            setattr(self, name, getattr(self, name) + value)

    def to_dict(self) -> dict[str, int]:
        return dict(zip(_COUNT_NAMES, _count_values(self)))


# Read once: dataclasses.fields() per call was a measurable share of every call's bookkeeping.
_COUNT_NAMES = tuple(f.name for f in fields(WorkCounts))
_count_values = operator.attrgetter(*_COUNT_NAMES)


@dataclass(slots=True)
class Plan:
    """What one API call did. ``ok`` is False when the call failed and changed nothing."""

    api: str
    ok: bool = True
    copies: list[CopyBatch] = field(default_factory=list)
    counts: WorkCounts = field(default_factory=WorkCounts)
    # Events the call produced, in order; handed to the manager's event sink once the call has
    # completed (KVCM2 likewise queues its events and publishes them afterwards).
    events: list[dict] = field(default_factory=list)

    @property
    def offloaded_pages(self) -> int:
        return sum(c.num_pages for c in self.copies if c.kind == COPY_OFFLOAD)

    @property
    def offloaded_bytes(self) -> int:
        return sum(c.num_bytes for c in self.copies if c.kind == COPY_OFFLOAD)

    @property
    def onboarded_pages(self) -> int:
        return sum(c.num_pages for c in self.copies if c.kind == COPY_ONBOARD)

    @property
    def onboarded_bytes(self) -> int:
        return sum(c.num_bytes for c in self.copies if c.kind == COPY_ONBOARD)

    def to_dict(self) -> dict:
        return {
            "api": self.api,
            "ok": self.ok,
            "copies": [c.to_dict() for c in self.copies],
            "counts": self.counts.to_dict(),
        }
