"""Behaviour of the manager model: life cycle, resize, commit and reuse, eviction, errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config, tokens

from kvsim.errors import (
    CachesStillOpenError,
    InvalidArgumentError,
    InvalidStateError,
    OutOfPagesError,
)
from kvsim.manager import CacheStatus, KVCacheManager
from kvsim.manager.fingerprint import fingerprint
from kvsim.manager.invariants import check_invariants
from kvsim.manager.radix_tree import DEFAULT_SCOPE


def active(mgr: KVCacheManager, capacity: int = 0, toks=None, **kw):
    cache = mgr.create_kv_cache(toks, **kw)
    assert cache.resume()
    if capacity:
        assert cache.resize(capacity)
    return cache


def gpu(mgr: KVCacheManager) -> dict:
    return mgr.get_storage_statistics(0)[0]


# -- life cycle ---------------------------------------------------------------------------------

def test_state_machine_and_idempotent_close(mgr):
    cache = mgr.create_kv_cache()
    assert cache.status is CacheStatus.SUSPENDED
    assert cache.resume()
    assert cache.status is CacheStatus.ACTIVE
    cache.suspend()
    assert cache.status is CacheStatus.SUSPENDED
    cache.close()
    cache.close()
    assert cache.status is CacheStatus.CLOSED
    assert mgr.num_open_caches == 0
    check_invariants(mgr)


@pytest.mark.parametrize("call", [
    lambda c: c.resize(8),
    lambda c: c.commit([1, 2]),
    lambda c: c.suspend(),
])
def test_calls_needing_active_refuse_a_suspended_cache_and_change_nothing(mgr, call):
    cache = mgr.create_kv_cache()
    before = fingerprint(mgr)
    with pytest.raises(InvalidStateError, match="needs a ACTIVE cache"):
        call(cache)
    assert fingerprint(mgr) == before


def test_resume_twice_is_an_error(mgr):
    cache = active(mgr)
    with pytest.raises(InvalidStateError, match="SUSPENDED"):
        cache.resume()


def test_suspended_cache_uses_no_unavailable_gpu_pages(mgr):
    cache = active(mgr, capacity=20)
    assert gpu(mgr)["unavailable"] == 5
    cache.suspend()
    assert gpu(mgr)["unavailable"] == 0
    assert gpu(mgr)["evictable"] == 5  # HELD pages may be evicted to the host


# -- resize -------------------------------------------------------------------------------------

def test_resize_grows_and_shrinks_pages(mgr):
    cache = active(mgr, capacity=10)
    assert cache.num_blocks == 3 and gpu(mgr)["free"] == 13
    assert cache.resize(17)
    assert gpu(mgr)["free"] == 11
    assert cache.resize(4)
    assert cache.num_blocks == 1 and gpu(mgr)["free"] == 15
    check_invariants(mgr)


@pytest.mark.parametrize("args, message", [
    ((-1,), r"capacity must be in \[0, 67108864\] tokens"),
    ((2.5,), "capacity must be an integer"),
    ((True,), "capacity must be an integer"),
    ((4, 8), "capacity 4 is below history_length 8"),
])
def test_resize_rejects_bad_sizes_and_changes_nothing(mgr, args, message):
    cache = active(mgr, capacity=8)
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match=message):
        cache.resize(*args)
    assert fingerprint(mgr) == before


def test_history_never_decreases(mgr):
    cache = active(mgr)
    assert cache.resize(16, 12)
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match="may not decrease: 8 < current 12"):
        cache.resize(16, 8)
    assert fingerprint(mgr) == before


def test_out_of_pages_returns_false_and_rolls_back():
    mgr = KVCacheManager(small_config(gpu_pages=8, host_pages=4))
    other = active(mgr, capacity=12)  # 3 LOCKED pages: not evictable
    cache = active(mgr, capacity=8)
    before = fingerprint(mgr)
    refused = cache.resize.with_plan(40)  # needs 8 more pages; 3 free + 0 evictable
    assert refused.value is False and refused.plan.ok is False
    assert fingerprint(mgr) == before
    with pytest.raises(OutOfPagesError):
        cache.capacity = 40  # the property setter turns False into an error
    assert fingerprint(mgr) == before
    other.close()
    check_invariants(mgr)


def test_sliding_window_needs_no_page_for_stale_blocks():
    mgr = KVCacheManager(small_config(window=8, gpu_pages=64))
    cache = active(mgr)
    assert cache.resize(41, 40)  # 11 blocks; window 8 tokens -> blocks (41-8)//4=8.. stay
    full, swa = cache.page_ids(0), cache.page_ids(1)
    assert (full >= 0).all() and full.size == 11
    begin, end = mgr.layout.life_cycles[1].stale_range(40, 4)
    assert (begin, end) == (0, 8)
    assert (swa[:8] < 0).all() and (swa[8:] >= 0).all()
    check_invariants(mgr)


def test_sink_blocks_are_never_stale():
    from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig
    cfg = ManagerConfig(layers=(LayerConfig(slot_bytes=(64,), window_tokens=8, sink_tokens=5),),
                        levels=(LevelConfig("gpu", 64 * 64),), tokens_per_block=4)
    mgr = KVCacheManager(cfg)
    cache = active(mgr)
    assert cache.resize(40, 40)
    swa = cache.page_ids(0)
    assert mgr.layout.life_cycles[0].sink_blocks == 2
    assert (swa[:2] >= 0).all() and (swa[2:8] < 0).all() and (swa[8:] >= 0).all()


# -- commit and reuse ---------------------------------------------------------------------------

def test_commit_and_reuse_full_blocks():
    mgr = KVCacheManager(small_config(partial_reuse=False))
    cache = active(mgr, capacity=14)
    cache.commit(tokens(0, 14))
    assert cache.num_committed_tokens == 14 and cache.history_length == 14
    cache.stop_committing()
    cache.close()
    # the 2-token tail block was committed: found by key even without partial reuse
    assert mgr.probe_reuse(tokens(0, 14)) == 14
    assert mgr.probe_reuse(tokens(0, 13)) == 12  # full blocks only, without partial reuse
    assert mgr.probe_reuse(tokens(0, 7)) == 4
    assert mgr.probe_reuse(tokens(1, 14)) == 0
    again = mgr.create_kv_cache(tokens(0, 20))
    assert again.num_committed_tokens == again.history_length == again.capacity == 12
    assert again.pending_stats["reused_blocks"] == 3  # pending until published
    assert again.commit_pending_stats()["reused_blocks"] == 3
    stats = mgr.get_committed_stats()["life_cycles"][0]
    assert stats["reused_blocks"] == 3 and stats["missed_blocks"] == 0  # misses come at resize
    check_invariants(mgr)


def test_commit_beyond_capacity_is_rejected(mgr):
    cache = active(mgr, capacity=4)
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match="above capacity 4"):
        cache.commit(tokens(0, 5))
    with pytest.raises(InvalidArgumentError, match="integer token ids"):
        cache.commit([1.5])
    with pytest.raises(InvalidArgumentError, match=r"\[0, 2\*\*32\)"):
        cache.commit([-1])
    assert fingerprint(mgr) == before


def test_second_request_rebases_onto_identical_committed_blocks(mgr):
    a = active(mgr, capacity=8)
    b = active(mgr, capacity=8)
    a.commit(tokens(0, 8))
    b.commit(tokens(0, 8))
    assert (a.page_ids(0) == b.page_ids(0)).all()  # b now shares a's pages
    assert gpu(mgr)["free"] == 16 - 2
    check_invariants(mgr)


def test_reuse_scopes_isolate(mgr):
    cache = active(mgr, capacity=8, reuse_scope="lora-7")  # no declaration needed
    cache.commit(tokens(0, 8))
    assert mgr.probe_reuse(tokens(0, 8), reuse_scope="lora-7") == 8
    assert mgr.probe_reuse(tokens(0, 8)) == 0
    assert mgr.probe_reuse(tokens(0, 8), reuse_scope="nope") == 0
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match="reuse_scope must be hashable"):
        mgr.create_kv_cache(tokens(0, 8), reuse_scope=[3])
    assert fingerprint(mgr) == before


def test_probe_reuse_leaves_the_manager_byte_for_byte_unchanged():
    mgr = KVCacheManager(small_config(window=8, gpu_pages=8, host_pages=8, partial_reuse=True))
    for start in (0, 100):
        c = active(mgr, capacity=18)
        c.commit(tokens(start, 18))
        c.stop_committing()
        c.close()
    before = fingerprint(mgr)
    results = [mgr.probe_reuse(tokens(s, n)) for s in (0, 100, 50) for n in (3, 8, 18, 30)]
    assert fingerprint(mgr) == before
    assert results[:4] == [3, 8, 18, 18]  # partial reuse of the tail block


def test_partial_reuse_copies_the_last_block():
    mgr = KVCacheManager(small_config(partial_reuse=True))
    c = active(mgr, capacity=10)
    c.commit(tokens(0, 10))
    c.stop_committing()
    c.close()
    created = mgr.create_kv_cache.with_plan(tokens(0, 9))
    new = created.value
    assert new.num_committed_tokens == 9  # two full blocks and 1 token of the third
    assert created.plan.copies == []  # the copy waits for the first resume
    resumed = new.resume.with_plan()
    assert resumed.value is True
    copies = resumed.plan.copies
    assert len(copies) == 1 and copies[0].kind == "intra" and copies[0].num_pages == 1
    assert new.resize(12)
    new.commit(tokens(9, 3))  # completes the third block
    check_invariants(mgr)


def test_partial_reuse_off_matches_full_blocks_only():
    mgr = KVCacheManager(small_config(partial_reuse=False))
    c = active(mgr, capacity=10)
    c.commit(tokens(0, 10))
    c.stop_committing()
    c.close()
    assert mgr.probe_reuse(tokens(0, 11)) == 8
    assert mgr.probe_reuse(tokens(0, 10)) == 10  # the committed tail, by key


def test_commit_after_stop_committing_is_an_error(mgr):
    c = active(mgr, capacity=10)
    c.commit(tokens(0, 6))
    c.stop_committing()
    with pytest.raises(InvalidStateError, match="after stop_committing"):
        c.commit(tokens(6, 1))


# -- planned drops ------------------------------------------------------------------------------

def test_planned_drop_then_probe_returns_len_minus_window():
    mgr = KVCacheManager(small_config(window=8, gpu_pages=32))
    c = active(mgr, capacity=32)
    c.commit(tokens(0, 32))
    with pytest.raises(InvalidStateError, match="needs stop_committing"):
        c.plan_committed_block_drop()
    c.stop_committing()
    handle = c.plan_committed_block_drop()
    assert handle.num_pages == 2  # the window's two blocks
    c.close()
    assert mgr.probe_reuse(tokens(0, 32)) == 32
    assert handle.drop() == 2
    assert mgr.probe_reuse(tokens(0, 32)) == 32 - 8
    with pytest.raises(InvalidStateError, match="already been dropped"):
        handle.drop()
    check_invariants(mgr)


def test_planned_drop_of_pages_still_held_drops_nothing():
    mgr = KVCacheManager(small_config(window=8))
    c = active(mgr, capacity=16)
    c.commit(tokens(0, 16))
    c.stop_committing()
    handle = c.plan_committed_block_drop()
    assert handle.drop() == 0  # the cache still holds its window
    assert mgr.probe_reuse(tokens(0, 16)) == 16


def test_plan_drop_with_nothing_committed_is_none(mgr):
    c = active(mgr, capacity=8)
    c.stop_committing()
    assert c.plan_committed_block_drop() is None


# -- eviction and tiers -------------------------------------------------------------------------

def test_eviction_offloads_to_host_and_resume_onboards():
    mgr = KVCacheManager(small_config(gpu_pages=4, host_pages=8, max_util_for_resume=1.0))
    a = active(mgr, capacity=16)
    a.suspend()
    b = mgr.create_kv_cache()
    assert b.resume()
    grown = b.resize.with_plan(16)  # evicts a's 4 HELD pages to the host
    assert grown.value and grown.plan.offloaded_pages == 4
    b.suspend()
    resumed = a.resume.with_plan()  # onboards a's pages, offloading b's
    assert resumed.value
    plan = resumed.plan
    assert plan.onboarded_pages == 4 and plan.offloaded_pages == 4
    kinds = [c.kind for c in plan.copies]
    assert kinds == ["offload", "onboard"]  # room is made before pages come in
    check_invariants(mgr)


def test_eviction_order_priority_then_lru_then_deepest():
    mgr = KVCacheManager(small_config(gpu_pages=6, host_pages=16))
    low = active(mgr, capacity=8, priority_callback=lambda block, lc: 10)
    low.commit(tokens(0, 8))
    low.close()
    old = active(mgr, capacity=8)
    old.commit(tokens(100, 8))
    old.close()
    new = active(mgr, capacity=8)
    new.commit(tokens(200, 8))
    new.close()
    p = mgr.storage.pages
    grow = active(mgr)
    grown = grow.resize.with_plan(12)  # 3 pages: both low-priority blocks, then old's deepest
    assert grown.value and grown.plan.offloaded_pages == 3
    victims = grown.plan.copies[0].src_slots
    gpu_alloc = mgr.storage.allocators[1][0]
    moved = gpu_alloc.slot_to_page[grown.plan.copies[0].dst_slots]
    assert p.priority[moved].tolist() == [10, 10, 35]
    assert p.depth[moved].tolist() == [1, 0, 1]  # deeper block before its prefix
    assert victims.size == 3
    grow.close()
    check_invariants(mgr)


def test_last_level_drops_droppable_pages_but_never_held_ones():
    mgr = KVCacheManager(small_config(gpu_pages=2, host_pages=2))
    committed = active(mgr, capacity=8)
    committed.commit(tokens(0, 8))
    committed.close()  # 2 droppable pages on the GPU
    held = active(mgr, capacity=8)  # offloads the 2 committed pages to the host
    held.suspend()
    third = active(mgr)
    grown = third.resize.with_plan(8)  # offloads held's 2 pages; the host must drop 2
    assert grown.value
    plan = grown.plan
    assert plan.counts.pages_dropped == 2
    assert mgr.probe_reuse(tokens(0, 8)) == 0
    third.suspend()
    # Now the host holds only HELD pages: nothing more can go there.
    fourth = mgr.create_kv_cache()
    assert fourth.resume()
    before = fingerprint(mgr)
    assert fourth.resize(4) is False
    assert fingerprint(mgr) == before
    check_invariants(mgr)


def test_disk_level_cascade():
    mgr = KVCacheManager(small_config(gpu_pages=2, host_pages=2, disk_pages=4,
                                      max_util_for_resume=1.0))
    for i in range(3):
        c = active(mgr, capacity=8)
        c.commit(tokens(100 * i, 8))
        c.close()
    assert mgr.get_storage_statistics(2)[0]["total"] - mgr.get_storage_statistics(2)[0]["free"] == 2
    assert mgr.probe_reuse(tokens(0, 8)) == 8  # the oldest request now lives on disk
    c = mgr.create_kv_cache(tokens(0, 8))
    resumed = c.resume.with_plan()
    assert resumed.value and resumed.plan.onboarded_pages == 2
    assert {b.src_level for b in resumed.plan.copies if b.kind == "onboard"} == {2}
    check_invariants(mgr)


def test_resume_refused_above_max_util():
    """KVCM2's gate: the GPU's use (neither free nor evictable) above max_util_for_resume
    refuses any resume, before what the cache itself needs is looked at."""
    mgr = KVCacheManager(small_config(gpu_pages=10, max_util_for_resume=0.5))
    a = active(mgr, capacity=24)  # 6 of 10 pages LOCKED
    b = mgr.create_kv_cache()  # needs no page at all
    before = fingerprint(mgr)
    assert b.resume() is False  # 6 / 10 > 0.5
    assert b.status is CacheStatus.SUSPENDED
    assert fingerprint(mgr) == before
    a.suspend()  # held pages of a suspended cache are evictable (to the host)
    assert b.resume()


def test_oversized_request_raises_out_of_pages(mgr):
    cache = active(mgr)
    with pytest.raises(OutOfPagesError):
        cache.capacity = 10_000


# -- manager-wide -------------------------------------------------------------------------------

def test_manager_resize_requires_all_suspended_and_evicts_when_shrinking():
    mgr = KVCacheManager(small_config(gpu_pages=8, host_pages=8, max_util_for_resume=1.0))
    a = active(mgr, capacity=16)
    b = active(mgr, capacity=16)
    before = fingerprint(mgr)
    with pytest.raises(InvalidStateError, match="needs every cache SUSPENDED"):
        mgr.resize(0, 4 * 4096)
    assert fingerprint(mgr) == before
    a.suspend()
    b.suspend()
    shrunk = mgr.resize.with_plan(0, 4 * 4096)
    assert shrunk.value
    assert mgr.get_quota(0) == 4 * 4096
    assert shrunk.plan.offloaded_pages == 4
    assert gpu(mgr)["total"] == 4
    check_invariants(mgr)
    assert a.resume()  # after shrinking only one cache can resume
    assert b.resume() is False
    check_invariants(mgr)


def test_manager_resize_refuses_when_held_pages_cannot_move():
    mgr = KVCacheManager(small_config(gpu_pages=4, host_pages=2))
    a = active(mgr, capacity=16)
    a.suspend()
    before = fingerprint(mgr)
    assert mgr.resize(0, 0) is False  # 4 HELD pages, host has room for 2
    assert fingerprint(mgr) == before
    with pytest.raises(InvalidArgumentError, match="cache_level"):
        mgr.resize(5, 0)
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        mgr.resize(0, -1)


def test_shutdown_and_clear_refuse_open_caches(mgr):
    c = active(mgr, capacity=8)
    c.commit(tokens(0, 8))
    before = fingerprint(mgr)
    with pytest.raises(CachesStillOpenError, match="1 KV cache\\(s\\) still open"):
        mgr.shutdown()
    with pytest.raises(CachesStillOpenError):
        mgr.clear_reusable_blocks()
    assert fingerprint(mgr) == before
    c.close()
    mgr.clear_reusable_blocks()
    assert mgr.probe_reuse(tokens(0, 8)) == 0
    assert gpu(mgr)["free"] == 16
    mgr.shutdown()
    with pytest.raises(InvalidStateError, match="shut down"):
        mgr.create_kv_cache()


def test_empty_roots_are_erased_only_from_exclusive_entry_points():
    mgr = KVCacheManager(small_config(gpu_pages=2, host_pages=2))
    c = active(mgr, capacity=8)
    c.commit(tokens(0, 8))
    c.close()
    held = []
    for _ in range(2):  # push the committed pages off the last level
        held.append(active(mgr, capacity=8))
        held[-1].suspend()
    assert DEFAULT_SCOPE in mgr.tree.pending_root_erasures and DEFAULT_SCOPE in mgr.tree.roots
    before = fingerprint(mgr)
    assert mgr.probe_reuse(tokens(0, 8)) == 0
    assert fingerprint(mgr) == before  # a probe never drains the queue
    created = mgr.create_kv_cache.with_plan()
    _kept = created.value  # held: dropping it would close it at once
    assert DEFAULT_SCOPE not in mgr.tree.roots and not mgr.tree.pending_root_erasures
    assert created.plan.counts.roots_erased == 1


def test_iteration_stats_count_offloads_and_reset():
    mgr = KVCacheManager(small_config(gpu_pages=4, host_pages=8))
    a = active(mgr, capacity=16)
    a.suspend()
    b = active(mgr, capacity=16)
    lc = mgr.get_and_reset_iteration_stats()["life_cycles"][0]
    assert lc["offload_blocks"] == 4  # migrations count at once
    assert lc["alloc_new_blocks"] == 0  # allocations wait for the caches to publish them
    a.commit_pending_stats()
    b.commit_pending_stats()
    stats = mgr.get_and_reset_iteration_stats()
    lc = stats["life_cycles"][0]
    assert lc["offload_blocks"] == 0 and lc["alloc_new_blocks"] == 8 and lc["missed_blocks"] == 8
    assert stats["levels"][0][0]["peak_unavailable_blocks"] == 4
    assert mgr.get_and_reset_iteration_stats()["life_cycles"][0]["offload_blocks"] == 0


@pytest.mark.parametrize("stats_commit", ["per_batch", "per_page"])
def test_stats_commit_modes_count_the_same_but_commit_differently(stats_commit):
    mgr = KVCacheManager(small_config(gpu_pages=4, host_pages=8, stats_commit=stats_commit))
    a = active(mgr, capacity=16)
    a.suspend()
    b = mgr.create_kv_cache()
    assert b.resume()
    grown = b.resize.with_plan(16)
    assert grown.value
    commits = grown.plan.counts.stats_commits
    lc = mgr.get_and_reset_iteration_stats()["life_cycles"][0]
    assert lc["offload_blocks"] == 4
    # one commit for the offload batch (or one per page); the allocation stays pending
    assert commits == (1 if stats_commit == "per_batch" else 4)


def test_event_sink_sees_stored_blocks():
    events = []
    mgr = KVCacheManager(small_config(), event_sink=events.append)
    c = active(mgr, capacity=8)
    committed = c.commit.with_plan(tokens(0, 8))
    assert [e["type"] for e in events] == ["stored", "stored"]
    assert committed.plan.counts.events_emitted == 2


def test_a_raising_sink_puts_back_a_tree_deeper_than_pythons_stack():
    # The snapshot taken for the sink deep-copied the tree with copy.deepcopy, whose recursion
    # follows a chain one level per block: every mutating call failed with RecursionError once
    # a prompt of a few hundred blocks was committed.
    raising = []

    def sink(event: dict) -> None:
        if raising:
            raise RuntimeError("sink down")

    blocks = 3 * 1000  # three times the default recursion limit
    mgr = KVCacheManager(small_config(gpu_pages=blocks + 8), event_sink=sink)
    c = active(mgr, capacity=4 * blocks)
    c.commit(tokens(0, 4 * blocks))
    check_invariants(mgr)
    before = fingerprint(mgr)
    raising.append(True)
    c.resize(4 * blocks + 4)  # no event: the sink is not called
    grown = fingerprint(mgr)
    assert grown != before
    with pytest.raises(RuntimeError, match="sink down"):
        c.commit(tokens(4 * blocks, 4))  # one stored block: an event, the sink raises
    assert fingerprint(mgr) == grown
    check_invariants(mgr)
    assert mgr.probe_reuse(tokens(0, 4 * blocks)) == 4 * blocks
    raising.clear()
    c.commit(tokens(4 * blocks, 4))
    assert mgr.probe_reuse(tokens(0, 4 * blocks + 4)) == 4 * blocks + 4


def test_bad_priority_callback_value_is_rejected_and_changes_nothing(mgr):
    cache = active(mgr, priority_callback=lambda block, lc: 101)
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match="priority callback returned 101"):
        cache.resize(8)
    assert fingerprint(mgr) == before


def test_destructor_closes_the_cache(mgr):
    cache = active(mgr, capacity=8)
    del cache
    assert mgr.num_open_caches == 0
    assert gpu(mgr)["free"] == 16


def test_lock_table_declares_every_public_call():
    """Every public call of the manager and its handles has an entry in the API table (with its
    lock mode), and every API's invocation names a public call."""
    from kvsim.manager import KvCache, PlannedDrop
    from kvsim.manager.calls import PublicCall
    from kvsim.runtime.apis import LABELS, Api, LockMode, UnknownApiError, lock_mode

    calls = {v.name for cls in (KVCacheManager, KvCache, PlannedDrop)
             for v in vars(cls).values() if isinstance(v, PublicCall)}
    assert calls == {api.plan_api for api in Api if api.mode is not LockMode.NONE}
    assert calls <= LABELS
    assert lock_mode("KVCacheManager.probe_reuse") is LockMode.SHARED
    assert lock_mode("KvCache.resize") is LockMode.EXCLUSIVE
    assert Api.named("KvCache.capacity.setter").plan_api == "KvCache.resize"
    with pytest.raises(UnknownApiError, match="unknown API 'nope'"):
        lock_mode("nope")


