"""The executor's SimPy environment: it counts events, and skips the queue where nothing can differ.

Most of a timed replay's events are a thread's own short delays (a binding's Python, a plan's
CPU time) and grants that succeed at once (a free GIL, an uncontended lock). Each costs a trip
through the event queue and back up the thread's nested generators, for nothing: no other event
is due before it. Two shortcuts give the same run without those trips:

* :meth:`CountingEnvironment.fast_forward`: a delay that would end before the next queued event
  (strictly: an event due at the same instant was queued earlier, so it would run first) moves
  the clock there directly. The clock gets ``now + delay``, the float a ``Timeout`` would give.
* :meth:`CountingEnvironment.process_now`: an event already triggered, that nothing else waits
  on and that is first in the queue, is taken off it on the spot (the next step would have
  processed it and resumed the thread); :meth:`CountingEnvironment.succeed_now` tells the same
  of an event not yet made, so that a grant due at once needs none.

Nothing else runs in between either way, and the events left in the queue keep their order (an
event id skipped shifts no pair). Only the sole callback of the event being processed may take a shortcut:
a later callback of the same event would otherwise run at the moved clock, or after the thread
that should have waited for it. Each shortcut counts the events it stands for in
:attr:`CountingEnvironment.events_processed`, so that figure, which results report, does not
depend on them. Both rely on SimPy 4's queue layout (``_queue`` entries ``(time, priority, id,
event)``, the clock in ``_now``); ``tests/test_fast_forward.py`` checks runs with and without
them give the same results.
"""

from __future__ import annotations

from heapq import heappop

import simpy


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it processes (for events-per-second)."""

    shortcuts = True  # class-wide switch, for the tests that compare runs without them

    def __init__(self) -> None:
        super().__init__()
        self.events_processed = 0
        self._sole = False  # the event being processed has one callback

    def step(self) -> None:
        self.events_processed += 1
        queue = self._queue
        if queue:
            callbacks = queue[0][3].callbacks
            self._sole = callbacks is not None and len(callbacks) == 1
        super().step()

    def fast_forward(self, delay: float, events: int = 1) -> bool:
        """Advance the clock by ``delay`` (>= 0) if no queued event is due by then; whether it
        did. ``events``: how many events the skipped wait stands for (a timeout, or a timeout
        and the condition it ends)."""
        if not (self.shortcuts and self._sole):
            return False
        end = self._now + delay
        queue = self._queue
        if queue and queue[0][0] <= end:
            return False
        self._now = end
        self.events_processed += events
        return True

    def succeed_now(self) -> bool:
        """Whether an event made to succeed now would be first in the queue and taken off it at
        once by :meth:`process_now`; if so it counts as processed, and the caller does without
        it (a free GIL granted on the spot)."""
        queue = self._queue
        if not (self.shortcuts and self._sole) or (queue and queue[0][0] <= self._now):
            return False
        self.events_processed += 1
        return True

    def process_now(self, event: simpy.Event) -> bool:
        """Process ``event`` now if it succeeded, nothing waits on it and it is next in the
        queue; whether it did (otherwise yield it as usual)."""
        queue = self._queue
        if not (self.shortcuts and self._sole and queue and queue[0][3] is event and event._ok
                and not event.callbacks):
            return False
        heappop(queue)
        event.callbacks = None  # processed
        self.events_processed += 1
        return True
