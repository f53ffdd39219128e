"""SimExecutor: the manager's calls, in simulated time.

Each workload thread is a SimPy process. One API call goes through:

1. **enter the binding** -- the thread takes the GIL and spends ``python_call_us / 2``;
2. **GIL release** -- a binding that may block on the lock releases the GIL first (the fixed
   KVCM2 bindings; per API, ``gil_release``), or keeps it (the bug the seed fixed);
3. **lock** -- in the API's declared mode (``kvsim.runtime.apis``), reader- or writer-preferring;
4. **manager step** -- the real manager runs the call at this instant and records a plan;
5. **callbacks** -- priority-callback and event-sink calls re-take the GIL under the lock,
   ``callback_us`` each;
6. **CPU** -- ``cpu_model.seconds(plan.counts)``, plus the host cost of submitting the copies
   (unless the CPU preset already includes it);
7. **copies** -- submitted to the manager's copy stream; the lock is released; by default the
   call returns now (stream semantics, as KVCM2), or waits for its copies (``wait_for_copies``);
8. **return to Python** -- the GIL again, ``python_call_us / 2``.

A thread that can never continue (a lock or GIL wait with no way out) does not freeze the run:
when no event is left, the executor reports every stuck thread with what it holds and waits for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import simpy

from kvsim.errors import KvsimError
from kvsim.hardware.spec import HardwareSpec
from kvsim.manager.manager import KVCacheManager
from kvsim.model.copy_paths import PATHS, CopyRequest
from kvsim.model.cpu_cost import CpuCostModel
from kvsim.runtime.apis import API_LOCK_MODES, LockMode
from kvsim.runtime.checks import DisciplineCheck, account_copies, invariant_violations, work_of
from kvsim.runtime.records import CallRecord, Deadlock, StuckThread
from kvsim.runtime.steps import Call, Sleep, Step, Until
from kvsim.sim.gil import Gil
from kvsim.sim.link import Link
from kvsim.sim.rwlock import LockHazardError, ReentrantSharedMutex
from kvsim.sim.stream import CopyStream

MAIN_THREAD = "MainThread"  # Python's name for the thread that starts the workload threads


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for events-per-second)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()


@dataclass(frozen=True)
class SimOptions:
    lock_policy: str = "reader"
    # auto: KVCM2's rule (kernel on coherent links, ce-batch on PCIe); select: the cheapest path
    # by the model (what the hardware executor's selector does); or a fixed path.
    copy_path: str = "auto"
    kernel_ctas: int | None = None  # None: KVCM2's grid policy
    kernel_inflight_bytes: int | None = None  # None: the preset's reference depth
    aligned: bool = True  # False: pool layout forces the alignment-agnostic kernel
    wait_for_copies: bool = False
    gil_release: Mapping[str, bool] = field(default_factory=dict)  # API -> releases the GIL
    check_invariants: bool = True  # after every exclusive call
    check_lock_discipline: bool = True  # no mutation without the lock held exclusively
    # Interleaving exploration: with a seed, every modelled delay is scaled by a random factor in
    # [1 - jitter, 1 + jitter] and every thread start and lock request is delayed by up to
    # jitter_s, which permutes the order of events that would otherwise be simultaneous.
    schedule_seed: int | None = None
    jitter: float = 0.1
    jitter_s: float = 1e-6
    gil_seed: int = 0  # the random draws of the measured GIL hand-over (the CPU preset's)


@dataclass
class SimRun:
    calls: list[CallRecord]
    lock: ReentrantSharedMutex
    gil: Gil
    link: Link
    stream: CopyStream
    stuck: list[StuckThread]
    deadlocks: list[Deadlock]
    violations: list[dict]
    end_time: float
    events_processed: int
    thread_starts: dict[str, list[float]] = field(default_factory=dict)


class SimExecutor:
    def __init__(self, manager: KVCacheManager, hardware: HardwareSpec, cpu: CpuCostModel,
                 options: SimOptions | None = None) -> None:
        self.manager = manager
        self.hw = hardware
        self.cpu = cpu
        self.options = options or SimOptions()
        opt = self.options
        if opt.copy_path not in ("auto", "select") and opt.copy_path not in PATHS:
            raise ValueError(f"copy_path must be auto, select or one of {', '.join(PATHS)}")
        self.env = CountingEnvironment()
        # A Python manager runs on hw.rwlock's condition-variable lock: woken waiters re-test.
        self.lock = ReentrantSharedMutex(self.env, opt.lock_policy, recheck=cpu.holds_gil)
        self.gil = Gil(self.env, cpu.gil_switch_interval_us * 1e-6,
                       cpu.gil_handover if cpu.holds_gil else None, opt.gil_seed, MAIN_THREAD)
        self.link = Link(self.env, hardware)
        path = hardware.default_path() if opt.copy_path == "auto" else opt.copy_path
        self.stream = CopyStream(self.env, "migration", self.link, hardware,
                                 {"offload": path, "onboard": path}, opt.kernel_ctas,
                                 opt.kernel_inflight_bytes, opt.aligned)
        self.calls: list[CallRecord] = []
        self.violations: list[dict] = []
        self._waiting: dict[str, tuple[str, str]] = {}  # thread -> (what, api)
        self._current_api: dict[str, str] = {}
        self._alive: set[str] = set()
        self._called: set[str] = set()  # threads that have made a call
        self.deadlocks: list[Deadlock] = []
        # thread -> [Thread.start() called, the thread's first Python] (when starts are modelled)
        self.thread_starts: dict[str, list[float]] = {}
        self.progress = None  # optional callable(str): a line every 10,000 calls
        self._stop = self.env.event()  # succeeds when a deadlock makes further progress moot
        self._rng = (None if opt.schedule_seed is None
                     else np.random.default_rng(opt.schedule_seed))

    def _delay(self, seconds: float):
        """A modelled delay, perturbed when exploring schedules."""
        if self._rng is not None:
            seconds *= 1.0 + self._rng.uniform(-self.options.jitter, self.options.jitter)
        return self.env.timeout(max(seconds, 0.0))

    def _nudge(self):
        """Nothing, or (when exploring) a random sliver of time that reorders equal-time events."""
        if self._rng is None:
            return None
        return self.env.timeout(self._rng.uniform(0.0, self.options.jitter_s))

    # -- the call pipeline ---------------------------------------------------------------------
    def _call(self, thread: str, call: Call):
        """One API call (see the module docstring). With a Python manager (the CPU preset's
        ``holds_gil``) every bit of host work is Python and runs through :meth:`_python`: the
        thread keeps the GIL across calls and gives it up only when it blocks or is asked to."""
        env, opt = self.env, self.options
        python_manager = self.cpu.holds_gil
        mode = API_LOCK_MODES.get(call.api, LockMode.NONE)
        rec = CallRecord(len(self.calls), thread, call.phase, call.api, call.args, mode.value,
                         env.now)
        self.calls.append(rec)
        if self.progress is not None and len(self.calls) % 10_000 == 0:
            self.progress(f"{len(self.calls)} calls, {env.now:.3f} s simulated")
        self._current_api[thread] = call.api
        # A thread's first call: its host work is scaled by the CPU preset's first_call_factor.
        slow = self.cpu.first_call_factor if thread not in self._called else 1.0
        self._called.add(thread)
        half_python = self.cpu.python_call_us * 0.5e-6
        yield from self._python(thread, half_python, call.api)
        if not python_manager and opt.gil_release.get(call.api, True):
            self.gil.release_fully(thread)
        if mode is not LockMode.NONE:
            nudge = self._nudge()
            if nudge is not None:
                yield nudge
            rec.lock_requested = env.now
            self._waiting[thread] = ("lock", call.api)
            try:
                request = self.lock.acquire(thread, mode, call.api)
                while True:
                    if not request.triggered:
                        if python_manager:  # threading.Condition.wait releases the GIL
                            self.gil.release_fully(thread)
                        self._check_deadlock(thread)
                    if (yield request) is not None or not self.lock.recheck:
                        break
                    # Woken by a release: run again (a Python thread needs the GIL) and re-test.
                    yield from self._take_gil(thread, call.api)
                    self._waiting[thread] = ("lock", call.api)
                    request = self.lock.retry(thread)
            except LockHazardError as e:
                del self._waiting[thread]
                rec.ok, rec.error, rec.end = False, f"LockHazardError: {e}", env.now
                self.gil.release_fully(thread)
                return
            del self._waiting[thread]
            rec.lock_granted = env.now
        check = DisciplineCheck(self.manager,
                                opt.check_lock_discipline and self.lock.owner != thread)
        try:
            result = call.invoke()
        except KvsimError as e:
            result = None
            rec.ok, rec.error = False, f"{type(e).__name__}: {e}"
        found = check.violation(rec, "shared" if thread in self.lock.readers else "no", env.now)
        if found:
            self.violations.append(found)
        counts, copies = work_of(self.manager, result)
        rec.result = result if isinstance(result, (bool, int)) else None
        if result is False:
            rec.ok = False
        rec.counts = counts.to_dict()
        callbacks = counts.callback_calls + counts.events_emitted
        if callbacks:
            # The manager calls back into Python under the lock: it needs the GIL.
            yield from self._take_gil(thread, call.api + " (callback)")
            yield self._delay(callbacks * self.cpu.callback_us * 1e-6)
            if not python_manager:
                self.gil.release(thread)
        rec.cpu_s = self.cpu.seconds(counts) * slow
        rec.cpu_terms_us = self.cpu.terms_us(counts)
        if python_manager:
            yield from self._python(thread, rec.cpu_s, call.api)
        elif rec.cpu_s:
            yield self._delay(rec.cpu_s)
        if not self.cpu.includes_copy_submission:
            rec.submit_s = sum(self.stream.host_seconds(b) for b in copies) * slow
            if python_manager:
                yield from self._python(thread, rec.submit_s, call.api)
            elif rec.submit_s:
                yield self._delay(rec.submit_s)
        done = [self.stream.submit(b, thread, call.api) for b in copies]
        account_copies(rec, copies, counts)
        if mode is LockMode.EXCLUSIVE and opt.check_invariants:
            self.violations += invariant_violations(self.manager, rec, env.now)
        if mode is not LockMode.NONE:
            self.lock.release(thread)
            rec.lock_released = env.now
        if done:
            all_done = env.all_of(done)
            all_done.callbacks.append(lambda _e, r=rec: setattr(r, "copies_done", env.now))
            if opt.wait_for_copies:
                if python_manager:  # a stream synchronize blocks without the GIL
                    self.gil.release_fully(thread)
                yield all_done
        yield from self._python(thread, half_python, call.api)
        if not python_manager:
            self.gil.release_fully(thread)
        rec.end = env.now

    def _python(self, thread: str, seconds: float, api: str):
        """Run ``seconds`` of Python on ``thread``: it needs the GIL, and it gives the GIL up
        mid-way when a waiter's switch interval asks for it (then queues to get it back)."""
        if not self.cpu.holds_gil:  # C++ manager: short Python edges, no forced switch to model
            yield from self._take_gil(thread, api)
            if seconds > 0.0:
                yield self._delay(seconds)
            return
        remaining = seconds
        while True:
            yield from self._take_gil(thread, api)
            if remaining <= 0.0:
                return
            start = self.env.now
            yield self._delay(remaining) | self.gil.drop_requested
            remaining -= self.env.now - start
            if remaining <= 1e-12:
                return
            self.gil.forced_switches += 1
            self.gil.release_fully(thread)

    def _take_gil(self, thread: str, api: str):
        if self.gil.holds(thread):
            return
        self._waiting[thread] = ("gil", api)
        request = self.gil.acquire(thread)
        if not request.triggered:
            self._check_deadlock(thread)
        yield request
        del self._waiting[thread]

    # -- the wait-for graph -------------------------------------------------------------------
    def _waits_on(self, thread: str) -> list[str]:
        """Threads ``thread`` waits for: holders of what it waits for (and, under writer
        preference, the writers queued ahead of a waiting reader)."""
        what, _api = self._waiting.get(thread, ("", ""))
        # A request granted but not yet resumed (same simulated instant) waits for nothing.
        if what == "gil":
            return [self.gil.owner] if self.gil.owner not in (None, thread) else []
        if what == "lock" and (self.lock.owner == thread or thread in self.lock.readers):
            return []
        if what == "lock":
            out = [t for t in self.lock.holders() if t != thread]
            mine = [m for t, m in self.lock.waiting_threads() if t == thread]
            if self.lock.policy == "writer" and mine and mine[0] == "shared":
                out += [t for t, m in self.lock.waiting_threads() if m == "exclusive" and t != thread]
            return out
        return []

    def _describe(self, thread: str) -> StuckThread:
        what, api = self._waiting.get(thread, ("?", self._current_api.get(thread, "")))
        holds = []
        if self.lock.owner == thread:
            holds.append("manager lock (exclusive)")
        if thread in self.lock.readers:
            holds.append("manager lock (shared)")
        if self.gil.owner == thread:
            holds.append("GIL")
        return StuckThread(thread, api, {"lock": "manager lock", "gil": "GIL"}.get(what, what), holds)

    def _check_deadlock(self, start: str) -> None:
        """Depth-first search of the wait-for graph from a thread that just started waiting."""
        path: list[str] = []
        on_path: set[str] = set()

        def visit(t: str) -> list[str] | None:
            if t in on_path:
                return path[path.index(t):]
            if t not in self._waiting:
                return None
            path.append(t)
            on_path.add(t)
            for nxt in self._waits_on(t):
                cycle = visit(nxt)
                if cycle:
                    return cycle
            path.pop()
            on_path.discard(t)
            return None

        cycle = visit(start)
        if cycle:
            self.deadlocks.append(Deadlock(self.env.now, [self._describe(t) for t in cycle]))
            if not self._stop.triggered:
                self._stop.succeed()

    # -- threads ------------------------------------------------------------------------------
    def _thread(self, name: str, steps: Iterator[Step], started: simpy.Event | None = None):
        self._alive.add(name)
        nudge = self._nudge()
        if nudge is not None:
            yield nudge
        if started is not None:  # the new thread's bootstrap runs Python, then wakes its starter
            yield from self._take_gil(name, "Thread.start")
            self.thread_starts[name].append(self.env.now)
            started.succeed()
        for step in steps:
            if isinstance(step, Call):
                yield from self._call(name, step)
            elif isinstance(step, Sleep):
                self.gil.release_fully(name)  # sleeping threads do not hold the GIL
                yield self.env.timeout(step.seconds)
            elif isinstance(step, Until):
                self.gil.release_fully(name)
                if step.time > self.env.now:
                    yield self.env.timeout(step.time - self.env.now)
            else:
                raise TypeError(f"unknown workload step {step!r}")
        self.gil.release_fully(name)
        self._alive.discard(name)

    def _starter(self, threads: Mapping[str, Iterator[Step]]):
        """The main thread starting the workload threads in name order, as the hardware executor
        does: each ``Thread.start()`` runs Python on the main thread, then blocks (GIL released)
        until the new thread has run; the main thread then queues for the GIL again."""
        for name in sorted(threads):
            yield from self._take_gil(MAIN_THREAD, "Thread.start")
            self.thread_starts[name] = [self.env.now]
            yield from self._python(MAIN_THREAD, self.cpu.thread_start_us * 1e-6, "Thread.start")
            started = self.env.event()
            self.env.process(self._thread(name, threads[name], started))
            self.gil.release_fully(MAIN_THREAD)
            yield started
        self._alive.discard(MAIN_THREAD)

    def run(self, threads: Mapping[str, Iterator[Step]], until: float | None = None) -> SimRun:
        if self.cpu.holds_gil and self.cpu.thread_start_us > 0:
            self._alive.add(MAIN_THREAD)
            self.env.process(self._starter(threads))
        else:
            for name in sorted(threads):
                self.env.process(self._thread(name, threads[name]))
        stop = self._stop if until is None else self.env.any_of([self._stop, self.env.timeout(until)])
        try:
            self.env.run(until=stop)
        except RuntimeError as e:  # no event left before the stop event: a normal end
            if "No scheduled events left" not in str(e):
                raise
        # Threads still alive with no event left (or after a deadlock stopped the run) can never
        # continue: report them. With a time limit that was reached they were merely cut off.
        ended = self.env.peek() == float("inf") or self._stop.triggered
        stuck = self._stuck() if ended else []
        return SimRun(self.calls, self.lock, self.gil, self.link, self.stream, stuck,
                      self.deadlocks, self.violations, self.env.now, self.env.events_processed,
                      self.thread_starts)

    def _stuck(self) -> list[StuckThread]:
        return [self._describe(t) for t in sorted(self._alive) if t in self._waiting]


__all__ = ["CopyRequest", "SimExecutor", "SimOptions", "SimRun", "CallRecord", "StuckThread"]
