"""The GIL as a SimPy resource: one holder, FIFO waiters, reentrant for its holder.

Python client threads hold the GIL while they run Python. A binding that may block on the manager
lock either releases the GIL first (the fixed KVCM2 bindings) or blocks holding it (the bug the
seed fixed). The manager re-acquires the GIL under the lock to call the priority callback and the
event sink.
"""

from __future__ import annotations

from collections import deque

import simpy


class Gil:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.owner: str | None = None
        self.depth = 0
        self._waiting: deque[tuple[str, simpy.Event]] = deque()
        self.acquisitions = 0
        self.wait_s: dict[str, float] = {}

    def waiting_threads(self) -> list[str]:
        return [t for t, _ in self._waiting]

    def holds(self, thread: str) -> bool:
        return self.owner == thread

    def acquire(self, thread: str) -> simpy.Event:
        event = self.env.event()
        if self.owner == thread:
            self.depth += 1
            return event.succeed()
        if self.owner is None:
            self.owner, self.depth = thread, 1
            self.acquisitions += 1
            return event.succeed()
        start = self.env.now
        event.callbacks.append(
            lambda _e: self.wait_s.__setitem__(thread, self.wait_s.get(thread, 0.0) + self.env.now - start))
        self._waiting.append((thread, event))
        return event

    def release(self, thread: str) -> None:
        if self.owner != thread:
            raise RuntimeError(f"{thread} releases the GIL held by {self.owner}")
        self.depth -= 1
        if self.depth:
            return
        self.owner = None
        if self._waiting:
            nxt, event = self._waiting.popleft()
            self.owner, self.depth = nxt, 1
            self.acquisitions += 1
            event.succeed()

    def release_fully(self, thread: str) -> int:
        """Drop every level of a nested hold (a binding's GIL release); returns the depth."""
        depth = self.depth if self.owner == thread else 0
        for _ in range(depth):
            self.release(thread)
        return depth
