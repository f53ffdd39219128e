"""SimExecutor: the manager's calls, in simulated time.

Each workload thread is a SimPy process running :func:`kvsim.runtime.pipeline.thread_steps`;
this module performs the pipeline's effects in simulated time (a delay or grant nothing else can
come before skips SimPy's queue, with the same outcome: :mod:`kvsim.sim.environment`):

* **Python** (entering and leaving a binding): the thread takes the GIL and spends
  ``python_call_us / 2``, plus the CPU preset's ``after_sleep_us`` on the first entry after the
  thread slept; with ``after_sleep_factor`` every host cost of the call after a sleep is
  stretched;
* **the binding waits**: a binding that may block on the lock releases the GIL first (the fixed
  KVCM2 bindings; per API, ``gil_release``), or keeps it (the bug the seed fixed);
* **the lock**: the SimPy reader-writer lock (:mod:`kvsim.sim.rwlock`), reader- or
  writer-preferring; a Python manager's waiter re-tests after each release, holding the GIL
  (with the CPU preset's optional ``lock_test_us`` per test and ``lock_wake_us`` before a woken
  waiter runs again; with ``lock_mutex`` through the Condition's own mutex,
  :mod:`kvsim.sim.lock_convoy`); with ``sleep_retakes_gil`` a sleep ends holding the GIL;
* **the manager call**: the real manager runs the call at this instant and returns its plan;
* **callbacks**: priority-callback and event-sink calls re-take the GIL under the lock,
  ``callback_us`` each;
* **CPU**: ``cpu_model.price(plan.counts, method)`` (``method``: the manager method the call
  ran, for a preset's ``api_call_us``), plus the host cost of submitting the copies
  (unless the CPU preset already includes it; with a Python manager, the preset's
  ``copy_submit_gil_free`` share of the submission runs without the GIL);
* **copies**: submitted to the manager's copy stream (:mod:`kvsim.sim.stream`); by default the
  call returns without waiting for them (stream semantics, as KVCM2);
* **GPU work** (:class:`~kvsim.runtime.steps.GpuWork`, a serving engine's forward pass): the
  thread, without the GIL, waits for the copies it submitted since its last pass (all of them,
  or layer by layer), then the pass's modelled seconds.

With a Python manager (a CPU preset with ``holds_gil``) every bit of host work is Python and
runs through :meth:`SimExecutor._python`: the thread keeps the GIL across calls and gives it up
only when it blocks or is asked to. A thread that can never continue (a lock or GIL wait with no
way out) does not freeze the run: when no event is left, the executor reports every stuck
thread with what it holds and waits for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import simpy

from kvsim.hardware.disk import DiskSpec
from kvsim.hardware.spec import HardwareSpec
from kvsim.manager.manager import KVCacheManager
from kvsim.model.copy_paths import PATHS
from kvsim.model.cpu_cost import CpuCostModel
from kvsim.runtime import pipeline
from kvsim.runtime.apis import Api
from kvsim.runtime.records import Deadlock, GilStats, RunResult, StuckThread
from kvsim.runtime.steps import GpuTimes, Step
from kvsim.sim import lock_convoy
from kvsim.sim.collector import no_collections
from kvsim.sim.environment import CountingEnvironment
from kvsim.sim.gil import Gil
from kvsim.sim.link import Link
from kvsim.sim.rwlock import CondMutex, LockHazardError, ReentrantSharedMutex
from kvsim.sim.stream import CopyStream

MAIN_THREAD = "MainThread"  # Python's name for the thread that starts the workload threads


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


class _Rest:
    """What an inline effect handler returns when the effect needs SimPy events: the generator
    that finishes it (its return value is the effect's result)."""

    __slots__ = ("steps",)

    def __init__(self, steps) -> None:
        self.steps = steps


class SimExecutor:
    # Class-wide switch for the tests that compare runs without the inline effects (_drive).
    inline_effects = True

    def __init__(self, manager: KVCacheManager, hardware: HardwareSpec, cpu: CpuCostModel,
                 options: SimOptions | None = None, disk: DiskSpec | None = None) -> None:
        """``disk``: the drives of the disk level (level 2); None prices its copies as CPU-GPU
        copies."""
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
        self.link = Link.of_hardware(self.env, hardware)
        path = hardware.default_path() if opt.copy_path == "auto" else opt.copy_path
        self.stream = CopyStream(self.env, "migration", self.link, hardware,
                                 {"offload": path, "onboard": path}, opt.kernel_ctas,
                                 opt.kernel_inflight_bytes, opt.aligned, disk)
        self._rng = (None if opt.schedule_seed is None
                     else np.random.default_rng(opt.schedule_seed))
        # The clock as the pipeline reads it (several times a call): SimPy's now, without a
        # Python frame for the property.
        self.log = pipeline.CallLog(manager, functools.partial(getattr, self.env, "_now"),
                                    self.lock, opt.wait_for_copies, opt.check_invariants,
                                    opt.check_lock_discipline, calls_never_overlap=True,
                                    nudges=self._rng is not None)
        self._waiting: dict[str, tuple[str, str]] = {}  # thread -> (what, api)
        self._slept: dict[str, float] = {}  # thread -> how long it last slept, until it runs
        # thread -> the factor on its host costs until its next call ends (after_sleep_factor)
        self._cold: dict[str, float] = {}
        # thread -> the first lock test's seconds, taken out of its next Python (lock_test_us)
        self._prepaid: dict[str, float] = {}
        self._lock_tested: set[str] = set()  # threads past their first lock test
        self._alive: set[str] = set()
        p = pipeline
        self._plain = {p.Invoke: self._do_invoke, p.ReleaseLock: self._do_release,
                       p.ReadClock: lambda e: self.env.now}
        self._timed = {p.EnterBinding: self._do_enter, p.LeaveBinding: self._do_leave,
                       p.Nudge: self._do_nudge,
                       p.AcquireLock: self._do_acquire, p.Callbacks: self._do_callbacks,
                       p.SpendCpu: self._do_cpu, p.SubmitCopies: self._do_submit,
                       p.WaitCopies: self._do_wait_copies, p.SleepFor: self._do_sleep,
                       p.SleepUntil: self._do_sleep_until, p.Compute: self._do_compute}
        # The Condition's own mutex (CPU preset lock_mutex): the lock's steps go through it.
        self.mutex = CondMutex(self.env) if cpu.lock_mutex and self.lock.recheck else None
        if self.mutex is not None:
            del self._plain[p.ReleaseLock]
            self._timed[p.AcquireLock] = lambda e: lock_convoy.acquire(self, e)
            self._timed[p.ReleaseLock] = lambda e: lock_convoy.release(self, e)
        self._last_copy: dict[str, simpy.Event] = {}  # thread -> its last copy batch's event
        self.deadlocks: list[Deadlock] = []
        # thread -> [Thread.start() called, the thread's first Python] (when starts are modelled)
        self.thread_starts: dict[str, list[float]] = {}
        self._stop = self.env.event()  # succeeds when a deadlock makes further progress moot
        # the CPU preset's distribution tables' draws, one generator per table (see _draw)
        self._table_rngs: dict[int, np.random.Generator] = {}
        # Effects that usually end at once (see _drive): done inline, or handed to a generator
        # for what needs SimPy events. Only where waiters never re-test (a C++ manager) and no
        # schedule is explored; the timed handlers above do the same in every case.
        at_once: dict[type, object] = {}
        if self.inline_effects and not cpu.holds_gil and self._rng is None:
            at_once = {p.EnterBinding: self._enter_at_once,
                       p.LeaveBinding: self._leave_at_once, p.SpendCpu: self._cpu_at_once,
                       p.SubmitCopies: self._submit_at_once, p.AcquireLock: self._acquire_at_once}
        # What _drive does without a generator, looked up once per effect: the plain handlers
        # (whose results are never a _Rest) and these.
        self._inline = {**self._plain, **at_once}

    @property
    def progress(self):
        """An optional ``callable(str)``, told every 10,000 calls how far the run is."""
        return self.log.progress

    @progress.setter
    def progress(self, say) -> None:
        self.log.progress = say

    def _jittered(self, seconds: float) -> float:
        """A modelled delay's seconds, perturbed when exploring schedules."""
        if self._rng is not None:
            seconds *= 1.0 + self._rng.uniform(-self.options.jitter, self.options.jitter)
        return max(seconds, 0.0)

    def _wait(self, seconds: float):
        """``yield from``: a modelled delay (jittered, as :meth:`_jittered`)."""
        return self._sleep(self._jittered(seconds))

    def _sleep(self, seconds: float):
        """``yield from``: ``seconds`` of simulated time, without an event when none is due
        before they end (:meth:`CountingEnvironment.fast_forward`)."""
        if not self.env.fast_forward(seconds):
            yield self.env.timeout(seconds)

    def _nudge(self):
        """Nothing, or (when exploring) a random sliver of time that reorders equal-time events."""
        if self._rng is None:
            return None
        return self.env.timeout(self._rng.uniform(0.0, self.options.jitter_s))

    # -- the call pipeline: kvsim.runtime.pipeline's effects, in simulated time ------------------
    def _drive(self, steps):
        """Run a pipeline generator, performing each effect it yields (SimPy events inside).

        An effect in ``_inline`` is tried inline first: its handler returns the effect's
        result, or a :class:`_Rest` whose generator does the rest with events. Same steps in the
        same order as the timed handler, without a chain of generators per effect (a call makes
        about ten effects, and most end at once: a free GIL, a delay nothing interrupts)."""
        send = None
        timed, inline = self._timed, self._inline
        while True:
            try:
                effect = steps.send(send)
            except StopIteration:
                return
            handler = inline.get(type(effect))
            if handler is not None:
                send = handler(effect)
                if type(send) is _Rest:
                    send = yield from send.steps
            else:
                send = yield from timed[type(effect)](effect)

    # -- effects done inline where they end at once (C++ manager, no exploration) ------------------
    # Each mirrors its timed handler step for step (the same draws, the same shortcut tests, in
    # the same order) and hands over to a generator at the first step that needs an event.
    def _host_delay(self, seconds: float, result=None):
        """``result`` after ``seconds`` (>= 0) of modelled delay (as :meth:`_wait`, without
        schedule exploration, hence without jitter: the only case with inline effects): at once,
        or a :class:`_Rest` that waits for a timeout first."""
        if seconds:
            if not self.env.fast_forward(seconds):
                return _Rest(self._timeout_then(seconds, result))
        return result

    def _timeout_then(self, seconds: float, result):
        yield self.env.timeout(seconds)
        return result

    def _gil_at_once(self, thread: str) -> bool:
        """Whether ``thread`` holds the GIL now without an event: it held it already, or the
        free GIL is granted as acquire would grant it (:meth:`CountingEnvironment.succeed_now`)."""
        gil = self.gil
        return gil.owner == thread or gil.take_if_free(thread)

    def _python_at_once(self, thread: str, api: str):
        """Half the binding's Python cost (as :meth:`_python`): at once, or a :class:`_Rest`."""
        seconds = self._binding_python_s(thread)
        if not self._gil_at_once(thread):
            return _Rest(self._python(thread, seconds, api))
        return self._host_delay(self._stretched(thread, seconds))

    def _enter_at_once(self, e: pipeline.EnterBinding):
        got = self._python_at_once(e.thread, e.api.label)
        if type(got) is _Rest:
            return _Rest(self._then(got.steps, self._binding_waits, e))
        self._binding_waits(e)
        return None

    def _leave_at_once(self, e: pipeline.LeaveBinding):
        if not e.abandoned:
            got = self._python_at_once(e.thread, e.api)
            if type(got) is _Rest:
                return _Rest(self._then(got.steps, self._left, e))
        self._left(e)
        return None

    @staticmethod
    def _then(steps, after, e):
        """``yield from``: ``steps``, then ``after(e)``."""
        yield from steps
        after(e)

    def _cpu_at_once(self, e: pipeline.SpendCpu):
        seconds, terms = self._call_cpu_s(e)
        return self._host_delay(seconds, (seconds, terms))

    def _submit_at_once(self, e: pipeline.SubmitCopies):
        if not e.copies:
            return [], 0.0
        return _Rest(self._do_submit(e))

    def _acquire_at_once(self, e: pipeline.AcquireLock):
        """A lock whose waiters do not re-test (a C++ manager's): granted at once, or a
        :class:`_Rest` that waits for the grant."""
        thread = e.thread
        if self.lock.free_for(thread, e.mode) and self.env.succeed_now():
            self.lock.take_now(thread, e.mode, e.api)  # uncontended: no event needed
            return None
        self._waiting[thread] = ("lock", e.api)
        try:
            request = self.lock.acquire(thread, e.mode, e.api, defer_test=False)
        except LockHazardError as hazard:
            del self._waiting[thread]
            return hazard
        if request.triggered and self.env.process_now(request):
            del self._waiting[thread]
            return None
        return _Rest(self._acquire_wait(thread, request))

    def _acquire_wait(self, thread: str, request):
        """The rest of :meth:`_acquire_at_once`: wait for the grant (or the hazard)."""
        try:
            if not request.triggered:
                self._check_deadlock(thread)
            if not self.env.process_now(request):
                yield request
        except LockHazardError as hazard:
            del self._waiting[thread]
            return hazard
        del self._waiting[thread]
        return None

    def _binding_python_s(self, thread: str) -> float:
        """Seconds of half the binding's Python cost on ``thread``, less a lock test already paid
        (lock_test_us), plus the after-sleep cost of its first Python after a sleep."""
        seconds = self.cpu.python_call_us * 0.5e-6
        seconds -= min(seconds, self._prepaid.pop(thread, 0.0))
        slept = self._slept.pop(thread, 0.0)
        if slept:  # the first Python after a sleep runs cold (CPU preset's after_sleep_us)
            seconds += self.cpu.after_sleep_s(slept)
        return seconds

    def _do_enter(self, e: pipeline.EnterBinding):
        yield from self._python(e.thread, self._binding_python_s(e.thread), e.api.label)
        self._binding_waits(e)

    def _binding_waits(self, e: pipeline.EnterBinding) -> None:
        if not self.cpu.holds_gil and self.options.gil_release.get(e.api.label, True):
            self.gil.release_fully(e.thread)

    def _do_nudge(self, e: pipeline.Nudge):
        nudge = self._nudge()
        if nudge is not None:
            yield nudge

    def _do_acquire(self, e: pipeline.AcquireLock):
        """The lock in ``e.mode``; a Python manager's waiter re-tests after each release
        (``threading.Condition``), holding the GIL to do so. Returns None or the hazard."""
        if not self.lock.recheck:  # a C++ manager's lock: granted, or waited for once
            got = self._acquire_at_once(e)
            return (yield from got.steps) if type(got) is _Rest else got
        thread = e.thread
        test_s = self.lock_test_s(thread)
        wake_s = self.cpu.lock_wake_us * 1e-6
        retest_s = self.lock_retest_s()
        self._waiting[thread] = ("lock", e.api)
        try:
            # With lock_test_us the first test is deferred: queued now, tested after its cost.
            request = self.lock.acquire(thread, e.mode, e.api, defer_test=test_s > 0.0)
            woken = False
            while True:
                if not request.triggered:
                    self.gil.release_fully(thread)  # threading.Condition.wait releases the GIL
                    self._check_deadlock(thread)
                got = request.value if self.env.process_now(request) else (yield request)
                if got is not None:
                    break
                # Woken by a release (or the deferred first test): run again (after the wake-up,
                # a Python thread needs the GIL) and re-test, paying the test's host time.
                # (Waking up and testing are not waiting for the lock's holders: marked apart,
                # so the wait-for graph sees no lock wait there.)
                if woken and wake_s > 0.0:
                    self._waiting[thread] = ("lock wake-up", e.api)
                    yield from self._wait(wake_s)
                yield from self._take_gil(thread, e.api)
                pay_s = retest_s if woken else test_s
                if pay_s > 0.0:
                    if not woken:  # the uncontended acquire, already in python_call_us
                        self._prepaid[thread] = test_s
                    self._waiting[thread] = ("lock test", e.api)
                    yield from self._python(thread, pay_s, e.api)
                woken = True
                self._waiting[thread] = ("lock", e.api)
                request = self.lock.retry(thread)
        except LockHazardError as hazard:
            del self._waiting[thread]
            return hazard
        del self._waiting[thread]
        return None

    def lock_test_s(self, thread: str) -> float:
        """Seconds of ``thread``'s first test of the lock in this acquire: the CPU preset's
        ``lock_first_test_us`` the first time the thread acquires (when set), ``lock_test_us``
        after."""
        if self.cpu.lock_first_test_us and thread not in self._lock_tested:
            self._lock_tested.add(thread)
            return self.cpu.lock_first_test_us * 1e-6
        return self.cpu.lock_test_us * 1e-6

    def lock_retest_s(self) -> float:
        """Seconds of a woken waiter's re-test: ``lock_retest_us`` where measured, else
        ``lock_test_us``."""
        return (self.cpu.lock_retest_us or self.cpu.lock_test_us) * 1e-6

    def _do_invoke(self, e: pipeline.Invoke) -> tuple:
        return e.call.invoke(), 0.0

    def _do_callbacks(self, e: pipeline.Callbacks):
        # The manager calls back into Python under the lock: it needs the GIL.
        yield from self._take_gil(e.thread, e.api + " (callback)")
        yield from self._wait(e.count * self.cpu.callback_us * 1e-6)
        if not self.cpu.holds_gil:
            self.gil.release(e.thread)

    def _call_cpu_s(self, e: pipeline.SpendCpu) -> tuple[float, dict[str, float]]:
        """The plan's CPU seconds (first call and spread applied), and the cost terms they
        come from (:meth:`CpuCostModel.price`, for the manager method the plan ran when the
        preset prices methods)."""
        slow = self.cpu.first_call_factor if e.first_call else 1.0
        method = Api.named(e.api).plan_api if self.cpu.api_call_us else None
        seconds, terms = self.cpu.price(e.counts, method)
        # The host's CPU-time ratio for this call (CPU preset's call_cpu_spread), drawn per call
        spread = self.cpu.call_cpu_spread
        return seconds * slow * (self._draw(spread, 11) if spread else 1.0), terms

    def _do_cpu(self, e: pipeline.SpendCpu):
        seconds, terms = self._call_cpu_s(e)
        if self.cpu.holds_gil:  # recorded as run (stretched after a sleep)
            seconds = yield from self._python(e.thread, seconds, e.api)
        elif seconds:
            yield from self._wait(seconds)
        return seconds, terms

    def _do_submit(self, e: pipeline.SubmitCopies):
        handles, submit_s = yield from self._submit(e)
        # One FIFO stream: the thread's last batch on it lands after all its earlier ones.
        on_stream = [h for b, h in zip(e.copies, handles) if not self.stream.off_stream(b)]
        if on_stream:
            self._last_copy[e.thread] = on_stream[-1]
        return handles, submit_s

    def _submit(self, e: pipeline.SubmitCopies):
        if self.cpu.includes_copy_submission:
            return [self.stream.submit(b, e.thread, e.api) for b in e.copies], 0.0
        # The batches are submitted one after another; each may start on the device once its own
        # submission lets it (the stream's lead), while the host goes on submitting.
        slow = self.cpu.first_call_factor if e.first_call else 1.0
        handles, submit_s, now = [], 0.0, self.env.now
        for b in e.copies:
            host_s, lead_s = self.stream.submission_seconds(b)
            handles.append(self.stream.submit(b, e.thread, e.api,
                                              not_before=now + submit_s + lead_s * slow))
            submit_s += host_s * slow
        if self.cpu.holds_gil:
            # Python first (building the batches), then the CUDA calls, which release the GIL
            # (CPU preset's copy_submit_gil_free share of the host time).
            free_s = submit_s * self.cpu.copy_submit_gil_free
            submit_s = yield from self._python(e.thread, submit_s - free_s, e.api)
            if free_s > 0.0:
                free_s = self._stretched(e.thread, free_s)
                self.gil.release_fully(e.thread)
                yield from self._wait(free_s)
                yield from self._take_gil(e.thread, e.api)
                submit_s += free_s
        elif submit_s:
            yield from self._wait(submit_s)
        return handles, submit_s

    def _do_compute(self, e: pipeline.Compute):
        """The pass of :class:`~kvsim.runtime.steps.GpuWork`: its copies, then its seconds (or,
        with ``layers``, overlapped with them layer by layer)."""
        env, work = self.env, e.work
        self.gil.release_fully(e.thread)  # the thread waits on the GPU, not in Python
        start = env.now
        last = self._last_copy.pop(e.thread, None)
        if last is not None and not last.processed:
            yield last
        landed = env.now
        if work.layers > 0:
            end = max(landed + work.seconds / work.layers,
                      start + (landed - start) / work.layers + work.seconds)
        else:
            end = landed + work.seconds
        if end > env.now:
            yield from self._sleep(end - env.now)
        return GpuTimes(start, landed, env.now)

    def _do_release(self, e: pipeline.ReleaseLock) -> None:
        self.lock.release(e.thread)

    def _do_wait_copies(self, e: pipeline.WaitCopies):
        env = self.env
        all_done = env.all_of(e.handles)
        all_done.callbacks.append(lambda _e, r=e.record: setattr(r, "copies_done", env.now))
        if e.block:
            if self.cpu.holds_gil:  # a stream synchronize blocks without the GIL
                self.gil.release_fully(e.thread)
            yield all_done

    def _do_leave(self, e: pipeline.LeaveBinding):
        if not e.abandoned:
            yield from self._python(e.thread, self._binding_python_s(e.thread), e.api)
        self._left(e)

    def _left(self, e: pipeline.LeaveBinding) -> None:
        self._cold.pop(e.thread, None)
        if e.abandoned or not self.cpu.holds_gil:
            self.gil.release_fully(e.thread)

    def _do_sleep(self, e: pipeline.SleepFor):
        self.gil.release_fully(e.thread)  # sleeping threads do not hold the GIL
        seconds = e.seconds + self._overshoot()
        yield from self._sleep(seconds)
        self._woke(e.thread, seconds)
        if self.cpu.sleep_retakes_gil:  # time.sleep returns holding the GIL
            yield from self._take_gil(e.thread, "time.sleep")

    def _do_sleep_until(self, e: pipeline.SleepUntil):
        self.gil.release_fully(e.thread)
        if e.time > self.env.now:
            slept = e.time - self.env.now + self._overshoot()
            yield from self._sleep(slept)
            self._woke(e.thread, slept)
        if self.cpu.sleep_retakes_gil:
            yield from self._take_gil(e.thread, "time.sleep")

    def _woke(self, thread: str, slept: float) -> None:
        """Note a sleep's end for the CPU preset's after-sleep terms (none: nothing noted)."""
        if self.cpu.after_sleep_us:
            self._slept[thread] = slept
        if self.cpu.after_sleep_factor:
            self._cold[thread] = self.cpu.after_sleep_stretch(slept)

    def _overshoot(self) -> float:
        """A sleep's extra seconds (CPU preset's sleep_overshoot_us; 0 without it)."""
        table = self.cpu.sleep_overshoot_us
        return self._draw(table, 7) * 1e-6 if table else 0.0

    def _draw(self, table: tuple[tuple[float, float], ...], stream: int) -> float:
        """A value of a ((prob, value), ...) table at a uniform draw from the generator seeded
        ``[gil_seed, stream]`` (one per table, so one table's draws never shift another's)."""
        rng = self._table_rngs.get(stream)
        if rng is None:
            rng = self._table_rngs[stream] = np.random.default_rng([self.options.gil_seed, stream])
        return float(np.interp(rng.random(), *zip(*table)))

    def _stretched(self, thread: str, seconds: float) -> float:
        """``seconds`` of ``thread``'s host work as it runs: stretched until the end of its call
        after a sleep (CPU preset's after_sleep_factor)."""
        return seconds * self._cold[thread] if self._cold and thread in self._cold else seconds

    def _python(self, thread: str, seconds: float, api: str):
        """Run ``seconds`` of Python on ``thread``: it needs the GIL, and it gives the GIL up
        mid-way when a waiter's switch interval asks for it (then queues to get it back). A
        thread woken from a sleep runs its next call's host time stretched (after_sleep_factor).
        Returns the seconds it ran (stretched; without the GIL waits)."""
        seconds = self._stretched(thread, seconds)
        if not self.cpu.holds_gil:  # C++ manager: short Python edges, no forced switch to model
            yield from self._take_gil(thread, api)
            if seconds > 0.0:
                yield from self._wait(seconds)
            return seconds
        remaining = seconds
        while True:
            yield from self._take_gil(thread, api)
            if remaining <= 0.0:
                return seconds
            start = self.env.now
            chunk = self._jittered(remaining)
            # A drop request already made ends the wait at once: no shortcut then. Otherwise
            # nothing can make one before the next queued event (2 events: the timeout and the
            # condition).
            if self.gil.drop_requested.triggered or not self.env.fast_forward(chunk, events=2):
                yield self.env.timeout(chunk) | self.gil.drop_requested
            remaining -= self.env.now - start
            if remaining <= 1e-12:
                return seconds
            self.gil.forced_switches += 1
            self.gil.release_fully(thread)

    def _take_gil(self, thread: str, api: str):
        if self._gil_at_once(thread):
            return
        self._waiting[thread] = ("gil", api)
        request = self.gil.acquire(thread)
        if not request.triggered:
            self._check_deadlock(thread)
        if not self.env.process_now(request):
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
        what, api = self._waiting.get(thread, ("?", self.log.current_api.get(thread, "")))
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
        cycle = self._cycle_through(start, [], set())
        if cycle:
            self.deadlocks.append(Deadlock(self.env.now, [self._describe(t) for t in cycle]))
            if not self._stop.triggered:
                self._stop.succeed()

    def _cycle_through(self, t: str, path: list[str], on_path: set[str]) -> list[str] | None:
        """The first cycle of waits found from ``t``, with ``path`` the waits that led to it.
        (A method, not a nested function: a nested function that calls itself is a reference
        cycle, garbage the collector would have to find, and runs go without collections:
        :mod:`kvsim.sim.collector`.)"""
        if t in on_path:
            return path[path.index(t):]
        if t not in self._waiting:
            return None
        path.append(t)
        on_path.add(t)
        for nxt in self._waits_on(t):
            cycle = self._cycle_through(nxt, path, on_path)
            if cycle:
                return cycle
        path.pop()
        on_path.discard(t)
        return None

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
        yield from self._drive(pipeline.thread_steps(self.log, name, steps))
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

    def run(self, threads: Mapping[str, Iterator[Step]], until: float | None = None) -> RunResult:
        if self.cpu.holds_gil and self.cpu.thread_start_us > 0:
            self._alive.add(MAIN_THREAD)
            self.env.process(self._starter(threads))
        else:
            for name in sorted(threads):
                self.env.process(self._thread(name, threads[name]))
        stop = self._stop if until is None else self.env.any_of([self._stop, self.env.timeout(until)])
        try:
            with no_collections():
                self.env.run(until=stop)
        except RuntimeError as e:  # no event left before the stop event: a normal end
            if "No scheduled events left" not in str(e):
                raise
        # Threads still alive with no event left (or after a deadlock stopped the run) can never
        # continue: report them. With a time limit that was reached they were merely cut off.
        ended = self.env.peek() == float("inf") or self._stop.triggered
        stuck = self._stuck() if ended else []
        return RunResult(self.log.calls, self.stream.records, self.link.stats, self.lock.policy,
                         self.lock.log, self.lock.hazards,
                         GilStats(self.gil.acquisitions, self.gil.wait_s,
                                  self.gil.holds_until(self.env.now)), stuck, self.deadlocks,
                         self.log.violations, self.env.now, self.env.events_processed,
                         self.thread_starts)

    def _stuck(self) -> list[StuckThread]:
        return [self._describe(t) for t in sorted(self._alive) if t in self._waiting]


__all__ = ["SimExecutor", "SimOptions"]
