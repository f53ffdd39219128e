"""HwExecutor: the same workloads and manager on real threads, a real lock and real copies.

Each workload thread is a Python thread running :func:`kvsim.runtime.pipeline.thread_steps`;
this module performs the pipeline's effects for real: the lock is the real
:class:`~hw.rwlock.ThreadedSharedMutex` in the API's declared mode, the manager call is timed
with ``time.perf_counter`` (that is its CPU time, ``cpu_ms``) and with ``time.thread_time`` (the
thread's own CPU time in it, recorded as ``cpu_terms_us["thread_cpu"]``: the difference is time
the thread spent off its CPU inside the call, waiting for the GIL or descheduled; a vCPU that is
merely slow counts as CPU), the plan's copy batches go to the copier (real
copies on a CUDA stream with :class:`hw.executor_copies`, or nothing with :class:`NullCopier`),
sleeps sleep. Times are ``time.perf_counter`` seconds from the start of the run; copy start and
end come from CUDA events converted to the same timeline by the copier. The run comes back as the
same :class:`~kvsim.runtime.records.RunResult` the simulator produces.

Python's own GIL is real here: the manager is Python, so a thread runs it holding the GIL and
blocks on the manager lock with the GIL released (``threading.Condition.wait``); the GIL effects
of the pipeline are nothing to do. The binding-level GIL bug of KVCM2's C++ bindings therefore
cannot be reproduced in this mode (the simulator models it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from hw.rwlock import ThreadedSharedMutex
from kvsim.manager.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch
from kvsim.runtime import pipeline
from kvsim.runtime.checks import invariant_violations
from kvsim.runtime.recording import to_trace_op
from kvsim.runtime.records import (
    CallRecord,
    CopyRecord,
    GilStats,
    LinkSegment,
    LinkStats,
    LockHazardError,
    RunResult,
    StuckThread,
)
from kvsim.runtime.steps import Call, GpuTimes, Step


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


def _nothing(effect: object) -> None:
    """The real GIL and real Python need no help: these effects happen by themselves."""


class HwExecutor:
    def __init__(self, manager: KVCacheManager, copier=None, options: HwOptions | None = None,
                 recorder=None, record_offset_s: float = 0.0, forward=None) -> None:
        """``recorder``: an :class:`kvsim.traces.op_trace.OpTraceWriter` receiving every call
        run (times shifted by ``record_offset_s``); calls the format cannot express are counted
        in ``unrecorded``. ``forward``: what runs a :class:`~kvsim.runtime.steps.GpuWork` for
        real (``forward.run(work)``, e.g. :class:`hw.serving_forward.TorchForward`); None
        waits its modelled seconds."""
        self.forward = forward
        self.manager = manager
        self.recorder = recorder
        self.record_offset_s = record_offset_s
        self.unrecorded = 0
        self.copier = copier or NullCopier()
        self.options = options or HwOptions()
        opt = self.options
        self.t0 = time.perf_counter()
        self.lock = ThreadedSharedMutex(opt.lock_policy, t0=self.t0)
        self.log = pipeline.CallLog(manager, self.now, self.lock, opt.wait_for_copies,
                                    opt.check_invariants_per_call, opt.check_lock_discipline,
                                    recorder=self._record if recorder is not None else None,
                                    nudges=False)
        self._errors: list[str] = []
        self.thread_starts: dict[str, list[float]] = {}
        self._records_lock = threading.Lock()  # guards the recorder across threads
        self._invoke_cpu = threading.local()  # each thread's last manager call's thread CPU
        p = pipeline
        self._handlers = {
            p.EnterBinding: _nothing,
            p.Callbacks: _nothing, p.LeaveBinding: _nothing, p.AcquireLock: self._do_acquire,
            p.Invoke: self._do_invoke,
            p.SpendCpu: self._do_cpu, p.SubmitCopies: self._do_submit,
            p.ReleaseLock: lambda e: self.lock.release(e.thread),
            p.WaitCopies: self._do_wait_copies, p.SleepFor: lambda e: time.sleep(e.seconds),
            p.SleepUntil: self._do_sleep_until, p.ReadClock: lambda e: self.now(),
            p.Compute: self._do_compute}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- the pipeline's effects, for real ------------------------------------------------------
    def _drive(self, steps) -> None:
        send = None
        handlers = self._handlers
        while True:
            try:
                effect = steps.send(send)
            except StopIteration:
                return
            send = handlers[type(effect)](effect)

    def _do_acquire(self, e: pipeline.AcquireLock) -> LockHazardError | None:
        try:
            self.lock.acquire(e.thread, e.mode, e.api)
        except LockHazardError as hazard:
            return hazard
        return None

    def _do_invoke(self, e: pipeline.Invoke) -> tuple:
        # The thread-CPU window inside the wall one: a GIL hand-over at a clock call (each call
        # is a switch point) then counts in neither, or in the wall time only, never in the CPU
        # time alone (with the windows the other way round, a loaded 2-core host measured
        # thread CPU 120 us above the wall time).
        t0 = time.perf_counter()
        c0 = time.thread_time()
        outcome = e.call.invoke()
        self._invoke_cpu.seconds = time.thread_time() - c0
        wall = time.perf_counter() - t0
        return outcome, wall

    def _do_cpu(self, e: pipeline.SpendCpu) -> tuple[float, dict]:
        """The call's measured time, and its thread CPU time (module doc); the pipeline asks
        right after the call, on the same thread."""
        return e.measured_s, {"thread_cpu": round(self._invoke_cpu.seconds * 1e6, 3)}

    def _do_submit(self, e: pipeline.SubmitCopies) -> tuple[list[CopyRecord], float]:
        t0 = time.perf_counter()
        submitted = [self.copier.submit(b, e.thread, e.api, self.now()) for b in e.copies]
        submit_s = time.perf_counter() - t0
        if e.copies:
            self.copier.check_call(self.manager, e.copies)  # --verify: synchronises and checks
        return submitted, submit_s

    def _do_wait_copies(self, e: pipeline.WaitCopies) -> None:
        e.record._copies = e.handles  # their device times are known at the end of the run
        if e.block:
            self.copier.wait(e.handles)

    def _do_compute(self, e: pipeline.Compute) -> GpuTimes:
        """A forward pass: wait for every copy submitted so far (the copier's streams), then
        run the pass on the executor's ``forward`` (real kernels) or, without one, wait its
        modelled seconds. No overlap."""
        start = self.now()
        self.copier.wait([])
        landed = self.now()
        if self.forward is not None:
            self.forward.run(e.work)
        elif e.work.seconds > 0:
            time.sleep(e.work.seconds)
        return GpuTimes(start, landed, self.now())

    def _do_sleep_until(self, e: pipeline.SleepUntil) -> None:
        delay = e.time - self.now()
        if delay > 0:
            time.sleep(delay)

    def _record(self, call: Call, thread: str, rec: CallRecord) -> None:
        op = to_trace_op(call, thread, rec.start + self.record_offset_s, rec.ok, rec.result,
                         rec.error, rec.end - rec.start)
        with self._records_lock:
            if op is None:
                self.unrecorded += 1
            else:
                self.recorder.write(op)

    # -- threads --------------------------------------------------------------------------------
    def _thread(self, name: str, steps: Iterator[Step]) -> None:
        self.thread_starts[name].append(self.now())
        try:
            self._drive(pipeline.thread_steps(self.log, name, steps))
        except Exception as e:  # noqa: BLE001 - a thread's crash is reported, not lost
            self._errors.append(f"{name}: {type(e).__name__}: {e}")

    def run(self, threads: Mapping[str, Iterator[Step]], join_timeout_s: float = 600.0,
            warm_gpu_ms: float = 0.0) -> RunResult:
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
        calls, violations = self.log.calls, self.log.violations
        if not stuck and calls:
            violations += invariant_violations(self.manager, calls[-1], self.now())
        for rec in calls:
            done = [c.finished for c in rec._copies or [] if c.finished is not None]
            if done:
                rec.copies_done = max(done)
        return RunResult(calls, self.copier.records, self._link_stats(), self.lock.policy,
                         self.lock.log, self.lock.hazards, GilStats(),
                         [StuckThread(t, self.log.current_api.get(t, ""),
                                      "did not finish within the join timeout", [])
                          for t in stuck], [], violations, self.now(), len(calls),
                         self.thread_starts, self._errors)

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
