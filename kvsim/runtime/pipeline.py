"""The one per-call pipeline, and the one thread loop, that both executors drive.

:func:`thread_steps` is a generator: it walks a workload thread's steps and, for each call,
the pipeline below, and ``yield``\\ s an *effect* wherever time passes or the executor's own
machinery is needed (the GIL, the lock, CPU time, the copies). The executor performs each
effect on its own clock and sends back the effect's result: the simulator models it in SimPy,
the hardware executor does it for real (or nothing, where real Python just runs). Everything
else, the bookkeeping of the call record, the manager call and what it returned, the checks, is
here, once.

One API call, in order (the effects in brackets):

1. enter the binding: half the binding's Python cost, then a binding that may block on the
   lock can release the GIL [:class:`EnterBinding`];
2. (an exploring executor may shift the thread by a sliver of time [:class:`Nudge`]);
3. the manager lock in the API's declared mode [:class:`AcquireLock`]; a request the real lock
   would hang on fails the call (a :class:`~kvsim.runtime.records.LockHazardError`);
4. the manager call itself [:class:`Invoke`]: its :class:`~kvsim.manager.Outcome`, whose plan
   must be the API's (:attr:`Api.plan_api`); the lock-discipline checker compares the shared
   state around a call made without the exclusive lock;
5. priority-callback and event-sink calls, back into Python under the lock [:class:`Callbacks`];
6. the plan's CPU cost [:class:`SpendCpu`] (modelled, or measured around the call);
7. the copy batches [:class:`SubmitCopies`]: host submission, then the stream or copier;
8. the invariants (after an exclusive call), then the lock released [:class:`ReleaseLock`];
9. by default the call returns now (stream semantics, as KVCM2), or waits for its copies
   [:class:`WaitCopies`];
10. back to Python: the other half of the binding's Python cost [:class:`LeaveBinding`].
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any, NamedTuple

from kvsim.manager import CopyBatch, KVCacheManager, WorkCounts
from kvsim.runtime.apis import MODE_VALUE, Api, LockMode
from kvsim.runtime.checks import DigestCache, DisciplineCheck, account_copies, invariant_violations
from kvsim.runtime.records import CallRecord
from kvsim.runtime.steps import Call, GpuWork, Now, Sleep, Step, Until


# -- effects ---------------------------------------------------------------------------------------
# Named tuples, not frozen dataclasses: a call makes about ten of them, and a frozen dataclass's
# __init__ (object.__setattr__ per field) was 2.6 % of a timed replay's profile. Executors dispatch on
# the effect's type.
class EnterBinding(NamedTuple):
    """Entering the binding: half its own Python cost on ``thread``; then, about to block on
    the lock, the binding may release the GIL."""

    thread: str
    api: Api


class Nudge(NamedTuple):
    """Before a lock request: an exploring executor may shift the thread by a sliver of time."""

    thread: str


class AcquireLock(NamedTuple):
    """Take the manager lock; the executor returns None, or the hazard that failed it."""

    thread: str
    mode: LockMode
    api: str


class Invoke(NamedTuple):
    """Run the manager call; the executor returns ``(outcome, seconds measured or 0)``."""

    call: Call


class Callbacks(NamedTuple):
    """``count`` calls from the manager back into Python, under the lock."""

    thread: str
    count: int
    api: str


class SpendCpu(NamedTuple):
    """The host work of the plan's counts; the executor returns ``(seconds it took, the
    seconds per cost term, or {})``."""

    thread: str
    counts: WorkCounts
    measured_s: float  # what the Invoke took on a real clock (0 for a modelled one)
    first_call: bool  # the thread's first call (a modelled clock may price it higher)
    api: str


class SubmitCopies(NamedTuple):
    """Submit the batches; the executor returns ``(handles to wait on, host seconds)``."""

    thread: str
    copies: list[CopyBatch]
    first_call: bool
    api: str


class ReleaseLock(NamedTuple):
    thread: str


class WaitCopies(NamedTuple):
    """The copies of ``record`` were submitted as ``handles``; set its ``copies_done`` when
    they land, and wait for them when ``block``."""

    thread: str
    record: CallRecord
    handles: list
    block: bool


class LeaveBinding(NamedTuple):
    """The call is over: the other half of the binding's Python cost, then back to the caller;
    ``abandoned``: it failed at the lock and never ran (no Python cost)."""

    thread: str
    api: str
    abandoned: bool = False


class SleepFor(NamedTuple):
    thread: str
    seconds: float


class SleepUntil(NamedTuple):
    thread: str
    time: float


class ReadClock(NamedTuple):
    """The executor returns its clock (seconds since the threads started)."""

    thread: str


class Compute(NamedTuple):
    """The thread's :class:`~kvsim.runtime.steps.GpuWork`; the executor returns its
    :class:`~kvsim.runtime.steps.GpuTimes`."""

    thread: str
    work: GpuWork


# -- what the pipeline needs from the run ------------------------------------------------------------
# How often a run with a ``progress`` callable is told how far it is: every so many calls.
PROGRESS_EVERY_CALLS = 10_000


class CallLog:
    """The run's shared records: the calls, the violations, and what the checks need. The
    executor supplies ``now`` (its clock) and the lock (for the discipline checker)."""

    def __init__(self, manager: KVCacheManager, now: Callable[[], float], lock: Any,
                 wait_for_copies: bool, check_invariants: bool, check_lock_discipline: bool,
                 progress: Callable[[str], None] | None = None,
                 recorder: Callable[[Call, str, CallRecord], None] | None = None,
                 calls_never_overlap: bool = False, nudges: bool = True) -> None:
        """``calls_never_overlap``: the driver runs one call's manager work at a time (a
        simulated clock), so the discipline checker may reuse its last digest. ``nudges``
        False: the executor does nothing on a :class:`Nudge`, so none is yielded."""
        self.manager = manager
        self.now = now
        self.lock = lock
        self.wait_for_copies = wait_for_copies
        self.check_invariants = check_invariants
        self.check_lock_discipline = check_lock_discipline
        self.progress = progress
        self.recorder = recorder
        self.calls: list[CallRecord] = []
        self.violations: list[dict] = []
        self.current_api: dict[str, str] = {}
        self._called: set[str] = set()
        self.digests = DigestCache() if calls_never_overlap else None
        self.nudges = nudges

    def new_record(self, thread: str, call: Call) -> CallRecord:
        # list.append is atomic under the GIL: real threads may call this at once
        rec = CallRecord(len(self.calls), thread, call.phase, call.api.label, call.args,
                         MODE_VALUE[call.api.mode], self.now())
        self.calls.append(rec)
        if self.progress is not None and len(self.calls) % PROGRESS_EVERY_CALLS == 0:
            self.progress(f"{len(self.calls)} calls, {self.now():.3f} s in")
        self.current_api[thread] = call.api.label
        return rec

    def first_call(self, thread: str) -> bool:
        first = thread not in self._called
        self._called.add(thread)
        return first


Effect = Any
# An effect made without its class's __new__ (a Python function that named tuples generate):
# ``_new(EnterBinding, (thread, api))`` is EnterBinding(thread, api) with every field given,
# ~1,500 instructions less, ten times a call.
_new = tuple.__new__


def call_steps(log: CallLog, thread: str, call: Call) -> Generator[Effect, Any, None]:
    """The pipeline for one call (see the module docstring)."""
    api, mode, label = call.api, call.api.mode, call.api.label
    rec = log.new_record(thread, call)
    first = log.first_call(thread)
    yield _new(EnterBinding, (thread, api))
    if mode is not LockMode.NONE:
        if log.nudges:
            yield _new(Nudge, (thread,))
        rec.lock_requested = log.now()
        hazard = yield _new(AcquireLock, (thread, mode, label))
        if hazard is not None:
            rec.ok, rec.error, rec.end = False, f"LockHazardError: {hazard}", log.now()
            yield _new(LeaveBinding, (thread, label, True))
            return
        rec.lock_granted = log.now()
    check = None
    if log.check_lock_discipline:
        check = DisciplineCheck(log.manager, log.lock.owner != thread, log.digests)
    outcome, measured_s = yield _new(Invoke, (call,))
    if check is not None:
        found = check.violation(rec, "shared" if thread in log.lock.readers else "no", log.now())
        if found:
            log.violations.append(found)
    plan = outcome.plan
    if plan.api != api.plan_api:
        raise RuntimeError(f"a call labelled {label} ran {plan.api}: the workload's label and "
                           "invocation disagree")
    if outcome.error is not None:
        rec.ok, rec.error = False, f"{type(outcome.error).__name__}: {outcome.error}"
    result = outcome.value
    rec.result = result if isinstance(result, (bool, int)) else None
    if result is False:
        rec.ok = False
    counts = plan.counts
    rec.work = counts
    callbacks = counts.callback_calls + counts.events_emitted
    if callbacks:
        yield _new(Callbacks, (thread, callbacks, label))
    rec.cpu_s, rec.cpu_terms_us = yield _new(SpendCpu, (thread, counts, measured_s, first, label))
    copies = list(plan.copies)
    handles, rec.submit_s = yield _new(SubmitCopies, (thread, copies, first, label))
    account_copies(rec, copies, counts)
    if mode is LockMode.EXCLUSIVE and log.check_invariants:
        log.violations += invariant_violations(log.manager, rec, log.now())
    if mode is not LockMode.NONE:
        yield _new(ReleaseLock, (thread,))
        rec.lock_released = log.now()
    if handles:
        yield _new(WaitCopies, (thread, rec, handles, log.wait_for_copies))
    yield _new(LeaveBinding, (thread, label, False))
    rec.end = log.now()
    if log.recorder is not None:
        log.recorder(call, thread, rec)


def thread_steps(log: CallLog, name: str, steps: Iterator[Step]) -> Generator[Effect, Any, None]:
    """One workload thread: its calls through :func:`call_steps`, its other steps as effects
    (the values of :class:`Now` and :class:`GpuWork` are sent back into the thread)."""
    value = None
    while True:
        try:
            step = steps.send(value) if value is not None else next(steps)
        except StopIteration:
            return
        value = None
        if isinstance(step, Call):
            yield from call_steps(log, name, step)
        elif isinstance(step, Sleep):
            yield _new(SleepFor, (name, step.seconds))
        elif isinstance(step, Until):
            yield _new(SleepUntil, (name, step.time))
        elif isinstance(step, Now):
            value = yield _new(ReadClock, (name,))
        elif isinstance(step, GpuWork):
            value = yield _new(Compute, (name, step))
        else:
            raise TypeError(f"unknown workload step {step!r}")

