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

# Whether the last run's leftovers went to the oldest generation without a collection (see
# no_collections): the next run collects them first.
_unwalked = False


@contextmanager
def no_collections() -> Iterator[None]:
    """Run the body with the collector off; it comes back on after (nested, or with the
    collector already off, the body just runs).

    When nothing is frozen (a command-line run; the tests freeze what they collected), what
    the run left in the young generations moves to the oldest one on the way out, without a
    collection walking it: ``gc.freeze()`` then ``gc.unfreeze()``, two list splices. Otherwise
    the first collection after the run would walk everything the run made (0.35 s at the end of
    a 16 s timed replay). A run's manager and radix tree are reference cycles, garbage once the
    run is over, that only a full collection frees: the next run in the same process starts
    with one, so a process that runs many (a sweep's worker, a scenario's variants) holds at
    most one finished run's garbage at a time."""
    global _unwalked
    if not gc.isenabled():
        yield
        return
    if _unwalked:
        _unwalked = False
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
            _unwalked = True
        gc.enable()


def leave_to_exit() -> None:
    """For a process about to exit: freeze every object alive, so that the interpreter's
    shutdown collection walks none of them (the operating system takes the memory back).
    Measured at the end of a timed replay of the Mooncake synthetic trace: the process took
    1.8 s to exit, 0.08 s after this (2026-12-07). Only at the very end: frozen objects are
    never collected, and ``atexit`` handlers still run."""
    gc.freeze()
