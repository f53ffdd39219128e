"""Statistics per life cycle, kept the way KVCM2 keeps them.

What a cache's calls find or allocate travels two ways (KVCM2: ``_core/_kv_cache.py``,
``_core/_pending_stats.py``):

* **pending**, per cache (:class:`PendingStats`): the reuse found at ``create_kv_cache`` (full
  and partial blocks, and the level each came from), the blocks a ``resize`` allocates (missed
  while the cache is not yet generation-ready, generation allocations after), and the private
  copy of a partially reused block made at the first ``resume``. They reach the manager only when
  the cache publishes them (``KvCache.commit_pending_stats``); ``close()`` and
  ``discard_pending_stats()`` drop them, and shrinking a cache takes back the allocations of the
  removed blocks that are still pending.
* **direct**: the migrations a cache's own calls cause (onboarding to the GPU, offloading from it,
  intra-GPU copies, drops at the last level) are committed when they happen. Migrations that
  ``KVCacheManager.resize`` or ``prefetch`` cause, and host-to-disk moves, are not recorded.

Blocks are counted per attention life cycle. A block is *allocated* (``alloc_total`` =
``alloc_new``) when a resize creates it, when the partial block's private copy is made, and when
a page is onboarded to the GPU; reused blocks are never allocations. ``reused_blocks`` counts the
full and the partial reused block together.

Every commit adds its delta to the iteration and cumulative statistics and re-samples the peak
block statistics with a scan over all (level, pool group) cells, as KVCM2 does. Recording a
migration batch commits once (``per_batch``, the seed's fix) or once per page (``per_page``, the
behaviour before it); the counters end up identical, only the commits and scans differ.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.manager.plan import WorkCounts

COUNTERS = (
    "alloc_total_blocks",
    "alloc_new_blocks",
    "reused_blocks",  # full + partial
    "full_reused_blocks",
    "partial_reused_blocks",
    "missed_blocks",
    "gen_alloc_blocks",
    "onboard_blocks",
    "onboard_bytes",
    "offload_blocks",
    "offload_bytes",
    "intra_copy_blocks",
    "intra_copy_bytes",
    "host_dropped_blocks",
    "host_dropped_bytes",
)
CUMULATIVE = ("alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "missed_blocks")
PENDING = ("alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "full_reused_blocks",
           "partial_reused_blocks", "missed_blocks", "gen_alloc_blocks")
PEAKS = ("peak_available_blocks", "peak_unavailable_blocks", "peak_evictable_blocks")
BY_LEVEL = "reused_blocks_by_level"  # per life cycle: reused blocks found at each level

# kind of migration -> counters one page adds, and whether its bytes count
MIGRATION_COUNTERS = {
    "offload": ("offload_blocks", "offload_bytes"),
    "onboard": ("onboard_blocks", "onboard_bytes", "alloc_total_blocks", "alloc_new_blocks"),
    "intra": ("intra_copy_blocks", "intra_copy_bytes"),
    "drop": ("host_dropped_blocks", "host_dropped_bytes"),
}

# The counters are kept as rows of one (counters, life cycles) array, in COUNTERS' order: a
# delta is added, and a cache's pending statistics published, cleared or tested for zero, with
# one numpy operation instead of one per counter (each a few microseconds on these tiny arrays).
ROW = {name: i for i, name in enumerate(COUNTERS)}
PENDING_ROWS = np.array([ROW[c] for c in PENDING])
_CUMULATIVE_IN_PENDING = np.array([PENDING.index(c) for c in CUMULATIVE])
_FULL, _PARTIAL, _REUSED, _TOTAL, _NEW, _MISSED, _GEN = (
    PENDING.index(c) for c in ("full_reused_blocks", "partial_reused_blocks", "reused_blocks",
                               "alloc_total_blocks", "alloc_new_blocks", "missed_blocks",
                               "gen_alloc_blocks"))

# (level, pool group) -> (available, unavailable, evictable) block counts, shape (L, G, 3)
Sampler = Callable[[], np.ndarray]


class PendingStats:
    """One cache's statistics not yet published (see the module docstring)."""

    __slots__ = ("delta", "by_level", "segments")

    def __init__(self, num_life_cycles: int, num_levels: int) -> None:
        self.delta = np.zeros((len(PENDING), num_life_cycles), dtype=np.int64)  # rows: PENDING
        self.by_level = np.zeros((num_life_cycles, num_levels), dtype=np.int64)
        # Allocations still pending, as [life cycle, first block, end block, missed, generation],
        # so that a shrink can take back exactly those of the blocks it removes.
        self.segments: list[list] = []

    @property
    def empty(self) -> bool:
        return not self.by_level.any() and not self.delta.any()

    def record_reuse(self, full: np.ndarray, partial: np.ndarray, by_level: np.ndarray) -> None:
        d = self.delta
        d[_FULL] += full
        d[_PARTIAL] += partial
        d[_REUSED] += full + partial
        self.by_level += by_level

    def record_allocation(self, lc: int, begin: int, end: int, missed: bool,
                          generation: bool = False) -> None:
        n = end - begin
        if n <= 0:
            return
        d = self.delta
        d[_TOTAL, lc] += n
        d[_NEW, lc] += n
        if missed:
            d[_MISSED, lc] += n
        if generation:
            d[_GEN, lc] += n
        self.segments.append([lc, begin, end, missed, generation])

    def subtract_allocation(self, begin: int, end: int) -> None:
        """Take back the pending allocations of blocks ``[begin, end)``."""
        d = self.delta
        kept = []
        for lc, b, e, missed, generation in self.segments:
            n = min(e, end) - max(b, begin)
            if n > 0:
                d[_TOTAL, lc] -= n
                d[_NEW, lc] -= n
                if missed:
                    d[_MISSED, lc] -= n
                if generation:
                    d[_GEN, lc] -= n
                if b < begin:
                    kept.append([lc, b, begin, missed, generation])
                if e > end:
                    kept.append([lc, end, e, missed, generation])
            else:
                kept.append([lc, b, e, missed, generation])
        self.segments = kept

    def request(self) -> dict[str, int]:
        """The per-request delta KVCM2 hands back: summed over life cycles."""
        return dict(zip(CUMULATIVE, self.delta[_CUMULATIVE_IN_PENDING].sum(axis=1).tolist()))

    def clear(self) -> None:
        self.delta.fill(0)
        self.by_level.fill(0)
        self.segments = []


