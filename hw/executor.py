"""HwExecutor: the same workloads and manager on real threads, a real lock and real copies.

Each workload thread is a Python thread. One API call: take the real
:class:`~hw.rwlock.ThreadedSharedMutex` in the API's declared mode, run the manager, submit the
plan's copy batches to the copier (real copies on a CUDA stream with :class:`hw.executor_copies`,
or nothing with :class:`NullCopier`), release the lock, return (or wait for the copies). Times are
``time.perf_counter`` seconds from the start of the run; copy start and end come from CUDA events
converted to the same timeline by the copier. The run comes back as a :class:`HwRun` with the
fields the simulator's metrics read, so both executors produce the same results format.

Python's own GIL is real here: the manager is Python, so a thread runs it holding the GIL and
blocks on the manager lock with the GIL released (``threading.Condition.wait``). The binding-level
GIL bug of KVCM2's C++ bindings therefore cannot be reproduced in this mode (the simulator
models it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from hw.rwlock import ThreadedSharedMutex
from kvsim.errors import KvsimError
from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch
from kvsim.runtime.apis import API_LOCK_MODES, LockMode
from kvsim.runtime.checks import DisciplineCheck, account_copies, invariant_violations, work_of
from kvsim.runtime.recording import to_trace_op
from kvsim.runtime.records import CallRecord, CopyRecord, LinkSegment, LinkStats, LockHazardError
from kvsim.runtime.steps import Call, Sleep, Step, Until


class NullCopier:
    """Executes nothing: for running the hardware executor's threads and lock without a GPU."""

    name = "none"

    def __init__(self) -> None:
        self.records: list[CopyRecord] = []

    def submit(self, batch: CopyBatch, thread: str, api: str, now: float) -> CopyRecord:
        rec = CopyRecord("none", thread, api, batch.kind, "none", batch.num_pages,
                         batch.page_bytes, batch.num_bytes, None, 0, now, now, now)
        self.records.append(rec)
        return rec

    def wait(self, records: list[CopyRecord]) -> None:
        return None

    def start(self, t0: float) -> None:
        return None

    def sign_all(self, manager: KVCacheManager) -> None:
        return None

    def check_call(self, manager: KVCacheManager, batches: list[CopyBatch]) -> None:
        return None

    def finish(self) -> None:
        return None


@dataclass(frozen=True)
class HwOptions:
    """Checks here cost real time on the measured path, so by default the invariants are checked
    once after the run and the lock discipline not at all (turn it on for correctness runs)."""

    lock_policy: str = "reader"
    wait_for_copies: bool = False
    check_invariants_per_call: bool = False
    check_lock_discipline: bool = False


@dataclass
class _Gil:
    """What the metrics read of a GIL: the real one is not observable, so nothing is counted."""

    acquisitions: int = 0
    wait_s: dict = field(default_factory=dict)


@dataclass
class _Link:
    stats: LinkStats


@dataclass
class _Stream:
    records: list[CopyRecord]


@dataclass
class HwRun:
    calls: list[CallRecord]
    lock: ThreadedSharedMutex
    gil: _Gil
    link: _Link
    stream: _Stream
    stuck: list
    deadlocks: list
    violations: list[dict]
    end_time: float
    events_processed: int
    errors: list[str]
    # thread -> [Thread.start() called, the thread's first Python], seconds from t0
    thread_starts: dict[str, list[float]] = field(default_factory=dict)


