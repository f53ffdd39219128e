"""The seed's burst-resize workload (seed PR #18541), as a manager configuration.

A 200K-token disaggregated decode-side request arrives: ``resize(capacity=200_001,
history_length=200_000)`` on an empty ACTIVE cache, 32 tokens per block, one full-attention and
one sliding-window life cycle (window 4096 tokens, no sinks) sharing one pool group of 16 KiB
pages (K and V slots of 8 KiB each). The sliding window keeps 129 pages
(``ceil(200001 / 32) - (200001 - 4096) // 32``) and full attention 6251, so the call needs
6380 pages. Before it, four earlier requests filled the GPU tier with committed, closed (so
droppable and evictable) pages; every one of the 6380 pages therefore evicts one page from the
GPU to the host: 6380 pages, 104,529,920 bytes (99.69 MiB).

``scenarios/seed/burst_resize.yaml`` states the same workload as a scenario file.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.manager import KvCache, KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.workloads.burst_resize import BurstResizeWorkload, calls

PAGE_SLOT_BYTES = (8192, 8192)  # K and V of one block: a 16 KiB page


@dataclass(frozen=True)
class SeedWorkload:
    gpu_pages: int = 8192
    host_pages: int = 65536
    fill_gpu: bool = True
    stats_commit: str = "per_batch"
    enable_stats: bool = True

    def config(self) -> ManagerConfig:
        page_bytes = sum(PAGE_SLOT_BYTES)
        return ManagerConfig(
            layers=(
                LayerConfig(slot_bytes=PAGE_SLOT_BYTES),
                LayerConfig(slot_bytes=PAGE_SLOT_BYTES, window_tokens=4096),
            ),
            levels=(
                LevelConfig("gpu", self.gpu_pages * page_bytes),
                LevelConfig("host", self.host_pages * page_bytes),
            ),
            tokens_per_block=32,
            enable_stats=self.enable_stats,
            stats_commit=self.stats_commit,  # type: ignore[arg-type]
        )

    def workload(self) -> BurstResizeWorkload:
        return BurstResizeWorkload(history_tokens=200_000, capacity_tokens=200_001,
                                   gpu_fill_fraction=1.0 if self.fill_gpu else 0.0)

    def build(self, seed: int = 0) -> tuple[KVCacheManager, KvCache, list]:
        """Run the setup calls; returns the manager, the request and the growth calls to time."""
        config = self.config()
        mgr = KVCacheManager(config)
        growth = []
        for call in calls(config, self.workload(), mgr, seed):
            if call.phase == "growth":
                growth.append(call)
            else:
                outcome = call.invoke()
                if not outcome.ok:
                    raise RuntimeError(f"seed workload setup failed at {call.api} {call.args}")
                if call.args.get("cache_id") == "request" and isinstance(outcome.value, KvCache):
                    request = outcome.value
        return mgr, request, growth