def test_pages_are_numpy_rows_not_objects():
    mgr = KVCacheManager(small_config(gpu_pages=64))
    c = active(mgr, capacity=200)
    assert isinstance(c.page_ids(0), np.ndarray)
    assert mgr.storage.pages.num_live == 50


def test_a_failing_priority_callback_during_partial_reuse_changes_nothing():
    # Found by the stateful tests: references were taken before the callback was asked. The
    # partial block's private copy is made at the first resume: that is where it is asked.
    mgr = KVCacheManager(small_config(gpu_pages=16, host_pages=16, partial_reuse=True))
    a = active(mgr, capacity=12)
    a.commit(tokens(1, 12))
    a.close()
    b = mgr.create_kv_cache(tokens(1, 9), priority_callback=lambda block, lc: 101)
    assert b.num_committed_tokens == 9
    before = fingerprint(mgr)
    with pytest.raises(InvalidArgumentError, match="priority callback returned 101"):
        b.resume()
    assert fingerprint(mgr) == before
    check_invariants(mgr)


def test_committing_after_the_tail_block_left_the_tree_reattaches_it():
    # Found by the stateful tests: a's last committed block lost its node (its page was
    # replaced by b's, then dropped), and a's next block hung from the removed node.
    mgr = KVCacheManager(small_config(gpu_pages=4, host_pages=2, max_util_for_resume=1.0))
    a, b = mgr.create_kv_cache(), mgr.create_kv_cache()
    assert a.resume() and a.resize(4)
    a.commit(tokens(1, 4))
    a.suspend()
    assert b.resume() and b.resize(16)  # a's held page goes to the host
    b.commit(tokens(1, 4))  # the node takes b's GPU page; a's copy is no longer committed
    b.close()
    c = active(mgr, capacity=16)
    c.commit([9, 9, 9, 9])
    c.close()
    d = active(mgr, capacity=16)  # the host drops the node's page: the node is removed
    d.close()
    assert a.resume() and a.resize(8)
    a.commit(tokens(5, 4))
    check_invariants(mgr)
    assert mgr.probe_reuse(tokens(1, 8)) == 8


