"""No garbage collections while a simulated run allocates.

A timed replay creates millions of small container objects that stay alive (radix-tree nodes,
call and copy records, SimPy events in flight), and a run makes no reference cycles that die
while it runs (``tests/test_collector.py`` checks five shipped scenarios; on 2026-12-07 all 41
simulated runs of the shipped scenario files, and the first 600 requests of the timed replay,
were checked). Every
collection during a run therefore walks live objects and finds nothing: with CPython's default
thresholds (700, 10, 10), 2.1 s of a 20.2 s timed replay of the Mooncake synthetic trace
(``python -m kvsim.bench.replay --timed-only``) and 8.7 s of a 37.1 s run of
``scenarios/serving/llama3_8b_mooncake.yaml`` (2026-12-06); with thresholds raised to
(50,000, 20, 100), still 0.88 s of the timed replay (64 young and 4 middle collections,
measured with ``gc.callbacks`` on 2026-12-07).

:func:`no_collections` turns the collector off for the duration of a run and back on after.
Reference counting still frees everything that is not in a cycle at once. Results must not
depend on when the collector runs (an open cache that nothing references is closed by
reference counting, ``KvCache.__del__``, not by the collector); every shipped scenario's results
are byte-identical with and without (``tools/check_results_unchanged.py``). A workload's own
code (a priority callback, an event sink) that makes reference cycles keeps them until the run
ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# What the next run collects first (see no_collections): the young generations, or everything
# (the last run's leftovers went to the oldest generation unwalked); and how many tracked
# objects were alive before the first run, or after the last full collection made here.
_collect_first: int | None = None
_alive_after: int | None = None


def _tracked() -> int:
    """How many objects the collector tracks, by a walk of its lists: about 10x cheaper than a
    collection, which traverses each object (1 ms for 41,000 objects, 2026-12-07). Only with
    nothing frozen: it freezes and unfreezes, which leaves every object in the oldest
    generation."""
    gc.freeze()
    count = gc.get_freeze_count()
    gc.unfreeze()
    return count


@contextmanager
def no_collections() -> Iterator[None]:
    """Run the body with the collector off; it comes back on after (nested, or with the
    collector already off, the body just runs).

    When nothing is frozen (a command-line run; the tests freeze what they collected), a run
    that left more objects than were alive before the first run (or after the last full
    collection made here) moves them to the oldest generation on the way out, without a
    collection walking them: ``gc.freeze()`` then ``gc.unfreeze()``, two list splices.
    Otherwise the young collections after the run would walk everything it made (0.35 s at the
    end of a 16 s timed replay). A run's manager and radix tree are reference cycles, garbage
    once the run is over, that only a collection frees: the next run starts with a full one
    after such a run, and with one of the young generations (which walks only them) after a
    smaller run, whose leftovers stay there. So a process that runs many (a sweep's worker, a
    scenario's variants) does not keep each run's garbage: the next run frees it (or, where the
    caller's own allocations meanwhile moved it to the oldest generation, Python's own full
    collections do). A full collection before every run cost a run of a small scenario as much
    as the run (10 ms, ``scenarios/seed/h100_pcie_burst_resize.yaml``, 2026-12-07): it walks
    every object alive."""
    global _collect_first, _alive_after
    if not gc.isenabled():
        yield
        return
    ours = gc.get_freeze_count() == 0  # the generations are ours to manage
    if ours:
        if _collect_first is not None:
            gc.collect(_collect_first)
            if _collect_first == 2:
                _alive_after = None
            _collect_first = None
        if _alive_after is None:
            _alive_after = _tracked()
    gc.disable()
    try:
        yield
    finally:
        if ours and gc.get_freeze_count() == 0:
            left = gc.get_count()[0]  # net tracked objects made since the last collection
            if left > _alive_after:
                gc.freeze()
                gc.unfreeze()
                _collect_first = 2
            else:
                _collect_first = 1
        gc.enable()


def leave_to_exit() -> None:
    """For a process about to exit: freeze every object alive, so that the interpreter's
    shutdown collection walks none of them (the operating system takes the memory back).
    Measured at the end of a timed replay of the Mooncake synthetic trace: the process took
    1.8 s to exit, 0.08 s after this (2026-12-07). Only at the very end: frozen objects are
    never collected, and ``atexit`` handlers still run."""
    gc.freeze()
