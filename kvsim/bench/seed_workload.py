"""The seed's burst-resize workload (DESIGN.md section 5), as a manager-level setup.

A 200K-token disaggregated decode-side request arrives: ``resize(capacity=200_001,
history_length=200_000)`` on an empty ACTIVE cache, 32 tokens per block, one full-attention and
one sliding-window life cycle (window 4096 tokens, no sinks) sharing one pool group of 16 KiB
pages (K and V slots of 8 KiB each). The sliding window keeps 129 pages
(``ceil(200001 / 32) - (200001 - 4096) // 32``) and full attention 6251, so the call needs
6380 pages. Before it, the GPU tier is filled with the committed, closed (so droppable and
evictable) pages of earlier requests; every one of the 6380 pages therefore evicts one page from
the GPU to the host: 6380 pages, 104,529,920 bytes (99.69 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.manager import KVCacheManager, KvCache, LayerConfig, LevelConfig, ManagerConfig

TOKENS_PER_BLOCK = 32
PAGE_SLOT_BYTES = (8192, 8192)  # K and V of one block: a 16 KiB page
WINDOW_TOKENS = 4096
REQUEST_HISTORY_TOKENS = 200_000
REQUEST_CAPACITY_TOKENS = 200_001  # room for the first decoded token
GPU_PAGES = 8192
HOST_PAGES = 65536
FILLER_REQUESTS = 4


@dataclass(frozen=True)
class SeedWorkload:
    gpu_pages: int = GPU_PAGES
    host_pages: int = HOST_PAGES
    filler_requests: int = FILLER_REQUESTS
    stats_commit: str = "per_batch"
    enable_stats: bool = True

    @property
    def page_bytes(self) -> int:
        return sum(PAGE_SLOT_BYTES)

    def config(self) -> ManagerConfig:
        return ManagerConfig(
            layers=(
                LayerConfig(slot_bytes=PAGE_SLOT_BYTES),
                LayerConfig(slot_bytes=PAGE_SLOT_BYTES, window_tokens=WINDOW_TOKENS),
            ),
            levels=(
                LevelConfig("gpu", self.gpu_pages * self.page_bytes),
                LevelConfig("host", self.host_pages * self.page_bytes),
            ),
            tokens_per_block=TOKENS_PER_BLOCK,
            enable_stats=self.enable_stats,
            stats_commit=self.stats_commit,  # type: ignore[arg-type]
        )

    def build(self, fill_gpu: bool = True) -> tuple[KVCacheManager, KvCache]:
        """A manager whose GPU tier is full of evictable pages, and the ACTIVE empty request.

        With ``fill_gpu`` False the GPU tier is left empty (the seed's no-eviction path).
        """
        mgr = KVCacheManager(self.config())
        if fill_gpu:
            # Each filler commits distinct tokens for both life cycles and closes; all of its
            # pages stay committed and droppable on the GPU.
            tokens_each = self.gpu_pages * TOKENS_PER_BLOCK // (2 * self.filler_requests)
            for i in range(self.filler_requests):
                filler = mgr.create_kv_cache()
                assert filler.resume()
                assert filler.resize(tokens_each)
                base = i * tokens_each
                filler.commit(np.arange(base, base + tokens_each, dtype=np.uint32))
                filler.close()
        request = mgr.create_kv_cache()
        if not request.resume():
            raise RuntimeError("the seed request could not resume")
        return mgr, request

    def burst_resize(self, request: KvCache) -> bool:
        return request.resize(REQUEST_CAPACITY_TOKENS, REQUEST_HISTORY_TOKENS)