class HwExecutor:
    def __init__(self, manager: KVCacheManager, copier=None, options: HwOptions | None = None,
                 recorder=None, record_offset_s: float = 0.0) -> None:
        """``recorder``: an :class:`kvsim.traces.op_trace.OpTraceWriter` receiving every call
        run (times shifted by ``record_offset_s``); calls the format cannot express are counted
        in ``unrecorded``."""
        self.manager = manager
        self.recorder = recorder
        self.record_offset_s = record_offset_s
        self.unrecorded = 0
        self.copier = copier or NullCopier()
        self.options = options or HwOptions()
        self.t0 = time.perf_counter()
        self.lock = ThreadedSharedMutex(self.options.lock_policy, t0=self.t0)
        self.calls: list[CallRecord] = []
        self.violations: list[dict] = []
        self._errors: list[str] = []
        self.thread_starts: dict[str, list[float]] = {}
        self._records_lock = threading.Lock()  # guards calls and violations across threads

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _call(self, thread: str, call: Call) -> None:
        opt = self.options
        mode = API_LOCK_MODES.get(call.api, LockMode.NONE)
        with self._records_lock:
            rec = CallRecord(len(self.calls), thread, call.phase, call.api, call.args, mode.value,
                             self.now())
            self.calls.append(rec)
        holding = False
        if mode is not LockMode.NONE:
            rec.lock_requested = self.now()
            try:
                self.lock.acquire(thread, mode, call.api)
            except LockHazardError as e:
                rec.ok, rec.error, rec.end = False, f"LockHazardError: {e}", self.now()
                return
            holding = True
            rec.lock_granted = self.now()
        exclusive = self.lock.owner == thread
        check = DisciplineCheck(self.manager, opt.check_lock_discipline and not exclusive)
        cpu0 = time.perf_counter()
        try:
            result = call.invoke()
        except KvsimError as e:
            result = None
            rec.ok, rec.error = False, f"{type(e).__name__}: {e}"
        rec.cpu_s = time.perf_counter() - cpu0
        found = check.violation(rec, "shared" if thread in self.lock.readers else "no", self.now())
        counts, copies = work_of(self.manager, result)
        rec.result = result if isinstance(result, (bool, int)) else None
        if result is False:
            rec.ok = False
        rec.counts = counts.to_dict()
        submit0 = time.perf_counter()
        submitted = [self.copier.submit(b, thread, call.api, self.now()) for b in copies]
        rec.submit_s = time.perf_counter() - submit0
        if copies:
            self.copier.check_call(self.manager, copies)  # --verify: synchronises and checks
        account_copies(rec, copies, counts)
        new_violations = [found] if found else []
        if mode is LockMode.EXCLUSIVE and opt.check_invariants_per_call:
            new_violations += invariant_violations(self.manager, rec, self.now())
        if holding:
            self.lock.release(thread)
            rec.lock_released = self.now()
        if submitted and opt.wait_for_copies:
            self.copier.wait(submitted)
        rec.end = self.now()
        rec._copies = submitted  # filled in with device times at the end of the run
        op = None
        if self.recorder is not None:
            op = to_trace_op(call, thread, rec.start + self.record_offset_s, rec.ok, rec.result,
                             rec.error, rec.end - rec.start)
        if new_violations or self.recorder is not None:
            with self._records_lock:
                self.violations += new_violations
                if self.recorder is not None:
                    if op is None:
                        self.unrecorded += 1
                    else:
                        self.recorder.write(op)

    def _thread(self, name: str, steps: Iterator[Step]) -> None:
        self.thread_starts[name].append(self.now())
        try:
            for step in steps:
                if isinstance(step, Call):
                    self._call(name, step)
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                elif isinstance(step, Until):
                    delay = step.time - self.now()
                    if delay > 0:
                        time.sleep(delay)
                else:
                    raise TypeError(f"unknown workload step {step!r}")
        except Exception as e:  # noqa: BLE001 - a thread's crash is reported, not lost
            self._errors.append(f"{name}: {type(e).__name__}: {e}")

    def run(self, threads: Mapping[str, Iterator[Step]], join_timeout_s: float = 600.0,
            warm_gpu_ms: float = 0.0) -> HwRun:
        """Run ``threads``; a GPU copier first warms up (and spins the GPU ``warm_gpu_ms``)."""
        if hasattr(self.copier, "warm_up"):
            self.copier.warm_up(warm_gpu_ms)
        self.copier.sign_all(self.manager)
        self.t0 = time.perf_counter()
        self.lock.t0 = self.t0
        self.copier.start(self.t0)
        workers = [threading.Thread(target=self._thread, args=(name, threads[name]), name=name,
                                    daemon=True) for name in sorted(threads)]
        self.thread_starts = {}
        for w in workers:
            self.thread_starts[w.name] = [self.now()]
            w.start()
        deadline = time.perf_counter() + join_timeout_s
        for w in workers:
            w.join(max(0.0, deadline - time.perf_counter()))
        stuck = [w.name for w in workers if w.is_alive()]
        self.copier.finish()
        if not stuck and self.calls:
            self.violations += invariant_violations(self.manager, self.calls[-1], self.now())
        for rec in self.calls:
            done = [c.finished for c in getattr(rec, "_copies", []) if c.finished is not None]
            if done:
                rec.copies_done = max(done)
        return HwRun(self.calls, self.lock, _Gil(), _Link(self._link_stats()),
                     _Stream(self.copier.records),
                     [{"thread": t, "waits_for": "did not finish within the join timeout"}
                      for t in stuck], [], self.violations, self.now(), len(self.calls),
                     self._errors, self.thread_starts)

    def _link_stats(self) -> LinkStats:
        stats = LinkStats()
        for r in self.copier.records:
            if r.kind in stats.bytes:
                stats.bytes[r.kind] += r.num_bytes
                stats.transfers[r.kind] += 1
                if r.started is not None and r.finished is not None and r.finished > r.started:
                    bps = r.num_bytes / (r.finished - r.started)
                    stats.segments.append(LinkSegment(r.started, r.finished,
                                                      bps if r.kind == "offload" else 0.0,
                                                      bps if r.kind == "onboard" else 0.0))
        return stats
