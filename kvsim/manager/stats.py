"""Iteration and cumulative statistics, per life cycle.

Counters accumulate in a pending delta and are *committed* into the iteration statistics. Every
commit re-samples the peak block statistics with a scan over all (level, pool group) cells, as
KVCM2 does. Recording a migration batch commits once (``per_batch``, the seed's fix) or once per
page (``per_page``, the behaviour before it); the counters end up identical, only the number of
commits and scans differs, and the plan counts both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.manager.plan import WorkCounts

COUNTERS = (
    "alloc_total_blocks",
    "alloc_new_blocks",
    "reused_blocks",
    "partial_reused_blocks",
    "missed_blocks",
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
PEAKS = ("peak_available_blocks", "peak_unavailable_blocks", "peak_evictable_blocks")

# kind of migration -> (blocks counter, bytes counter)
MIGRATION_COUNTERS = {
    "offload": ("offload_blocks", "offload_bytes"),
    "onboard": ("onboard_blocks", "onboard_bytes"),
    "intra": ("intra_copy_blocks", "intra_copy_bytes"),
    "drop": ("host_dropped_blocks", "host_dropped_bytes"),
}

# (level, pool group) -> (available, unavailable, evictable) block counts, shape (L, G, 3)
Sampler = Callable[[], np.ndarray]


class Statistics:
    def __init__(self, num_life_cycles: int, page_bytes_per_lc: np.ndarray, enabled: bool,
                 per_page: bool, sampler: Sampler) -> None:
        self.enabled = enabled
        self.per_page = per_page
        self._page_bytes = page_bytes_per_lc.astype(np.int64)
        self._n = num_life_cycles
        self._sampler = sampler
        self.iteration = {c: np.zeros(num_life_cycles, dtype=np.int64) for c in COUNTERS}
        self.cumulative = {c: np.zeros(num_life_cycles, dtype=np.int64) for c in CUMULATIVE}
        self.peaks: np.ndarray | None = None  # (L, G, 3) max over samples this iteration

    def _commit(self, delta: dict[str, np.ndarray], counts: WorkCounts,
                sample: np.ndarray | None = None) -> None:
        for name, values in delta.items():
            self.iteration[name] += values
            if name in self.cumulative:
                self.cumulative[name] += values
        if sample is None:
            sample = self._sampler()
        counts.stats_commits += 1
        counts.stats_scan_units += sample.shape[0] * sample.shape[1]
        self.peaks = sample if self.peaks is None else np.maximum(self.peaks, sample)

    def record(self, counts: WorkCounts, **per_lc: np.ndarray) -> None:
        """Commit one delta of counters (each an array over life cycles)."""
        if self.enabled:
            self._commit(per_lc, counts)

    def record_migration(self, kind: str, life_cycles: np.ndarray, counts: WorkCounts) -> None:
        """Record pages (given by their life cycles) moved, copied or dropped as one batch."""
        if not self.enabled or life_cycles.size == 0:
            return
        blocks_name, bytes_name = MIGRATION_COUNTERS[kind]
        counts.stats_page_records += life_cycles.size
        if self.per_page:
            # Storage does not change inside one batch, so every per-page re-sample would read
            # the same cells (the seed's own argument for its fix): sample once and reuse it.
            # The plan still counts one commit and one full scan per page, as KVCM2 did.
            sample = self._sampler()
            unit = np.eye(self._n, dtype=np.int64)
            unit_bytes = unit * self._page_bytes
            for lc in life_cycles.tolist():
                self._commit({blocks_name: unit[lc], bytes_name: unit_bytes[lc]}, counts, sample)
            return
        blocks = np.bincount(life_cycles, minlength=self._n).astype(np.int64)
        self._commit({blocks_name: blocks, bytes_name: blocks * self._page_bytes}, counts)

    def take_iteration(self, level_names: tuple[str, ...]) -> dict:
        """The iteration statistics as plain data; resets them."""
        out: dict = {
            "life_cycles": [
                {c: int(self.iteration[c][lc]) for c in COUNTERS} for lc in range(self._n)
            ],
        }
        peaks = self.peaks if self.peaks is not None else self._sampler()
        out["levels"] = [
            [dict(zip(PEAKS, (int(v) for v in peaks[lv, g]))) for g in range(peaks.shape[1])]
            for lv in range(len(level_names))
        ]
        for arr in self.iteration.values():
            arr[:] = 0
        self.peaks = None
        return out

    def committed(self) -> dict:
        return {
            "life_cycles": [
                {c: int(self.cumulative[c][lc]) for c in CUMULATIVE} for lc in range(self._n)
            ]
        }
