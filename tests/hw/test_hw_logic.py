"""The GPU side's pure logic, on the CPU: path selection, pool sizing, --verify bookkeeping.

No GPU needed (runs in CI). The --verify bookkeeping runs the same manager scenario as the GPU test
against a NumPy stand-in for the pools.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hwtest_support import burst_scenario, numpy_signature, two_group_config

from hw.executor_copies import SignatureTracker
from hw.pools import (
    InsufficientMemoryError,
    IntegrityError,
    VerifyResult,
    check_fits,
    host_available_bytes,
    memory_need,
    plan_pools,
)
from kvsim.hardware import load_hardware
from kvsim.manager import KVCacheManager
from kvsim.manager.plan import CopyBatch
from kvsim.model.copy_paths import CopyRequest, estimate
from kvsim.model.copy_select import CopySelector, select_path

H200 = load_hardware("h200-sxm")


# -- path selection -----------------------------------------------------------------------------

def test_selector_picks_the_fastest_modelled_path_and_logs_every_candidate(caplog):
    sel = CopySelector(H200)
    with caplog.at_level(logging.INFO, logger="kvsim.hw"):
        s = sel.choose("offload", (8192, 8192), 6380)
    costs = {(p, c): t for p, c, t in s.candidates}
    assert s.path == min(costs, key=costs.get)[0]
    assert min(costs.values()) == pytest.approx(sel.cost(s.estimate))
    assert s.total_seconds == pytest.approx(s.estimate.end_to_end_seconds)
    msg = caplog.messages[-1]
    assert msg.startswith(f"copy path {s.path} for offload of 6380 pages x 8192+8192 B")
    assert "ce-batch" in msg and "ce-page" in msg and "kernel" in msg


def test_selection_depends_on_batch_size_not_on_the_link_kind():
    # one page: a copy engine (no kernel launch and index upload); thousands: not per page
    assert select_path(H200, "offload", 16384, 1)[0] in ("ce-page", "ce-batch")
    assert select_path(H200, "offload", 16384, 6380)[0] != "ce-page"
    assert H200.default_path() == "ce-batch"  # KVCM2's link-kind rule, which the selector ignores


def test_kernel_estimate_sums_pools_and_uses_the_best_cta_count():
    sel = CopySelector(H200, paths=["kernel"])
    s = sel.choose("onboard", (4096, 12288), 1000)
    # The copier's per-batch costs ride on the first pool's request only.
    parts = [estimate(H200, CopyRequest("kernel", "onboard", b, 1000, ctas=s.estimate.ctas,
                                        via_copier=i == 0))
             for i, b in enumerate((4096, 12288))]
    assert s.estimate.seconds == pytest.approx(sum(p.seconds for p in parts))
    assert s.estimate.host_seconds == pytest.approx(sum(p.host_seconds for p in parts))
    assert s.estimate.ctas in sel.kernel_cta_options()
    assert s.estimate.gbps == pytest.approx(1000 * 16384 / s.estimate.seconds / 1e9)


def test_ce_batch_is_one_call_for_all_pools():
    sel = CopySelector(H200, paths=["ce-batch"])
    one = sel.price("ce-batch", "offload", (8192,), 100)
    two = sel.price("ce-batch", "offload", (8192, 8192), 100)
    ce = H200.copy_engine
    per_page = ce.batch_descriptor_host_us.offload + 8 * ce.batch_small_copy_host_us_per_kib.offload
    assert two.host_seconds - one.host_seconds == pytest.approx(100 * per_page * 1e-6)


def test_more_ctas_must_pay_for_the_sms_they_take():
    # With SMs free the selector takes the fastest count; pricing SMs moves it to fewer CTAs,
    # never to a count the model prices slower by more than the SMs it saves are worth.
    free = CopySelector(H200, paths=["kernel"], sm_weight=0.0).choose("offload", (8192, 8192), 6380)
    dear = CopySelector(H200, paths=["kernel"], sm_weight=1.0).choose("offload", (8192, 8192), 6380)
    assert dear.estimate.ctas < free.estimate.ctas
    assert free.total_seconds <= dear.total_seconds
    with pytest.raises(ValueError, match="sm_weight"):
        CopySelector(H200, sm_weight=-1)


def test_unaligned_batches_are_priced_with_the_fallback_kernel():
    sel = CopySelector(H200, paths=["kernel"])
    a = sel.choose("onboard", (4096,), 1000, aligned=True).estimate
    u = sel.choose("onboard", (4096,), 1000, aligned=False).estimate
    assert u.seconds > a.seconds and u.aligned is False


def test_intra_level_batches():
    b = CopyBatch(0, 0, 0, np.arange(10), np.arange(10, 20), (4096, 4096))
    assert CopySelector(H200).choose_for_batch(b)[0] == "kernel"
    b = CopyBatch(1, 1, 0, np.arange(10), np.arange(10, 20), (4096, 4096))
    path, est = CopySelector(H200).choose_for_batch(b)
    assert path == "ce-batch" and est.direction == "intra"


def test_selector_rejects_unknown_paths():
    with pytest.raises(ValueError, match="subset"):
        CopySelector(H200, paths=["dma"])


# -- pool sizing ---------------------------------------------------------------------------------

def test_pools_follow_the_manager_layout():
    mgr = KVCacheManager(two_group_config(gpu_pages=12, host_pages=20))
    specs = plan_pools(mgr.layout)
    assert [(s.level, s.group, s.pool, s.slot_bytes, s.num_slots) for s in specs] == [
        (0, 0, 0, 4096, 12), (0, 0, 1, 4096, 12), (0, 1, 0, 2048, 12), (0, 1, 1, 2048, 12),
        (1, 0, 0, 4096, 20), (1, 0, 1, 4096, 20), (1, 1, 0, 2048, 20), (1, 1, 1, 2048, 20)]
    assert memory_need(specs) == {"device": 12 * 12288, "host": 20 * 12288}
    bigger = plan_pools(mgr.layout, [None, 40 * 12288])
    assert memory_need(bigger)["host"] == 40 * 12288


def test_quota_beyond_free_memory_names_the_tier():
    with pytest.raises(InsufficientMemoryError, match="GPU level needs 200 bytes.*100 free"):
        check_fits({"device": 200, "host": 10}, free_device=100, free_host=10**9)
    with pytest.raises(InsufficientMemoryError, match="MemAvailable is 5"):
        check_fits({"device": 1, "host": 10}, free_device=100, free_host=5)
    check_fits({"device": 100, "host": 5}, free_device=100, free_host=5)


def test_meminfo_parsing():
    text = "MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:   2048 kB\n"
    assert host_available_bytes(text) == 2048 * 1024
    with pytest.raises(ValueError):
        host_available_bytes("MemTotal: 1 kB\n")


def test_a_disk_level_is_refused():
    from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig

    cfg = ManagerConfig(layers=(LayerConfig(),), levels=(LevelConfig("gpu", 1 << 20),
                                                          LevelConfig("host", 1 << 20),
                                                          LevelConfig("disk", 1 << 20)))
    with pytest.raises(ValueError, match="GPU and a host level"):
        plan_pools(KVCacheManager(cfg).layout)


# -- --verify bookkeeping on a NumPy stand-in ----------------------------------------------------

class NumpyPools:
    """Host arrays laid out like HostDevicePools, with its fill/verify/copy contract."""

    def __init__(self, layout) -> None:
        self.layout = layout
        self.mem = {(s.level, s.group, s.pool): np.zeros((s.num_slots, s.slot_bytes), np.uint8)
                    for s in plan_pools(layout)}

    def num_pools(self, group: int) -> int:
        return len(self.layout.pool_groups[group].pool_slot_bytes)

    def fill_signature(self, level, group, slots, block_ids) -> None:
        for p in range(self.num_pools(group)):
            m = self.mem[(level, group, p)]
            m[np.asarray(slots)] = numpy_signature(np.asarray(block_ids), m.shape[1], p)

    def verify(self, level, group, slots, block_ids) -> VerifyResult:
        slots, blocks = np.asarray(slots), np.asarray(block_ids)
        bad = []
        for p in range(self.num_pools(group)):
            m = self.mem[(level, group, p)]
            wrong = (m[slots] != numpy_signature(blocks, m.shape[1], p)).sum(axis=1)
            bad += [(int(slots[i]), int(blocks[i]), p, int(wrong[i])) for i in np.flatnonzero(wrong)]
        return VerifyResult(int(slots.size), 0, len(bad), tuple(bad[:32]))

    def copy_batch(self, b: CopyBatch) -> None:
        for p in range(self.num_pools(b.pool_group)):
            src = self.mem[(b.src_level, b.pool_group, p)]
            dst = self.mem[(b.dst_level, b.pool_group, p)]
            dst[b.dst_slots] = src[b.src_slots]


def test_signature_depends_on_block_pool_and_offset():
    s = numpy_signature(np.array([1, 2]), 64, 0)
    assert not np.array_equal(s[0], s[1])
    assert not np.array_equal(s[0], numpy_signature(np.array([1]), 64, 1)[0])
    assert not np.array_equal(s[0, 1:], s[0, :-1])


def test_tracker_verifies_every_page_after_each_call():
    mgr = KVCacheManager(two_group_config())
    pools = NumpyPools(mgr.layout)
    tracker = SignatureTracker(mgr, pools)
    log = []

    def after(api, plan):
        for b in plan.copies:
            pools.copy_batch(b)
        s = tracker.after_call(api)
        log.append((api, s.pages_verified, s.pages_signed, s.pages_forgotten))

    burst_scenario(mgr, after)
    assert sum(v for _, v, _, _ in log) > 0
    assert any(f > 0 for _, _, _, f in log)  # dropped pages are forgotten, not reported lost
    assert log[-1][0] == "close a"


@pytest.mark.parametrize("skip", ["offload", "onboard", "intra"])
def test_tracker_catches_a_skipped_copy(skip):
    mgr = KVCacheManager(two_group_config())
    pools = NumpyPools(mgr.layout)
    tracker = SignatureTracker(mgr, pools)

    def after(api, plan):
        for b in plan.copies:
            if b.kind != skip:
                pools.copy_batch(b)
        tracker.after_call(api)

    with pytest.raises(IntegrityError, match="corrupted or lost"):
        burst_scenario(mgr, after)
