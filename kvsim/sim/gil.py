"""The GIL as a SimPy resource: one holder, FIFO waiters, reentrant for its holder.

Python client threads hold the GIL while they run Python. A binding that may block on the manager
lock either releases the GIL first (the fixed KVCM2 bindings) or blocks holding it (the bug the
seed fixed). The manager re-acquires the GIL under the lock to call the priority callback and the
event sink.

Switching follows CPython: a holder keeps the GIL until it blocks or is asked to drop it. A
waiter that has waited ``switch_interval_s`` (``sys.getswitchinterval()``, 5 ms by default)
without the GIL changing hands sets a drop request (:attr:`drop_requested`), which a holder
running Python honours at once (see ``SimExecutor._python``); the GIL then goes to the first
waiter and the holder queues behind it.
"""

from __future__ import annotations

from collections import deque

import simpy


class Gil:
    def __init__(self, env: simpy.Environment, switch_interval_s: float = 0.005) -> None:
        self.env = env
        self.switch_interval_s = switch_interval_s
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
        self._arm_timer(event, self.acquisitions)
        return event

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
            nxt, event = self._waiting.popleft()
            self._grant(nxt)
            event.succeed()

    def release_fully(self, thread: str) -> int:
        """Drop every level of a nested hold (a binding's GIL release); returns the depth."""
        depth = self.depth if self.owner == thread else 0
        for _ in range(depth):
            self.release(thread)
        return depth