def test_a_remembered_walk_is_forgotten_when_the_tree_changes():
    # probe_reuse remembers the walk of a prompt (RadixTree._walks) until a node is added or
    # removed: each probe below must see the tree as it is after the call before it.
    mgr = KVCacheManager(small_config(gpu_pages=8, host_pages=1, partial_reuse=False))

    def probe(n: int) -> int:
        """Tokens reused; the answer and the work counted are a fresh walk's."""
        remembered = mgr.probe_reuse.with_plan(tokens(0, n))
        mgr.tree._walks.clear()
        fresh = mgr.probe_reuse.with_plan(tokens(0, n))
        assert (remembered.value, remembered.plan.counts) == (fresh.value, fresh.plan.counts)
        return fresh.value

    keep = active(mgr, capacity=8)
    keep.commit(tokens(100, 8))  # stays open: its blocks keep the scope's root in the tree
    first = active(mgr, capacity=16)
    first.commit(tokens(0, 16))
    first.close()
    assert probe(24) == 16
    longer = active(mgr, capacity=24, toks=tokens(0, 24))
    longer.commit(tokens(16, 8))  # two more blocks (RadixTree.add_chain)
    assert probe(24) == 24
    longer.close()
    big = active(mgr, capacity=24)  # evicts the closed blocks: most leave the tree (_detach)
    assert probe(24) == 4
    big.close()
    tail = active(mgr, capacity=6)
    tail.commit(tokens(0, 4))
    assert probe(6) == 4
    tail.commit(tokens(4, 2))
    tail.stop_committing()  # commits the partial block (RadixTree.add_node)
    assert probe(6) == 6


