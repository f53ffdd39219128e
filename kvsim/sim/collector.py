"""Fewer garbage collections while a simulated run allocates.

A timed replay creates millions of small container objects that stay alive (radix-tree nodes,
call and copy records, SimPy events in flight). CPython's default thresholds (700, 10, 10) then
make its cyclic collector re-traverse all of them again and again: measured on the 2-core
machine, 2.1 s of a 20.2 s timed replay of the Mooncake synthetic trace
(``python -m kvsim.bench.replay --timed-only``) and 8.7 s of a 37.1 s run of
``scenarios/serving/llama3_8b_mooncake.yaml`` went to collections, most of it full ones.

:func:`fewer_collections` raises the thresholds for the duration of a run and puts the old ones
back after. Reference counting still frees everything that is not in a cycle at once; cycles
(exceptions with their tracebacks, say) are still collected, only less often. Results must not
depend on when the collector runs (an open cache that nothing references is closed by
reference counting, ``KvCache.__del__``, not by the collector); every shipped scenario's results
are byte-identical with and without (``tools/check_results_unchanged.py``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# A young collection every 50,000 net allocations of containers instead of 700, a middle one
# every 20 of them, a full one every 100 middle ones (with these, 0 full collections in the two
# runs above, where the defaults made 14 and 34).
RUN_THRESHOLDS = (50_000, 20, 100)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the body with :data:`RUN_THRESHOLDS`; the previous thresholds come back after.

    When nothing is frozen (a command-line run; the tests freeze what they collected), what
    the run left in the young generations moves to the oldest one on the way out, without a
    collection walking it: ``gc.freeze()`` then ``gc.unfreeze()``, two list splices. Put back
    under the default thresholds, the run's tally of young collections would otherwise start
    a middle one over everything the run made (0.35 s at the end of a 16 s timed replay of the
    Mooncake synthetic trace, measured with ``gc.callbacks``). A cycle among those objects is
    still collected, by the next full collection."""
    old = gc.get_threshold()
    gc.set_threshold(*RUN_THRESHOLDS)
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.set_threshold(*old)
