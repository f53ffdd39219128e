"""Helpers for tests/hw: the GPU skip and a small manager run that produces every kind of copy.

Not a conftest.py on purpose: tests/ and tests/hw/ are not packages, and a second ``conftest``
module would replace the one that ``tests/test_manager.py`` imports names from
(``from conftest import ...``), breaking collection of the CPU suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig, Plan

TPB = 4  # tokens per block


def gpu_or_skip() -> Any:
    """CuPy, after checking there is a CUDA device; otherwise skip with the reason."""
    try:
        import cupy
    except Exception as exc:
        pytest.skip(f"CuPy is not importable ({type(exc).__name__}: {exc})")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        pytest.skip(f"no CUDA driver or device ({type(exc).__name__}: {exc})")
    if n < 1:
        pytest.skip("no CUDA device (cudaGetDeviceCount = 0)")
    return cupy


def bindings_or_skip() -> None:
    try:
        from cuda.bindings import runtime  # noqa: F401
    except Exception as exc:
        pytest.skip(f"cuda.bindings not importable, needed for cudaMemcpyBatchAsync ({exc})")


def two_group_config(gpu_pages: int = 12, host_pages: int = 20) -> ManagerConfig:
    """Full attention (two 4 KiB pools) + sliding window (two 2 KiB pools): two pool groups."""
    full = LayerConfig(slot_bytes=(4096, 4096))
    swa = LayerConfig(slot_bytes=(2048, 2048), window_tokens=3 * TPB)
    per_block = 8192 + 4096
    return ManagerConfig(layers=(full, swa),
                         levels=(LevelConfig("gpu", gpu_pages * per_block),
                                 LevelConfig("host", host_pages * per_block)),
                         tokens_per_block=TPB)


def toks(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


def burst_scenario(mgr: KVCacheManager, after: Callable[[str, Plan], None]) -> None:
    """Calls that offload (GPU full), onboard (resume), drop, and compact both levels.

    ``after(api, plan)`` runs after every call with that call's plan.
    """
    def call(api: str, fn: Callable[[], Any]) -> Any:
        out = fn()
        after(api, mgr.last_plan)
        return out

    a = call("create a", lambda: mgr.create_kv_cache(toks(0, 0)))
    assert call("resume a", a.resume)
    assert call("resize a", lambda: a.resize(10 * TPB))
    call("commit a", lambda: a.commit(toks(0, 10 * TPB)))
    call("suspend a", a.suspend)
    b = call("create b", lambda: mgr.create_kv_cache(toks(0, 0)))
    assert call("resume b", b.resume)
    assert call("resize b", lambda: b.resize(9 * TPB))  # GPU full: a's pages offloaded
    call("commit b", lambda: b.commit(toks(5000, 9 * TPB)))
    call("suspend b", b.suspend)
    assert call("resume a again", a.resume)  # onboards a's pages, offloads b's
    call("suspend a again", a.suspend)
    assert call("shrink gpu", lambda: mgr.resize(0, 6 * (8192 + 4096)))  # evict + compact (intra)
    call("close b", b.close)
    assert call("shrink host", lambda: mgr.resize(1, 12 * (8192 + 4096)))  # drops + host compaction
    call("close a", a.close)


def numpy_signature(blocks: np.ndarray, slot_bytes: int, pool: int) -> np.ndarray:
    """Reference for hw.pools' signature kernel: (pages, slot_bytes) uint8, computed on the host."""
    with np.errstate(over="ignore"):
        off = np.arange(slot_bytes, dtype=np.uint64)[None, :]
        z = blocks.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) \
            + (np.uint64(pool) << np.uint64(40)) + off
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return ((z ^ (z >> np.uint64(31))) >> np.uint64(24)).astype(np.uint8)
