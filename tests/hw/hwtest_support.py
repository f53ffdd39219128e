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
        outcome = fn()  # the call's with_plan form: value and plan
        assert outcome.error is None, outcome.error
        after(api, outcome.plan)
        return outcome.value

    a = call("create a", lambda: mgr.create_kv_cache.with_plan(toks(0, 0)))
    assert call("resume a", a.resume.with_plan)
    assert call("resize a", lambda: a.resize.with_plan(10 * TPB))
    call("commit a", lambda: a.commit.with_plan(toks(0, 10 * TPB)))
    call("suspend a", a.suspend.with_plan)
    b = call("create b", lambda: mgr.create_kv_cache.with_plan(toks(0, 0)))
    assert call("resume b", b.resume.with_plan)
    assert call("resize b", lambda: b.resize.with_plan(9 * TPB))  # GPU full: a's pages offloaded
    call("commit b", lambda: b.commit.with_plan(toks(5000, 9 * TPB)))
    call("suspend b", b.suspend.with_plan)
    assert call("resume a again", a.resume.with_plan)  # onboards a's pages, offloads b's
    call("suspend a again", a.suspend.with_plan)
    # evict + compact (intra)
    assert call("shrink gpu", lambda: mgr.resize.with_plan(0, 6 * (8192 + 4096)))
    call("close b", b.close.with_plan)
    # drops + host compaction
    assert call("shrink host", lambda: mgr.resize.with_plan(1, 12 * (8192 + 4096)))
    call("close a", a.close.with_plan)


def numpy_signature(blocks: np.ndarray, slot_bytes: int, pool: int) -> np.ndarray:
    """Reference for hw.pools' signature kernel: (pages, slot_bytes) uint8, computed on the host."""
    with np.errstate(over="ignore"):
        off = np.arange(slot_bytes, dtype=np.uint64)[None, :]
        z = blocks.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) \
            + (np.uint64(pool) << np.uint64(40)) + off
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return ((z ^ (z >> np.uint64(31))) >> np.uint64(24)).astype(np.uint8)
