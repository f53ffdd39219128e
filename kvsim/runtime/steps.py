"""What a workload thread does: API calls, sleeps, and waits for an absolute time.

A workload is ``Workload(setup, threads)``: ``setup`` calls run on the manager before any clock
starts (building the state under study), then each thread's steps run concurrently under an
executor. Steps are generated lazily: a call is invoked before the next step is produced, so a
thread may use what its earlier calls returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kvsim.errors import OutOfPagesError
from kvsim.manager import KvCache, Outcome, Plan, PlannedDrop
from kvsim.runtime.apis import Api


@dataclass(frozen=True, slots=True)
class Call:
    """One API call: which API (its lock mode comes with it), its arguments for the record, and
    the invocation, which returns the call's :class:`~kvsim.manager.Outcome` (value and plan).

    ``tokens``, when set, are the call's token ids (what an op-trace recorder writes; ``args``
    only counts them, to keep results small)."""

    phase: str
    api: Api
    args: dict
    invoke: Callable[[], Outcome]
    tokens: object = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Until:
    """Wait until this absolute time (seconds since the threads started)."""

    time: float


@dataclass(frozen=True, slots=True)
class Now:
    """Read the executor's clock: ``t = yield Now()`` gives the seconds since the threads
    started (a scheduler deciding what has arrived)."""


@dataclass(frozen=True, slots=True)
class GpuWork:
    """A forward pass on the GPU's compute stream, which needs the copies this thread has
    submitted since its last ``GpuWork`` (an engine waits on its onboarding before the pass).

    ``seconds`` is the pass's modelled GPU time. ``layers`` 0: the pass starts when the copies
    have landed. ``layers`` L > 0: it overlaps them layer by layer (layer i runs once its 1/L
    of the copies has landed), ending at ``max(landed + seconds / L, start + (landed - start)
    / L + seconds)``. ``prefills`` (``(new, cached)`` per sequence) and ``decode`` (the context
    of each sequence of the decode step) describe the pass, for a hardware executor that runs
    it for real (after the copies, without overlap). The step's value (``times = yield
    GpuWork(...)``) is a :class:`GpuTimes`."""

    seconds: float
    layers: int = 0
    prefills: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuTimes:
    """When a :class:`GpuWork` started (asked), when its copies had landed, when it ended."""

    start: float
    copies_landed: float
    end: float


Step = Call | Sleep | Until | Now | GpuWork


@dataclass
class Workload:
    """``setup`` calls, then the timed threads that ``make_threads()`` builds (called after the
    setup ran, since threads may need what it made). ``holds``: what the workload keeps alive
    while it runs, such as the handle of a request that stays open after its thread is done
    (a cache whose last reference goes is closed, as KVCM2's destructor does). ``summary``, if
    given, returns the workload's own figures after the run (results' ``workload_summary``)."""

    setup: Iterable[Call]
    make_threads: Callable[[], dict[str, Iterator[Step]]]
    holds: tuple = ()
    summary: Callable[[], dict] | None = None


def set_capacity(cache: KvCache, capacity: int) -> Outcome:
    """``cache.capacity = capacity``: the resize (its plan), with no value, as a property set
    has none; a refused resize is the setter's error, as KVCM2's property raises."""
    outcome = cache.resize.with_plan(capacity)._replace(value=None)
    if outcome.error is None and not outcome.plan.ok:
        error = OutOfPagesError(f"cache {cache.cache_id!r}: out of pages growing to {capacity} "
                                "tokens")
        return outcome._replace(error=error)
    return outcome


def drop_last_reference(handle: KvCache | PlannedDrop | None) -> Outcome:
    """What CPython runs when the last reference to a cache or a drop handle goes: the cache
    closes, an unapplied drop plan is applied (its destructor; nothing for ``None``). A
    destructor returns nothing."""
    if isinstance(handle, KvCache):
        outcome = handle.close.with_plan()
    elif isinstance(handle, PlannedDrop) and not handle.dropped:
        outcome = handle.drop.with_plan()
    else:
        outcome = Outcome(None, Plan("PlannedDrop.drop"))
    return outcome._replace(value=None)
