"""What a workload thread does: API calls, sleeps, and waits for an absolute time.

A workload is ``Workload(setup, threads)``: ``setup`` calls run on the manager before any clock
starts (building the state under study), then each thread's steps run concurrently under an
executor. Steps are generated lazily: a call is invoked before the next step is produced, so a
thread may use what its earlier calls returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """One API call: the lock-table name of the API, its arguments for the record, and a thunk.

    ``tokens``, when set, are the call's token ids (what an op-trace recorder writes; ``args``
    only counts them, to keep results small)."""

    phase: str
    api: str
    args: dict
    invoke: Callable[[], object]
    tokens: object = None


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Until:
    """Wait until this absolute time (seconds since the threads started)."""

    time: float


Step = Call | Sleep | Until


@dataclass
class Workload:
    """``setup`` calls, then the timed threads that ``make_threads()`` builds (called after the
    setup ran, since threads may need what it made)."""

    setup: Iterable[Call]
    make_threads: Callable[[], dict[str, Iterator[Step]]]
