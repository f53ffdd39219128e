"""GPU: every copy path moves exactly the pages a CopyBatch names, and nothing else.

Random source data, poisoned destinations, fresh data per case; page layouts that take the LDGSTS
kernel (16 KiB; two pools of 2 and 6 KiB) and the alignment-agnostic kernel (4100-byte slots: 4-byte
elements; a 3-byte base offset: 1-byte elements); 1, 3 and 1000 pages; offload (GPU -> host),
onboard (host -> GPU), and intra-level copies on the GPU and on the host.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hwtest_support import bindings_or_skip, gpu_or_skip

from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig
from kvsim.manager.config import StorageLayout
from kvsim.manager.plan import CopyBatch

pytestmark = pytest.mark.gpu

SLOTS = 2048
POISON = 0xA5
LAYOUTS = {
    # name: (pool slot bytes, base offset, kernel expected for the 'kernel' path)
    "aligned16k": ((16384,), 0, "paged_copy_ldgsts"),
    "two_pools": ((2048, 6144), 0, "paged_copy_ldgsts"),
    "unaligned4100": ((4100,), 0, "paged_copy_simple<unsigned int"),
    "offset3": ((4096,), 3, "paged_copy_simple<unsigned char"),
}
DIRECTIONS = {"offload": (0, 1), "onboard": (1, 0), "intra-gpu": (0, 0), "intra-host": (1, 1)}


def layout_of(slot_bytes: tuple[int, ...]) -> StorageLayout:
    page = sum(slot_bytes)
    cfg = ManagerConfig(layers=(LayerConfig(slot_bytes=slot_bytes),),
                        levels=(LevelConfig("gpu", SLOTS * page), LevelConfig("host", SLOTS * page)))
    return StorageLayout.from_config(cfg)


@pytest.fixture(scope="module")
def cp():
    return gpu_or_skip()


@pytest.fixture(scope="module")
def stream(cp):
    return cp.cuda.Stream(non_blocking=True)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def case(request, cp):
    from hw.pools import HostDevicePools

    slot_bytes, offset, kernel = LAYOUTS[request.param]
    pools = HostDevicePools(layout_of(slot_bytes), base_offset=offset)
    yield request.param, pools, kernel
    pools.close()


def _randomize(cp, pools, level: int, seed: int) -> None:
    rs = cp.random.RandomState(seed)
    for p in range(pools.num_pools(0)):
        v = pools.view(level, 0, p)
        v[...] = rs.randint(0, 256, size=v.shape, dtype=cp.int32).astype(cp.uint8)


def _snapshot(pools, level: int) -> list:
    return [pools.view(level, 0, p).copy() for p in range(pools.num_pools(0))]


@pytest.mark.parametrize("n", [1, 3, 1000])
@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
@pytest.mark.parametrize("path", ["kernel", "ce-batch", "ce-page"])
def test_copy_batch_moves_exactly_the_named_pages(cp, stream, case, path, direction, n):
    if path == "ce-batch":
        bindings_or_skip()
    name, pools, kernel = case
    src_level, dst_level = DIRECTIONS[direction]
    seed = zlib.crc32(f"{name}/{path}/{direction}/{n}".encode())
    rng = np.random.default_rng(seed)
    perm = rng.permutation(SLOTS).astype(np.int32)
    src = perm[:n]
    dst = perm[n:2 * n] if src_level == dst_level else rng.permutation(SLOTS)[:n].astype(np.int32)

    _randomize(cp, pools, src_level, seed)
    for p in range(pools.num_pools(0)):
        view = pools.view(dst_level, 0, p)
        if src_level == dst_level:
            view[cp.asarray(dst)] = POISON
        else:
            view.fill(POISON)
    cp.cuda.runtime.deviceSynchronize()
    before_src = _snapshot(pools, src_level)
    before_dst = _snapshot(pools, dst_level)
    cp.cuda.runtime.deviceSynchronize()  # the copy stream does not wait for the legacy stream

    batch = CopyBatch(src_level, dst_level, 0, src, dst, pools.layout.pool_groups[0].pool_slot_bytes)
    ex = pools.copy_batch(batch, path, stream)
    stream.synchronize()

    assert ex.num_pages == n and ex.num_bytes == n * sum(batch.pool_slot_bytes)
    if path == "kernel":
        assert all(k.startswith(kernel) for k in ex.kernels), ex.kernels
    for p in range(pools.num_pools(0)):
        expected = before_dst[p].copy()
        expected[cp.asarray(dst)] = before_src[p][cp.asarray(src)]
        got = pools.view(dst_level, 0, p)
        wrong_rows = int(cp.count_nonzero(cp.any(got != expected, axis=1)))
        assert wrong_rows == 0, f"{name} {path} {direction} n={n} pool {p}: {wrong_rows} slots wrong"
        if src_level != dst_level:
            assert bool(cp.array_equal(pools.view(src_level, 0, p), before_src[p])), "source changed"


def test_kernel_path_honours_ctas_and_inflight(cp, stream):
    from hw.pools import HostDevicePools

    with HostDevicePools(layout_of((16384,))) as pools:
        _randomize(cp, pools, 0, 7)
        pools.view(1, 0, 0).fill(POISON)
        cp.cuda.runtime.deviceSynchronize()
        src = np.arange(100, dtype=np.int32)
        dst = np.arange(100, 200, dtype=np.int32)
        ex = pools.copy_batch(CopyBatch(0, 1, 0, src, dst, (16384,)), "kernel", stream,
                              ctas=6, inflight_bytes=128 * 1024)
        stream.synchronize()
        assert ex.ctas == 6 and ex.inflight_bytes == 128 * 1024
        assert ex.kernels == ("paged_copy_ldgsts<4,16>",)
        assert bool(cp.array_equal(pools.view(1, 0, 0)[100:200], pools.view(0, 0, 0)[:100]))


def test_copy_batch_refuses_out_of_range_slots(cp, stream):
    from hw.pools import HostDevicePools

    with HostDevicePools(layout_of((4096,))) as pools:
        bad = CopyBatch(0, 1, 0, np.array([0], np.int32), np.array([SLOTS], np.int32), (4096,))
        with pytest.raises(ValueError, match="out of range"):
            pools.copy_batch(bad, "kernel", stream)


def test_quota_beyond_free_memory_is_refused_before_allocating(cp):
    from hw.pools import HostDevicePools, InsufficientMemoryError

    layout = layout_of((16384,))
    free_before = cp.cuda.runtime.memGetInfo()[0]
    too_big = free_before + (1 << 30)
    with pytest.raises(InsufficientMemoryError, match="GPU level needs") as info:
        HostDevicePools(layout, level_quotas=[too_big, 1 << 20])
    assert "nothing was allocated" in str(info.value)
    with pytest.raises(InsufficientMemoryError, match="host level needs"):
        HostDevicePools(layout, level_quotas=[1 << 20, 1 << 40], host_available=1 << 30)
    assert abs(cp.cuda.runtime.memGetInfo()[0] - free_before) < (64 << 20)


def test_host_pools_are_pinned_mapped_and_device_pools_device_memory(cp):
    from hw.pools import HostDevicePools

    with HostDevicePools(layout_of((4096,))) as pools:
        dev = cp.cuda.runtime.pointerGetAttributes(pools.base(0, 0, 0))
        host = cp.cuda.runtime.pointerGetAttributes(pools.base(1, 0, 0))
        assert dev.type == 2  # cudaMemoryTypeDevice
        assert host.type == 1  # cudaMemoryTypeHost (pinned)
        assert host.devicePointer == pools.base(1, 0, 0)  # mapped, same address (UVA)
