"""Conformance: KVCM2's radix tree, branch reuse, probes, reuse scopes and tier attribution.

Cases from TensorRT-LLM's ``tests/unittest/kv_cache_manager_v2_tests/``:
``test_branch_reuse.py``, ``test_block_radix_tree.py``, ``test_block_radix_tree_stale_prune.py``,
``test_first_new_block_probe.py`` (its ``probe_reuse`` parts: kvsim has no block-key probe),
``test_kv_cache_salting.py`` and ``test_kv_cache_tier_attribution.py`` (version ff32d126, the
runtime-level one). KVCM2's unit tests that build tree blocks directly are re-expressed as API
sequences that leave the same tree.
"""

from __future__ import annotations

import numpy as np
import pytest
from kvcm2_setup import MiB, prepare, toks

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.manager.radix_tree import ReuseScope


def _gpu(mgr) -> dict:
    return mgr.get_storage_statistics(0)[0]


def _commit(mgr, tokens, scope=None, stop=True, close=True, priority=None):
    kv = mgr.create_kv_cache(tokens, scope, priority_callback=priority)
    assert kv.resume() and kv.resize(len(tokens))
    kv.commit(tokens[kv.num_committed_tokens:])
    if stop:
        kv.stop_committing()
    if close:
        kv.close()
    return kv


def _one_layer(tpb: int, gpu_slots: int, window: int | None = None, *more: LayerConfig):
    lays = (LayerConfig((4096,), window), *more)
    page = 4096
    gpu = LevelConfig("gpu", gpu_slots * page * len(lays))
    return KVCacheManager(ManagerConfig(layers=lays, levels=(gpu,), tokens_per_block=tpb))


# -- test_branch_reuse.py -------------------------------------------------------------------------

