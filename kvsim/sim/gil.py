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
usually loses that race, and starts a fresh interval, so the drop request may never come. What
decides hand-overs then is how often a woken waiter wins the race, which is the machine's, not
the interpreter's. The measured form (``takeover_per_s`` > 0, from ``kvsim calibrate``): each
waiter takes the GIL from a holder running Python at that rate, independently (exponential
waits), and a holder that blocks hands the GIL to a waiter picked at random. Measured waits are
far more spread than exponential ones (on the H200 host: median ~10 ms, a tenth over ~150 ms), so
where the calibration gives their distribution (``takeover_delay``: quantiles), each waiter's
delay is drawn from it instead. With neither, the switch-interval rule above applies.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy


class Gil:
    """``takeover_per_s`` > 0 selects the measured hand-over; ``starter`` names the thread that
    starts the others, which takes the GIL over at its own rate ``starter_takeover_per_s``
    (measured apart: it waits in a different place, see :mod:`kvsim.calibration.gil_handover`).
    ``seed`` makes the random draws repeatable."""

    def __init__(self, env: simpy.Environment, switch_interval_s: float = 0.005,
                 takeover_per_s: float = 0.0, seed: int = 0, starter: str | None = None,
                 starter_takeover_per_s: float = 0.0,
                 takeover_delay: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> None:
        """``takeover_delay``: (probabilities, delays in seconds), increasing, from 0 to 1."""
        self.env = env
        self.switch_interval_s = switch_interval_s
        self.takeover_delay = takeover_delay
        if takeover_delay is not None and takeover_per_s <= 0:  # the rate: one over the mean
            probs, delays = (np.asarray(v, dtype=float) for v in takeover_delay)
            mean = float(np.sum(np.diff(probs) * (delays[1:] + delays[:-1]) / 2))
            takeover_per_s = 1.0 / max(mean, 1e-12)
        self.takeover_per_s = takeover_per_s
        self.starter = starter
        self.starter_takeover_per_s = starter_takeover_per_s or takeover_per_s
        self._rng = np.random.default_rng(seed) if takeover_per_s > 0 else None
        self._taker: str | None = None  # the waiter a takeover hands the GIL to
        self.takeovers = 0
        self.owner: str | None = None
        self.depth = 0
        self._waiting: deque[tuple[str, simpy.Event]] = deque()
        self.acquisitions = 0
        self.forced_switches = 0
        self.wait_s: dict[str, float] = {}
        self.drop_requested = env.event()  # succeeds when a waiter asks the holder to drop

    def waiting_threads(self) -> list[str]:
        return [t for t, _ in self._waiting]

    def holds(self, thread: str) -> bool:
        return self.owner == thread

    def _grant(self, thread: str) -> None:
        self.owner, self.depth = thread, 1
        self.acquisitions += 1
        self.drop_requested = self.env.event()

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
        if self._rng is not None:
            self._arm_takeover(thread, event)
        else:
            self._arm_timer(event, self.acquisitions)
        return event

    def _arm_takeover(self, thread: str, waiter: simpy.Event) -> None:
        if thread == self.starter:
            delay = self._rng.exponential(1.0 / self.starter_takeover_per_s)
        elif self.takeover_delay is not None:
            delay = float(np.interp(self._rng.random(), *self.takeover_delay))
        else:
            delay = self._rng.exponential(1.0 / self.takeover_per_s)
        timer = self.env.timeout(delay)

        def fire(_e: simpy.Event) -> None:
            if waiter.triggered:
                return
            if self.owner is not None and not self.drop_requested.triggered:
                self._taker = thread
                self.takeovers += 1
                self.drop_requested.succeed()
            else:  # free (a hand-over is under way) or already asked: the race starts again
                self._arm_takeover(thread, waiter)

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

    def release_fully(self, thread: str) -> int:
        """Drop every level of a nested hold (a binding's GIL release); returns the depth."""
        depth = self.depth if self.owner == thread else 0
        for _ in range(depth):
            self.release(thread)
        return depth
