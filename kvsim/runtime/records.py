"""Plain records shared by both executors (no SimPy here, so the hardware side can use them).

Times are seconds from the start of the run: simulated for the simulator, ``perf_counter`` for
the hardware executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.manager.plan import WorkCounts

DIRECTIONS = ("offload", "onboard")
POLICIES = ("reader", "writer")


class LockHazardError(RuntimeError):
    """A request that would hang the real lock (upgrade, or nesting under a shared hold)."""


@dataclass
class LockHazard:
    kind: str  # "upgrade" | "nested-shared"
    thread: str
    api: str
    time: float


@dataclass
class Acquisition:
    thread: str
    api: str
    mode: str
    requested: float
    granted: float | None = None
    released: float | None = None
    nested: bool = False
    # Readers that entered while this (exclusive) request waited: the starvation measure.
    readers_passed: int = 0
    # Shared holders present when this exclusive request arrived, and when the last of them left:
    # a writer granted later than that was kept waiting by readers that overtook it.
    pending_readers: set[int] = field(default_factory=set)  # ids of those shared holds
    drained_at: float | None = None


@dataclass
class LinkSegment:
    """Constant-rate interval of the link: aggregate bytes/s per direction."""

    start: float
    end: float
    offload_bps: float
    onboard_bps: float


@dataclass
class LinkStats:
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0.0))
    transfers: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0))
    segments: list[LinkSegment] = field(default_factory=list)


@dataclass
class CopyRecord:
    stream: str
    thread: str
    api: str
    kind: str
    path: str
    pages: int
    page_bytes: int
    num_bytes: int
    ctas: int | None
    sms: int
    submitted: float
    started: float | None = None
    finished: float | None = None


@dataclass(slots=True)
class CallRecord:
    index: int
    thread: str
    phase: str
    api: str
    args: dict
    mode: str
    start: float
    lock_requested: float | None = None
    lock_granted: float | None = None
    lock_released: float | None = None
    end: float | None = None
    cpu_s: float = 0.0
    submit_s: float = 0.0
    copies_done: float | None = None
    ok: bool = True
    result: object = None
    error: str = ""
    offloaded_pages: int = 0
    offloaded_bytes: int = 0
    onboarded_pages: int = 0
    onboarded_bytes: int = 0
    dropped_pages: int = 0
    # The plan's work counts (read as a dict through counts): kept as the plan made them, since
    # a dict of 19 entries per call was 1.6 % of a long replay and most are never read.
    work: WorkCounts | None = None
    cpu_terms_us: dict = field(default_factory=dict)
    # The hardware executor's copy records of the call, until their device times are known.
    _copies: list | None = None

    @property
    def counts(self) -> dict[str, int]:
        """The call's work counts by unit; empty for a call that never ran."""
        return {} if self.work is None else self.work.to_dict()

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def lock_wait(self) -> float:
        if self.lock_requested is None or self.lock_granted is None:
            return 0.0
        return self.lock_granted - self.lock_requested


@dataclass
class StuckThread:
    thread: str
    api: str
    waits_for: str
    holds: list[str]


@dataclass
class Deadlock:
    """A cycle in the wait-for graph: each thread waits for something the next one holds."""

    time: float
    cycle: list[StuckThread]




@dataclass
class GilStats:
    """What a run counted of the GIL (nothing, where the GIL is real and not observable)."""

    acquisitions: int = 0
    wait_s: dict[str, float] = field(default_factory=dict)
    holds: list[tuple[str, float, float]] = field(default_factory=list)  # (thread, from, to)


@dataclass
class RunResult:
    """What a timed run produced, the same from both executors; :mod:`kvsim.runtime.metrics`
    reads it, and the scenario layer turns it into results."""

    calls: list[CallRecord]
    copies: list[CopyRecord]
    link: LinkStats
    lock_policy: str
    lock_log: list[Acquisition]
    lock_hazards: list[LockHazard]
    gil: GilStats
    stuck: list[StuckThread]
    deadlocks: list[Deadlock]
    violations: list[dict]
    end_time: float
    events_processed: int  # simulated events, or calls made on a real clock
    thread_starts: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # a real thread's crash, reported