class Statistics:
    """The manager's iteration and cumulative statistics."""

    def __init__(self, num_life_cycles: int, num_levels: int, page_bytes_per_lc: np.ndarray,
                 enabled: bool, per_page: bool, sampler: Sampler) -> None:
        self.enabled = enabled
        self.per_page = per_page
        self._n = num_life_cycles
        self._levels = num_levels
        self._sampler = sampler
        # (counters, life cycles), rows in COUNTERS' order. A commit adds to the iteration's
        # figures only; what earlier iterations added is kept apart (_earlier), and the
        # cumulative figures are the sum of the two (one update per commit instead of two).
        self.iteration = np.zeros((len(COUNTERS), num_life_cycles), dtype=np.int64)
        self.iteration_by_level = np.zeros((num_life_cycles, num_levels), dtype=np.int64)
        self._earlier = np.zeros_like(self.iteration)
        self._earlier_by_level = np.zeros_like(self.iteration_by_level)
        self.peaks: np.ndarray | None = None  # (L, G, 3) max over samples this iteration
        # kind of migration -> (its counters' rows, what one block of each life cycle adds)
        page_bytes = page_bytes_per_lc.astype(np.int64)
        self._migrations = {
            kind: (np.array([ROW[name] for name in names]),
                   np.stack([page_bytes if name.endswith("_bytes")
                             else np.ones(num_life_cycles, dtype=np.int64) for name in names]))
            for kind, names in MIGRATION_COUNTERS.items()}

    @property
    def cumulative(self) -> np.ndarray:
        """Every counter since the manager was made (only CUMULATIVE's rows are reported)."""
        return self._earlier + self.iteration

    @property
    def cumulative_by_level(self) -> np.ndarray:
        return self._earlier_by_level + self.iteration_by_level

    def pending(self) -> PendingStats:
        return PendingStats(self._n, self._levels)

    def commit(self, rows: np.ndarray, values: np.ndarray, counts: WorkCounts,
               by_level: np.ndarray | None = None, sample: np.ndarray | None = None) -> None:
        """Add one delta (``values[i]`` to counter row ``rows[i]``, over life cycles; each row
        once) and re-sample the peaks."""
        self.iteration[rows] += values
        if by_level is not None:
            self.iteration_by_level += by_level
        if sample is None:
            sample = self._sampler()
        counts.stats_commits += 1
        counts.stats_scan_units += sample.shape[0] * sample.shape[1]
        self.peaks = sample if self.peaks is None else np.maximum(self.peaks, sample)

    def commit_pending(self, pending: PendingStats, counts: WorkCounts) -> dict[str, int]:
        """Publish a cache's pending statistics; returns its per-request delta."""
        request = pending.request()
        if self.enabled and not pending.empty:
            self.commit(PENDING_ROWS, pending.delta, counts, pending.by_level)
        pending.clear()
        return request

    def record_migration(self, kind: str, life_cycles: np.ndarray, counts: WorkCounts) -> None:
        """Record pages (given by their life cycles) moved, copied or dropped as one batch."""
        if not self.enabled or life_cycles.size == 0:
            return
        counts.stats_page_records += life_cycles.size
        if self.per_page:
            # Storage does not change inside one batch, so every per-page re-sample would read
            # the same cells (the seed's own argument for its fix): sample once and reuse it.
            # The plan still counts one commit and one full scan per page, as KVCM2 did.
            # Their deltas (one page each) add up to the batch's, and the peaks of one sample
            # taken n times are that sample's: one commit, counted as n.
            sample = self._sampler()
            rows, per_block = self._migrations[kind]
            self.commit(rows, per_block * self._per_life_cycle(life_cycles), counts,
                        sample=sample)
            more = life_cycles.size - 1
            counts.stats_commits += more
            counts.stats_scan_units += more * sample.shape[0] * sample.shape[1]
            return
        rows, per_block = self._migrations[kind]
        self.commit(rows, per_block * self._per_life_cycle(life_cycles), counts)

    def _per_life_cycle(self, life_cycles: np.ndarray) -> np.ndarray | int:
        """How many of the pages are of each life cycle (with one life cycle, all of them)."""
        return life_cycles.size if self._n == 1 else np.bincount(life_cycles, minlength=self._n)

    def take_iteration(self, level_names: tuple[str, ...]) -> dict:
        """The iteration statistics as plain data; resets them."""
        out: dict = {"life_cycles": self._rows(self.iteration, COUNTERS, self.iteration_by_level)}
        peaks = self.peaks if self.peaks is not None else self._sampler()
        out["levels"] = [
            [dict(zip(PEAKS, (int(v) for v in peaks[lv, g]))) for g in range(peaks.shape[1])]
            for lv in range(len(level_names))
        ]
        self._earlier += self.iteration
        self._earlier_by_level += self.iteration_by_level
        self.iteration.fill(0)
        self.iteration_by_level.fill(0)
        self.peaks = None
        return out

    def committed(self) -> dict:
        return {"life_cycles": self._rows(self.cumulative, CUMULATIVE, self.cumulative_by_level)}

    def _rows(self, counters: np.ndarray, names: tuple[str, ...],
              by_level: np.ndarray) -> list[dict]:
        return [{**{c: int(counters[ROW[c], lc]) for c in names},
                 BY_LEVEL: [int(v) for v in by_level[lc]]} for lc in range(self._n)]