def test_partial_block_not_rebased():
    """KVCM2 ``test_branch_reuse.py::TestPartialBlockRebase::test_partial_block_not_rebased``:
    tokens_per_block 8, two full layers; A0 commits 13 tokens (a 5-token partial block) and stays
    open; A reuses 13, completes block 1 to 16 tokens (replacing A0's partial sibling); B reuses 12
    of the prefix and commits the 13th token: B's block 1 never shares a page with a tree page
    (the 5-token tail is covered by A's full block, so B stops committing and keeps its private
    page rather than rebasing)."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=8)
    prefix, extra = toks(0, 13), toks(100, 3)
    a0 = _commit(mgr, prefix, close=False)
    a = mgr.create_kv_cache(prefix + extra)
    assert a.num_committed_tokens == 13
    assert a.resume() and a.resize(16)
    a.commit(extra)
    a.stop_committing()
    b = mgr.create_kv_cache(prefix[:12])
    assert b.num_committed_tokens == 12
    assert b.resume() and b.resize(18)
    b.commit(prefix[12:13])
    before = [int(b.page_ids(lc)[1]) for lc in range(mgr.layout.num_life_cycles)]
    b.stop_committing()
    mine = [int(b.page_ids(lc)[1]) for lc in range(mgr.layout.num_life_cycles)]
    assert mine == before
    tree_pages = {pg for node in mgr.tree.nodes.values() for pg in node.pages}
    assert not set(mine) & tree_pages
    n_lc = mgr.layout.num_life_cycles
    assert not set(mine) & {int(a0.page_ids(lc)[1]) for lc in range(n_lc)}
    assert not set(mine) & {int(a.page_ids(lc)[1]) for lc in range(n_lc)}


def test_partial_tail_covered_by_a_longer_full_sibling_is_not_inserted():
    """Derived from ``test_branch_reuse.py`` and KVCM2's ``Block.__init__``: A commits 16 tokens
    (2 full blocks); B reuses 12, commits a 13th token and stops: its 5-token tail is covered by
    A's full block 1 and is not stored; after both close the GPU has 2 evictable pages per life
    cycle (A's) and the rest free, and probe of the 13 tokens is 13."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=8)
    t = toks(0, 16)
    a = _commit(mgr, t, close=False)
    b = mgr.create_kv_cache(t[:12])
    assert b.num_committed_tokens == 12
    assert b.resume() and b.resize(13)
    b.commit(t[12:13])
    b.stop_committing()
    a.close()
    b.close()
    stats = _gpu(mgr)
    assert stats["evictable"] == 2 * mgr.layout.num_life_cycles
    assert stats["free"] == stats["total"] - stats["evictable"]
    assert mgr.probe_reuse(t[:13]) == 13


# -- test_block_radix_tree.py: clear ---------------------------------------------------------------

def test_clear_empty_tree_returns():
    """KVCM2 ``test_block_radix_tree.py::TestBlockRadixTreeClear::test_clear_empty_tree_returns``:
    clearing an empty tree returns and leaves every slot free."""
    mgr = _one_layer(2, 16)
    mgr.clear_reusable_blocks()
    assert not mgr.tree.roots and _gpu(mgr)["free"] == 16


def test_clear_with_childless_root_returns():
    """KVCM2 ``...::test_clear_with_childless_root_returns`` (a root left without blocks once
    looped clear() forever): a window-4 layer of 3 GPU slots; 2 blocks committed with priorities
    1 and 2, then evicted by a growing cache; the emptied root waits in the erase queue, and
    clear_reusable_blocks returns with no root left."""
    mgr = _one_layer(4, 3, 4)
    _commit(mgr, toks(0, 8), priority=lambda block, lc: block + 1)
    kv = mgr.create_kv_cache(toks(100, 4))
    assert kv.resume() and kv.resize(4) and kv.resize(8) and kv.resize(12)
    kv.close()
    assert not any(root.num_nodes for root in mgr.tree.roots.values())
    mgr.clear_reusable_blocks()
    assert not mgr.tree.roots


def test_clear_removes_single_chain():
    """KVCM2 ``...::test_clear_removes_single_chain``: a chain of 3 blocks under scope (lora 0):
    after clear the probe is 0 and every slot is free."""
    mgr = _one_layer(2, 16)
    scope = ReuseScope(0, None)
    _commit(mgr, toks(0, 6), scope)
    mgr.clear_reusable_blocks()
    assert mgr.probe_reuse(toks(0, 6), scope) == 0 and _gpu(mgr)["free"] == 16


def test_clear_mixed_childless_and_populated_roots():
    """KVCM2 ``...::test_clear_mixed_childless_and_populated_roots``: scopes lora 1 (2 blocks),
    lora 2 (childless), lora 3 (4 blocks), lora 4 (childless): after clear the probes under 1 and
    3 are 0 and storage is free."""
    mgr = _one_layer(2, 32)
    _commit(mgr, toks(0, 4), ReuseScope(1))
    _commit(mgr, toks(0, 8), ReuseScope(3))
    for empty in (ReuseScope(2), ReuseScope(4)):
        mgr.tree.root_for(empty)  # a root with no block, as KVCM2's test builds
    mgr.clear_reusable_blocks()
    assert mgr.probe_reuse(toks(0, 4), ReuseScope(1)) == mgr.probe_reuse(toks(0, 8), ReuseScope(3)) == 0
    assert _gpu(mgr)["free"] == 32 and not mgr.tree.roots


def test_clear_removes_multi_branch_subtrees():
    """KVCM2 ``...::test_clear_removes_multi_branch_subtrees``: under scope A blocks [1,2] -> [3,4]
    and a sibling [5,6]; under scope B [9,10]: before clear the probes are 4, 2, 2; after, all 0
    and every slot free."""
    mgr = _one_layer(2, 16)
    a, b = ReuseScope(1), ReuseScope(2)
    _commit(mgr, [1, 2, 3, 4], a)
    _commit(mgr, [5, 6], a)
    _commit(mgr, [9, 10], b)
    assert (mgr.probe_reuse([1, 2, 3, 4], a), mgr.probe_reuse([5, 6], a),
            mgr.probe_reuse([9, 10], b)) == (4, 2, 2)
    mgr.clear_reusable_blocks()
    assert (mgr.probe_reuse([1, 2, 3, 4], a), mgr.probe_reuse([5, 6], a),
            mgr.probe_reuse([9, 10], b)) == (0, 0, 0)
    assert _gpu(mgr)["free"] == 16 and not mgr.tree.roots


def test_clear_is_idempotent_and_tree_reusable():
    """KVCM2 ``...::test_clear_is_idempotent_and_tree_reusable``: under scope (lora 5, salt 7) two
    blocks committed, cleared twice (the second a no-op); committing [1, 2] again under the same
    scope makes a fresh root, and its match is exactly 2 tokens; a last clear empties the tree."""
    mgr = _one_layer(2, 16)
    scope = ReuseScope(5, 7)
    _commit(mgr, [1, 2, 3, 4], scope)
    mgr.clear_reusable_blocks()
    mgr.clear_reusable_blocks()
    _commit(mgr, [1, 2], scope)
    assert mgr.probe_reuse([1, 2], scope) == 2
    mgr.clear_reusable_blocks()
    assert not mgr.tree.nodes


# -- test_block_radix_tree_stale_prune.py -----------------------------------------------------------

def test_tip_with_live_page_in_another_life_cycle_is_kept():
    """KVCM2 ``test_block_radix_tree_stale_prune.py::TestStaleTailPrune::test_tip_with_live_page_
    in_another_life_cycle_is_kept`` (API re-expression): a window-4 and a full layer, 12 tokens
    committed, the drop plan of the window page of block 2 applied: the tip block stays (it still
    holds its full-attention page): 59 GPU slots free and 5 evictable of 64; probe of the 12 tokens
    is 8 (the window at 12 needs block 2's page; at 8 block 1's, present) and so is probe of the
    first 8 plus 4 others."""
    mgr = KVCacheManager(ManagerConfig(
        layers=(LayerConfig((4096,), 4), LayerConfig((4096,))),
        levels=(LevelConfig("gpu", 64 * 4096),), tokens_per_block=4))
    t = toks(0, 12)
    kv = _commit(mgr, t, close=False)
    handle = kv.plan_committed_block_drop()
    kv.close()
    assert handle.drop() == 1
    stats = _gpu(mgr)
    assert (stats["free"], stats["evictable"]) == (59, 5)
    assert len(mgr.tree.nodes) == 3
    assert mgr.probe_reuse(t) == 8
    assert mgr.probe_reuse(t[:8] + toks(100, 4)) == 8


def test_tip_with_no_live_page_anywhere_is_pruned():
    """KVCM2 ``...::test_tip_with_no_live_page_anywhere_is_pruned`` (API re-expression): one
    window-4 layer on exactly 3 GPU slots; 8 tokens committed with priorities 1 (block 0) and 2
    (block 1); a new cache growing to 8 evicts block 0's page (block 0 stays, it has a child):
    probe of the 8 is 8, of the first 4 is 0; growing to 12 evicts block 1's page: the tip goes,
    then its emptied parent: the tree is empty, probe 0, GPU free 0, evictable 0, unavailable 3."""
    mgr = _one_layer(4, 3, 4)
    t = toks(0, 8)
    _commit(mgr, t, priority=lambda block, lc: block + 1)
    kv = mgr.create_kv_cache(toks(100, 4))
    assert kv.resume() and kv.resize(4) and kv.resize(8)
    assert mgr.probe_reuse(t) == 8 and mgr.probe_reuse(t[:4]) == 0
    assert kv.resize(12)
    assert not mgr.tree.nodes and mgr.probe_reuse(t) == 0
    stats = _gpu(mgr)
    assert (stats["free"], stats["evictable"], stats["unavailable"]) == (0, 0, 3)


def test_tip_keeps_when_only_the_unlinked_life_cycle_is_empty():
    """KVCM2 ``...::test_tip_keeps_when_only_the_unlinked_life_cycle_is_empty`` (API
    re-expression): window-4 and window-8 layers (2 life cycles, one pool group), 7 GPU slots; 12
    tokens committed with priority 1 for block 2 of the window-8 life cycle and 50 for the rest; a
    new cache growing to 4 evicts exactly that page: the tip stays (its window-4 page lives):
    probes of the 12 and of the first 8 are 8, GPU free 0, evictable 5."""
    mgr = KVCacheManager(ManagerConfig(
        layers=(LayerConfig((4096,), 4), LayerConfig((4096,), 8)),
        levels=(LevelConfig("gpu", 7 * 4096),), tokens_per_block=4))
    t = toks(0, 12)
    _commit(mgr, t, priority=lambda block, lc: 1 if (block, lc.index) == (2, 1) else 50)
    assert _gpu(mgr)["evictable"] == 6 and _gpu(mgr)["free"] == 1
    kv = mgr.create_kv_cache(toks(100, 4))
    assert kv.resume() and kv.resize(4)
    assert mgr.probe_reuse(t) == 8 and mgr.probe_reuse(t[:8]) == 8
    stats = _gpu(mgr)
    assert (stats["free"], stats["evictable"]) == (0, 5)


def test_dropping_a_full_attention_page_removes_the_subtree():
    """Derived from KVCM2's ``Block.clear_stale_blocks_after_page_unlink`` (full attention and
    sink blocks call ``remove_subtree``): one full layer on exactly 3 GPU slots; 12 tokens
    committed with priority 1 for block 0 and 90 for blocks 1 and 2; a new cache of one block
    evicts block 0's page, which takes blocks 1 and 2 out of the tree and frees their pages:
    GPU free 2, evictable 0, unavailable 1; probe of the 12 tokens 0; one host drop recorded (the
    evicted page only)."""
    mgr = _one_layer(4, 3)
    t = toks(0, 12)
    _commit(mgr, t, priority=lambda block, lc: 1 if block == 0 else 90)
    mgr.get_and_reset_iteration_stats()
    kv = mgr.create_kv_cache(toks(100, 4))
    assert kv.resume() and kv.resize(4)
    stats = _gpu(mgr)
    assert (stats["free"], stats["evictable"], stats["unavailable"]) == (2, 0, 1)
    assert mgr.probe_reuse(t) == 0 and not mgr.tree.nodes
    assert mgr.get_and_reset_iteration_stats()["life_cycles"][0]["host_dropped_blocks"] == 1


# -- test_first_new_block_probe.py (the probe_reuse parts) ------------------------------------------

@pytest.fixture(params=["full", "vswa"])
def probe_mgr(request):
    """tokens_per_block 4, two layers (both full, or window 4 on layer 0), GPU 16 MiB."""
    window = None if request.param == "full" else 4
    return prepare(16 * MiB, 0, 0, 2, window, 0, tokens_per_block=4)


def test_duplicates_collide_then_diverge_after_commit(probe_mgr):
    """KVCM2 ``test_first_new_block_probe.py::TestFirstNewBlockProbe(Vswa)::test_duplicates_
    collide_then_diverge_after_commit`` (its probe_reuse part): two prompts sharing 12 tokens;
    after the first is committed, probe_reuse of the second is 12."""
    first, second = toks(0, 12) + toks(100, 4), toks(0, 12) + toks(200, 4)
    assert probe_mgr.probe_reuse(second) == 0
    _commit(probe_mgr, first)
    assert probe_mgr.probe_reuse(second) == 12


def test_none_when_next_block_would_be_partial(probe_mgr):
    """KVCM2 ``...::test_none_when_next_block_would_be_partial`` (its probe_reuse part): after 8
    tokens are committed, probe_reuse of those 8 is 8."""
    _commit(probe_mgr, toks(0, 8))
    assert probe_mgr.probe_reuse(toks(0, 8)) == 8


def test_partial_match_hashes_the_query_suffix():
    """KVCM2 ``...::TestFirstNewBlockProbe::test_partial_match_hashes_the_query_suffix`` (full
    attention): 16 tokens committed; a query of the first s tokens followed by others probes s for
    every s in 0, 1, 3, 4, 5, 7, 8, 11 (the full-block walk, then the best partial match among the
    last matched block's children)."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=4)
    t = toks(0, 16)
    _commit(mgr, t)
    for s in (0, 1, 3, 4, 5, 7, 8, 11):
        assert mgr.probe_reuse(t[:s] + toks(100, 16 - s)) == s, s


def test_tree_removal_changes_the_probe(probe_mgr):
    """KVCM2 ``...::test_tree_removal_changes_the_probe`` (its probe_reuse part): 8 of 12 tokens
    committed: probe 8; after clear_reusable_blocks 0."""
    t = toks(0, 12)
    assert probe_mgr.probe_reuse(t) == 0
    _commit(probe_mgr, t[:8])
    assert probe_mgr.probe_reuse(t) == 8
    probe_mgr.clear_reusable_blocks()
    assert probe_mgr.probe_reuse(t) == 0


def test_int32_view_matches_list(probe_mgr):
    """KVCM2 ``...::test_int32_view_matches_list`` (its probe_reuse part): an int32 numpy view and
    a list of the same 16 tokens probe alike, before (0) and after 8 are committed (8)."""
    t = toks(0, 16)
    view = np.array(t, dtype=np.int32)
    assert probe_mgr.probe_reuse(view) == probe_mgr.probe_reuse(t) == 0
    _commit(probe_mgr, t[:8])
    assert probe_mgr.probe_reuse(view) == probe_mgr.probe_reuse(t) == 8


def test_window_pruning_precedes_key_selection():
    """KVCM2 ``...::TestFirstNewBlockProbeVswa::test_window_pruning_precedes_key_selection`` (its
    probe_reuse part, re-expressed: block 1 keeps its full-attention page and loses its window
    page through a planned drop): probe of those 8 tokens plus 8 others is 4: at 8 the window needs
    block 1, missing, so the match is cut to block 0, present."""
    mgr = prepare(16 * MiB, 0, 0, 2, 4, 0, tokens_per_block=4)
    t = toks(0, 8)
    kv = _commit(mgr, t, close=False)
    handle = kv.plan_committed_block_drop()
    kv.close()
    assert handle.drop() == 1
    assert mgr.probe_reuse(t + toks(100, 8)) == 4


@pytest.mark.parametrize("backoff, expected", [(1, 15), (4, 12), (5, 11), (16, 0)])
def test_backoff_uses_the_last_complete_matched_block(backoff, expected):
    """KVCM2 ``...::TestFirstNewBlockProbe::test_backoff_uses_the_last_complete_matched_block[1, 4,
    5, 16]`` (its probe_reuse part): 16 tokens committed under scope (lora 7, salt 1234) with
    reuse_match_backoff b: probe_reuse is 16 - b: 15, 12, 11, 0."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=4, reuse_match_backoff=backoff)
    scope = ReuseScope(7, 1234)
    t = toks(0, 16)
    kv = mgr.create_kv_cache(None, scope)
    assert kv.resume() and kv.resize(16)
    kv.commit(t)
    kv.close()
    assert mgr.probe_reuse(t, scope) == expected


# -- test_kv_cache_salting.py -----------------------------------------------------------------------

SCOPES = (ReuseScope(), ReuseScope(lora_id=0), ReuseScope(salt=0), ReuseScope(0, 0),
          ReuseScope(7, 11))


def test_reuse_scope_seeds_distinct_keys():
    """KVCM2 ``test_kv_cache_salting.py::TestReuseScope::test_reuse_scope_seeds_distinct_keys``
    (API level): ReuseScope(), (lora 0), (salt 0), (lora 0, salt 0), (7, 11) are five distinct
    scopes: tokens committed under one probe 0 under every other; committed under each, each
    root is independent. No scope is declared anywhere."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=2)
    for i, scope in enumerate(SCOPES):
        _commit(mgr, [1, 2], scope)
        for j, other in enumerate(SCOPES):
            assert mgr.probe_reuse([1, 2], other) == (2 if j <= i else 0), (scope, other)
    assert len(mgr.tree.roots) == len(SCOPES)


def test_blockchain_keys_are_seeded_by_reuse_scope():
    """KVCM2 ``...::test_blockchain_keys_are_seeded_by_reuse_scope`` (API equivalent: kvsim does
    not expose keys): tokens 1..4 under (7, 11) are reused under (7, 11) and not under (7, 12)."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=2)
    _commit(mgr, [1, 2, 3, 4], ReuseScope(7, 11))
    assert mgr.probe_reuse([1, 2, 3, 4], ReuseScope(7, 11)) == 4
    assert mgr.probe_reuse([1, 2, 3, 4], ReuseScope(7, 12)) == 0


def test_radix_tree_match_is_scoped():
    """KVCM2 ``...::test_radix_tree_match_is_scoped``: block [1, 2] under (7, 11): matched 2 under
    (7, 11), 0 under (7, 12), and a partial match of [1] under (7, 12) is 0 too (partial matching
    never crosses into another scope's root); under (7, 11) it is 1."""
    mgr = prepare(16 * MiB, 0, 0, 2, None, 0, tokens_per_block=2)
    _commit(mgr, [1, 2], ReuseScope(7, 11))
    assert mgr.probe_reuse([1, 2], ReuseScope(7, 11)) == 2
    assert mgr.probe_reuse([1, 2], ReuseScope(7, 12)) == 0
    assert mgr.probe_reuse([1], ReuseScope(7, 12)) == 0
    assert mgr.probe_reuse([1], ReuseScope(7, 11)) == 1


# -- test_kv_cache_tier_attribution.py (ff32d126) --------------------------------------------------

GPU, HOST = 0, 1


def _tier_manager(host_blocks: int = 16, window: int | None = None) -> KVCacheManager:
    """tokens_per_block 32, one layer of 1 MiB key and value buffers (2 MiB blocks), GPU 16
    blocks, host 16 (or none)."""
    levels = [LevelConfig("gpu", 16 * 2 * MiB)]
    if host_blocks:
        levels.append(LevelConfig("host", host_blocks * 2 * MiB))
    return KVCacheManager(ManagerConfig(layers=(LayerConfig((MiB, MiB), window),),
                                        levels=tuple(levels), tokens_per_block=32))


def _prime(mgr) -> list[int]:
    prompt = toks(0, 128)
    kv = mgr.create_kv_cache()
    assert kv.resume() and kv.resize(128)
    kv.commit(prompt)
    kv.commit_pending_stats()
    kv.close()
    mgr.get_and_reset_iteration_stats()
    return prompt


def _tiers(segments) -> dict:
    out: dict = {}
    for tier, n in segments:
        out[tier] = out.get(tier, 0) + n
    return out


def test_hits_on_gpu_resident_blocks_are_attributed_to_gpu():
    """KVCM2 ``test_kv_cache_tier_attribution.py::test_hits_on_gpu_resident_blocks_are_attributed_
    to_gpu``: 128 tokens primed; a lookup of them plus one token reuses 128, its segments sum to
    {GPU: 128}; the iteration's reused blocks are 4, all from the GPU (0 host, disk); committed
    reused blocks by level: GPU 4, host 0. The level is read from each page at match time."""
    mgr = _tier_manager()
    prompt = _prime(mgr)
    kv = mgr.create_kv_cache(prompt + [10000])
    assert kv.num_committed_tokens == 128
    assert _tiers(kv.reuse_tier_segments) == {GPU: 128}
    kv.commit_pending_stats()
    row = mgr.get_and_reset_iteration_stats()["life_cycles"][0]
    assert row["reused_blocks"] == 4 and row["reused_blocks_by_level"] == [4, 0]
    assert mgr.get_committed_stats()["life_cycles"][0]["reused_blocks_by_level"] == [4, 0]


def test_hits_served_from_host_are_attributed_to_host():
    """KVCM2 ``...::test_hits_served_from_host_are_attributed_to_host``: after the GPU is shrunk
    to 1 block (committed pages move to the host), a lookup reuses 128 with segments over {GPU,
    HOST}, host at least 96 tokens; reused 4 = GPU + host, host >= 3 and host x 32 = the host
    segment's tokens; committed by level equals the iteration's; after the GPU is grown back and
    the cache resumed, the onboarded blocks equal the host count."""
    mgr = _tier_manager()
    prompt = _prime(mgr)
    assert mgr.resize(0, 1 * 2 * MiB)
    kv = mgr.create_kv_cache(prompt + [10000])
    assert kv.num_committed_tokens == 128
    tiers = _tiers(kv.reuse_tier_segments)
    assert set(tiers) <= {GPU, HOST} and tiers[HOST] >= 96
    kv.commit_pending_stats()
    row = mgr.get_and_reset_iteration_stats()["life_cycles"][0]
    gpu, host = row["reused_blocks_by_level"]
    assert row["reused_blocks"] == 4 == gpu + host and host >= 3 and host * 32 == tiers[HOST]
    assert mgr.get_committed_stats()["life_cycles"][0]["reused_blocks_by_level"] == [gpu, host]
    assert mgr.resize(0, 16 * 2 * MiB)
    assert kv.resume()
    assert mgr.get_and_reset_iteration_stats()["life_cycles"][0]["onboard_blocks"] == host


def test_stale_sliding_window_blocks_are_attributed_to_none():
    """KVCM2 ``...::test_stale_sliding_window_blocks_are_attributed_to_none``: a window of 32
    (= tokens_per_block), no host: the lookup reuses 128; its segments are exactly GPU 32 and
    NONE 96 (stale blocks are loaded by no life cycle); the block counters count only the loaded
    block: reused 1, all from the GPU."""
    mgr = _tier_manager(host_blocks=0, window=32)
    prompt = _prime(mgr)
    kv = mgr.create_kv_cache(prompt + [10000])
    assert kv.num_committed_tokens == 128
    assert _tiers(kv.reuse_tier_segments) == {GPU: 32, None: 96}
    kv.commit_pending_stats()
    row = mgr.get_and_reset_iteration_stats()["life_cycles"][0]
    assert row["reused_blocks"] == 1 and row["reused_blocks_by_level"] == [1]
