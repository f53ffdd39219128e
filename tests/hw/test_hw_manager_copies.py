"""GPU: a small manager run's real copy batches, executed on real pools and verified page by page.

The run (hwtest_support.burst_scenario) offloads (GPU full), onboards (resume), drops at the host
level and compacts both levels. After every call its plan's copies run on the GPU and
SignatureTracker checks that every page signed earlier still holds its signature at the slot the
manager now keeps it in: nothing lost, nothing corrupted.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hwtest_support import (
    bindings_or_skip,
    burst_scenario,
    gpu_or_skip,
    numpy_signature,
    two_group_config,
)

from kvsim.hardware import load_hardware
from kvsim.manager import KVCacheManager
from kvsim.manager.invariants import check_invariants

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    return gpu_or_skip()


@pytest.mark.parametrize("path", ["kernel", "ce-batch", "ce-page", "selected"])
def test_manager_plans_execute_and_verify(cp, path, caplog):
    from hw.executor_copies import PlanCopier, SignatureTracker
    from hw.pools import HostDevicePools
    from kvsim.model.copy_select import CopySelector

    if path in ("ce-batch", "selected"):
        bindings_or_skip()
    mgr = KVCacheManager(two_group_config())
    hw = load_hardware("h200-sxm")
    with HostDevicePools(mgr.layout, hardware=hw) as pools:
        copier = (PlanCopier(pools, selector=CopySelector(hw)) if path == "selected"
                  else PlanCopier(pools, path=path))
        tracker = SignatureTracker(mgr, pools)
        kinds: Counter = Counter()
        verified = 0
        records = []

        def after(api, plan):
            nonlocal verified
            records.extend(copier.run(plan.copies))
            for c in plan.copies:
                kinds[c.kind] += c.num_pages
            verified += tracker.after_call(api).pages_verified
            check_invariants(mgr)

        with caplog.at_level("INFO", logger="kvsim.hw"):
            burst_scenario(mgr, after)
    assert kinds["offload"] > 0 and kinds["onboard"] > 0 and kinds["intra"] > 0
    assert verified > 0
    assert all(r.device_s is not None and r.device_s >= 0 for r in records)
    if path == "selected":
        assert any("copy path" in m for m in caplog.messages)
        assert all(r.predicted_device_s is not None for r in records)
    else:
        assert {r.path for r in records} == {path}


def test_verify_catches_a_corrupted_and_a_lost_page(cp):
    from hw.pools import HostDevicePools, IntegrityError

    mgr = KVCacheManager(two_group_config())
    with HostDevicePools(mgr.layout) as pools:
        slots = np.arange(5)
        blocks = np.arange(100, 105)
        pools.fill_signature(1, 0, slots, blocks)
        assert pools.verify(1, 0, slots, blocks).ok
        for p in (0, 1):  # the device kernel computes the reference bytes
            want = numpy_signature(blocks, pools.spec(1, 0, p).slot_bytes, p)
            assert np.array_equal(pools.view(1, 0, p)[:5].get(), want)
        pools.view(1, 0, 1)[3, 17] ^= 1  # one bit, pool 1 of slot 3
        res = pools.verify(1, 0, slots, blocks)
        assert res.num_bad == 1 and res.bad[0][:3] == (3, 103, 1)
        with pytest.raises(IntegrityError, match="slot 3 block 103 pool 1"):
            res.raise_if_bad("test")
        # a page "moved" without its data: slot 4 was never written with block 104's bytes
        pools.fill_signature(0, 0, slots, blocks)
        assert not pools.verify(0, 0, [4], [200]).ok
        # same block, other pool or shifted bytes never match
        p0 = pools.view(0, 0, 0)[0].copy()
        assert not bool(cp.array_equal(p0, pools.view(0, 0, 1)[0]))
        assert not bool(cp.array_equal(p0[1:], p0[:-1]))


def test_tracker_fails_when_a_plan_copy_is_skipped(cp):
    from hw.executor_copies import PlanCopier, SignatureTracker
    from hw.pools import HostDevicePools, IntegrityError

    mgr = KVCacheManager(two_group_config())
    with HostDevicePools(mgr.layout) as pools:
        copier = PlanCopier(pools, path="kernel")
        tracker = SignatureTracker(mgr, pools)

        def after(api, plan):
            copier.run([c for c in plan.copies if c.kind != "offload"])  # drop the offloads
            tracker.after_call(api)

        with pytest.raises(IntegrityError, match="corrupted or lost"):
            burst_scenario(mgr, after)
