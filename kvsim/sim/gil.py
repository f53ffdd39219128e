"""The GIL as a SimPy resource: one holder, waiters, reentrant for its holder.

Python client threads hold the GIL while they run Python. A binding that may block on the manager
lock either releases the GIL first (the fixed KVCM2 bindings) or blocks holding it (the bug the
seed fixed). The manager re-acquires the GIL under the lock to call the priority callback and the
event sink.

Switching follows CPython: a holder keeps the GIL until it blocks or is asked to drop it. A
waiter that has waited ``switch_interval_s`` (``sys.getswitchinterval()``, 5 ms by default)
without the GIL changing hands sets a drop request (:attr:`drop_requested`), which a holder
running Python honours at once (see ``SimExecutor._python``); the GIL then goes to the first
waiter and the holder queues behind it.

That is the interpreter's rule, and it is what happens when a holder never lets go on its own.
A holder that briefly releases the GIL (a numpy loop over more than 500 elements, a C call that
drops it) signals one waiter each time and takes the GIL straight back; the waiter it woke
usually loses that race and starts a fresh interval, so the drop request may never come. What
decides hand-overs then is how often a woken waiter wins a race, which is the machine's, not the
interpreter's: the measured form (:class:`Handover`, from ``kvsim calibrate``). There a holder
running Python while workers wait keeps the GIL for a time drawn from the measured hold
distribution, shortened by ``n ** -waiter_exponent`` with ``n`` workers waiting (measured on the
H200 host: negative, the more wait the longer a holder keeps it); then a waiter takes it over:
the one that started waiting last with probability ``recent_taker_share``, else one picked at
random. The thread that starts the others takes the GIL over at its own rate (it waits in a
different place, :mod:`kvsim.calibration.gil_handover`), for one worker waiting, times
``n ** waiter_exponent`` as well. A holder that blocks hands the GIL to a waiter
picked at random.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from kvsim.model.handover import Handover


class Gil:
    """``handover`` selects the measured hand-over, else CPython's switch-interval rule;
    ``starter`` names the thread that starts the others; ``seed`` makes the random draws
    repeatable."""

    def __init__(self, env: simpy.Environment, switch_interval_s: float = 0.005,
                 handover: Handover | None = None, seed: int = 0,
                 starter: str | None = None) -> None:
        self.env = env
        self.switch_interval_s = switch_interval_s
        self.handover = handover
        self.starter = starter
        self._rng = np.random.default_rng(seed) if handover is not None else None
        self._taker: str | None = None  # the waiter a takeover hands the GIL to
        self._hold_timed = -1  # the grant (acquisitions count) whose hold timer runs
        self.takeovers = 0
        self.owner: str | None = None
        self.depth = 0
        self._waiting: deque[tuple[str, simpy.Event]] = deque()
        self.acquisitions = 0
        self.forced_switches = 0
        self.wait_s: dict[str, float] = {}
        # (thread, granted, released) of every hold, for the trace export; a hold still on at
        # the end of the run is not in it (see :meth:`holds_until`)
        self.hold_log: list[tuple[str, float, float]] = []
        self._granted_at = 0.0
        self._drop: simpy.Event | None = None  # this hold's drop request, once someone looks

    @property
    def drop_requested(self) -> simpy.Event:
        """Succeeds when a waiter asks the holder to drop the GIL; one event per hold, made
        when first looked at (most holds end before anyone asks: a SimPy event per grant was
        about 1 % of a timed replay). Making it late changes nothing: SimPy orders events by
        when they are scheduled, not made."""
        if self._drop is None:
            self._drop = self.env.event()
        return self._drop

    def waiting_threads(self) -> list[str]:
        return [t for t, _ in self._waiting]

    def _workers_waiting(self) -> list[str]:
        return [t for t, _ in self._waiting if t != self.starter]

    def _grant(self, thread: str) -> None:
        self.owner, self.depth = thread, 1
        self._granted_at = self.env._now  # (SimPy's now, without its property: twice a call)
        self.acquisitions += 1
        self._drop = None  # a fresh request per hold
        if self.handover is not None and self._workers_waiting():
            self._arm_hold()

    def is_free(self) -> bool:
        """Nobody holds the GIL and nobody waits for it."""
        return self.owner is None and not self._waiting

    def take_if_free(self, thread: str) -> bool:
        """Grant the GIL to ``thread`` without an event, as :meth:`acquire` would at once, when
        it is free (:meth:`is_free`) and the environment would process the grant on the spot
        (``CountingEnvironment.succeed_now``); whether it did."""
        if self.owner is None and not self._waiting and self.env.succeed_now():
            self._grant(thread)
            return True
        return False

    def acquire(self, thread: str) -> simpy.Event:
        event = self.env.event()
        if self.owner == thread:
            self.depth += 1
            return event.succeed()
        if self.owner is None:
            self._grant(thread)
            return event.succeed()
        start = self.env.now
        event.callbacks.append(
            lambda _e: self.wait_s.__setitem__(thread, self.wait_s.get(thread, 0.0) + self.env.now - start))
        self._waiting.append((thread, event))
        if self.handover is None:
            self._arm_timer(event, self.acquisitions)
        elif thread == self.starter:
            self._arm_starter(event)
        elif self._hold_timed != self.acquisitions:
            self._arm_hold()
        return event

    def _arm_hold(self) -> None:
        """Time the current holder's hold: a draw from the measured table, for the workers
        waiting once this instant is over (a holder just taken over queues again at once)."""
        grant = self._hold_timed = self.acquisitions
        self.env.timeout(0).callbacks.append(lambda _e: self._time_hold(grant))

    def _time_hold(self, grant: int) -> None:
        if self.acquisitions != grant or self.owner is None:
            return  # handed over meanwhile
        h = self.handover
        n = max(len(self._workers_waiting()), 1)
        hold = float(np.interp(self._rng.random(), *h.hold)) * n ** -h.waiter_exponent
        timer = self.env.timeout(hold)

        def fire(_e: simpy.Event) -> None:
            if self.acquisitions != grant or self.owner is None or self.drop_requested.triggered:
                return  # handed over meanwhile, or already asked
            workers = self._workers_waiting()
            if not workers:
                self._hold_timed = -1  # the next worker to wait starts a fresh hold
                return
            if self._rng.random() < h.recent_taker_share:
                self._taker = workers[-1]
            else:
                self._taker = workers[int(self._rng.integers(len(workers)))]
            self.takeovers += 1
            self.drop_requested.succeed()

        timer.callbacks.append(fire)

    def _arm_starter(self, waiter: simpy.Event) -> None:
        h = self.handover
        rate = h.starter_takeover_per_s * max(len(self._workers_waiting()), 1) ** h.waiter_exponent
        if rate <= 0:
            return  # not measured: the starter gets the GIL when a holder blocks or finishes
        timer = self.env.timeout(self._rng.exponential(1.0 / rate))

        def fire(_e: simpy.Event) -> None:
            if waiter.triggered:
                return
            if self.owner is not None and not self.drop_requested.triggered:
                self._taker = self.starter
                self.takeovers += 1
                self.drop_requested.succeed()
            else:  # free (a hand-over is under way) or already asked: the race starts again
                self._arm_starter(waiter)

        timer.callbacks.append(fire)

    def _arm_timer(self, waiter: simpy.Event, switches_seen: int) -> None:
        timer = self.env.timeout(self.switch_interval_s)

        def fire(_e: simpy.Event) -> None:
            if waiter.triggered:
                return
            if self.acquisitions == switches_seen and not self.drop_requested.triggered:
                self.drop_requested.succeed()  # no switch for a whole interval: ask for one
            self._arm_timer(waiter, self.acquisitions)

        timer.callbacks.append(fire)

    def release(self, thread: str) -> None:
        if self.owner != thread:
            raise RuntimeError(f"{thread} releases the GIL held by {self.owner}")
        self.depth -= 1
        if self.depth:
            return
        self.owner = None
        self.hold_log.append((thread, self._granted_at, self.env._now))
        if self._waiting:
            nxt, event = self._waiting.popleft() if self._rng is None else self._pick_waiter()
            self._grant(nxt)
            event.succeed()

    def _pick_waiter(self) -> tuple[str, simpy.Event]:
        taker, self._taker = self._taker, None
        names = [t for t, _ in self._waiting]
        i = names.index(taker) if taker in names else int(self._rng.integers(len(names)))
        entry = self._waiting[i]
        del self._waiting[i]
        return entry

    def holds_until(self, end: float) -> list[tuple[str, float, float]]:
        """Every hold, the one still on (if any) ending at ``end``."""
        if self.owner is None:
            return list(self.hold_log)
        return [*self.hold_log, (self.owner, self._granted_at, end)]

    def release_fully(self, thread: str) -> int:
        """Drop every level of a nested hold (a binding's GIL release); returns the depth."""
        depth = self.depth if self.owner == thread else 0
        for _ in range(depth):
            self.release(thread)
        return depth
