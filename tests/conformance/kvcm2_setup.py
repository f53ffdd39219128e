"""Set-ups shared by the conformance tests: kvsim's equivalents of KVCM2's test helpers.

KVCM2's tests (``tests/unittest/kv_cache_manager_v2_tests/`` in TensorRT-LLM) build managers
with a few helpers; these build the same situations through kvsim's API:

* ``prepare(gpu, host, disk, num_layers, window, sinks, ...)``: KVCM2's ``create_config``:
  even layers are sliding-window (``window``, ``sinks``) when a window is given, odd layers full
  attention; each layer has a key and a value buffer of ``kv_buf_size`` bytes (two more of
  ``block_quant`` bytes when given); a tier with a quota of 0 is left out.
* ``stats_manager(...)``: the statistics tests' manager: 4 tokens per block, one layer whose
  block is 2 MiB (key and value of 1 MiB), a GPU of 4 blocks, partial reuse on and
  ``max_util_for_resume`` 1.0.

KVCM2's API takes ``(reuse_scope, input_tokens)`` where kvsim takes ``(input_tokens,
reuse_scope)``; ``kv.capacity = c`` is ``resize(c)``; ``commit(tokens, is_end=True)`` is
``commit`` then ``stop_committing``; ``resume(stream)`` is ``resume()``.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig

MiB = 1 << 20
BLOCK_2MIB = (MiB, MiB)  # key and value buffers of the statistics tests' one layer


def layers(num_layers: int, window: int | None, sinks: int, kv_buf_size: int = 8192,
           block_quant: int | None = None) -> tuple[LayerConfig, ...]:
    bufs = (kv_buf_size, kv_buf_size) + ((block_quant, block_quant) if block_quant else ())
    return tuple(
        LayerConfig(bufs, window if i % 2 == 0 else None, sinks if i % 2 == 0 and window else 0)
        for i in range(num_layers))


def prepare(gpu: int, host: int, disk: int, num_layers: int, window: int | None, sinks: int,
            tokens_per_block: int = 32, kv_buf_size: int = 8192, block_quant: int | None = None,
            **config) -> KVCacheManager:
    levels = tuple(LevelConfig(name, quota) for name, quota in
                   (("gpu", gpu), ("host", host), ("disk", disk)) if quota > 0)
    return KVCacheManager(ManagerConfig(
        layers=layers(num_layers, window, sinks, kv_buf_size, block_quant), levels=levels,
        tokens_per_block=tokens_per_block, **config))


def stats_manager(gpu_blocks: int = 4, host_blocks: int | None = None,
                  windows: tuple[int | None, ...] = (None,), **config) -> KVCacheManager:
    lays = tuple(LayerConfig(BLOCK_2MIB, w) for w in windows)
    unit = 2 * MiB * len(lays)
    levels = [LevelConfig("gpu", gpu_blocks * unit)]
    if host_blocks is not None:
        levels.append(LevelConfig("host", host_blocks * unit))
    base = {"max_util_for_resume": 1.0}
    base.update(config)
    return KVCacheManager(ManagerConfig(layers=lays, levels=tuple(levels), tokens_per_block=4,
                                        **base))


def toks(start: int, n: int) -> list[int]:
    """``n`` consecutive token ids from ``start`` (KVCM2's tests count tokens up likewise)."""
    return list(range(start, start + n))


def iteration(mgr: KVCacheManager, lc: int = 0) -> dict:
    """One life cycle's iteration statistics; resets them."""
    return mgr.get_and_reset_iteration_stats()["life_cycles"][lc]


def committed(mgr: KVCacheManager) -> tuple[int, int, int, int]:
    """The cumulative (alloc_total, alloc_new, reused, missed), summed over life cycles."""
    rows = mgr.get_committed_stats()["life_cycles"]
    return tuple(sum(r[k] for r in rows) for k in
                 ("alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "missed_blocks"))


def delta(d: dict) -> tuple[int, int, int, int]:
    """A per-request delta as KVCM2's tuple (alloc_total, alloc_new, reused, missed)."""
    return (d["alloc_total_blocks"], d["alloc_new_blocks"], d["reused_blocks"], d["missed_blocks"])


def as_array(tokens) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)