def test_reuse_tier_segments_merge_equal_levels_block_by_block():
    """``_tier_segments`` (one numpy pass) against its definition, block by block: a block holds
    ``min(tokens_per_block, history - its first token)`` tokens; neighbours loaded from the same
    level (or from none, -1 -> None) share a run. Random levels, lengths and histories, short
    and past the blocks too."""
    from kvsim.manager.kv_cache import _tier_segments

    def by_blocks(levels: list[int], history: int, tpb: int) -> list[tuple[int | None, int]]:
        runs: list[tuple[int | None, int]] = []
        for b, level in enumerate(levels):
            tier, n = (None if level < 0 else level), min(tpb, history - b * tpb)
            if runs and runs[-1][0] == tier:
                runs[-1] = (tier, runs[-1][1] + n)
            else:
                runs.append((tier, n))
        return runs

    rng = np.random.default_rng(5)
    for _ in range(3000):
        levels = rng.integers(-1, 3, int(rng.integers(0, 12))).astype(np.int64)
        tpb = int(rng.integers(1, 5))
        history = int(rng.integers(0, levels.size * tpb + 3))
        got = _tier_segments(levels, history, tpb)
        assert got == by_blocks(levels.tolist(), history, tpb)
        assert all(type(n) is int and (t is None or type(t) is int) for t, n in got)
