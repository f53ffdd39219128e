"""Conformance: KVCM2's statistics (what counts as allocated, new, reused and missed, and when).

Cases from TensorRT-LLM's ``tests/unittest/kv_cache_manager_v2_tests/``:
``test_kv_cache_stats_behavior.py``, ``test_kv_cache_stats_life_cycles.py`` and
``test_kv_cache_stats_api.py``, re-expressed through kvsim's API (the wrapper calls of the
PyTorch executor translated into the runtime calls it makes). The last group derives cases from
KVCM2's implementation (``_core/_kv_cache.py``, ``_storage_manager.py``) where no test asserts the
rule. Set-up: :func:`kvcm2_setup.stats_manager` (4 tokens per block, 2 MiB blocks, a GPU of 4
blocks, partial reuse on, ``max_util_for_resume`` 1.0).
"""

from __future__ import annotations

from kvcm2_setup import MiB, committed, delta, iteration, stats_manager, toks

ZERO = (0, 0, 0, 0)


def _row_is_zero(row: dict) -> bool:
    return all(v == 0 or v == [0] * len(v) if isinstance(v, list) else v == 0
               for v in row.values())


def _context(mgr, prompt_len: int = 8):
    """A prompt of ``prompt_len`` tokens prefilled in one chunk: create with all but the last
    token (the wrapper's prepare_context), resume, resize, commit, stop_committing."""
    c = mgr.create_kv_cache(toks(0, prompt_len - 1))
    assert c.resume()
    assert c.resize(prompt_len)
    c.commit(toks(0, prompt_len))
    c.stop_committing()
    return c


def _warm_up(mgr, prompt_len: int):
    """A request that commits ``prompt_len`` tokens and leaves (its statistics discarded)."""
    c = _context(mgr, prompt_len)
    c.close()
    mgr.get_and_reset_iteration_stats()


# -- test_kv_cache_stats_behavior.py ----------------------------------------------------------

def test_stats_disabled_suppresses_v2_accounting():
    """KVCM2 ``test_kv_cache_stats_behavior.py::test_stats_disabled_suppresses_v2_accounting``:
    with enable_stats false nothing is recorded: the request delta is empty and the committed
    alloc_total, alloc_new, reused and missed are 0 (kvsim returns zero rows where KVCM2
    returns ``{}``)."""
    mgr = stats_manager(enable_stats=False)
    c = _context(mgr)
    assert delta(c.commit_pending_stats()) == ZERO
    assert _row_is_zero(iteration(mgr))
    assert committed(mgr) == ZERO


def test_context_and_generation_stats_are_reported():
    """KVCM2 ``...::test_context_and_generation_stats_are_reported``: context iteration
    alloc_total 2, alloc_new 2, reused 0, missed 2, gen_alloc 0, request delta (2, 2, 0, 2);
    generation iteration (resize to 9) 1/1, missed 0, gen_alloc 1, request (1, 1, 0, 0). A block
    allocated before the history reaches expected_prompt_length (7) is a miss."""
    mgr = stats_manager()
    c = _context(mgr)
    assert delta(c.commit_pending_stats()) == (2, 2, 0, 2)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["reused_blocks"],
            row["full_reused_blocks"], row["partial_reused_blocks"], row["missed_blocks"],
            row["gen_alloc_blocks"], row["intra_copy_blocks"]) == (2, 2, 0, 0, 0, 2, 0, 0)
    assert c.resize(9)
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 0)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["missed_blocks"],
            row["gen_alloc_blocks"]) == (1, 1, 0, 1)


def test_reverted_generation_allocation_does_not_report_stats():
    """KVCM2 ``...::test_reverted_generation_allocation_does_not_report_stats``: resize(9) then
    resize(8) (a generation step reverted) leaves every iteration field 0: shrinking takes back
    the still-pending allocation of the removed block."""
    mgr = stats_manager()
    c = _context(mgr)
    c.commit_pending_stats()
    mgr.get_and_reset_iteration_stats()
    assert c.resize(9) and c.resize(8)
    assert delta(c.commit_pending_stats()) == ZERO
    assert _row_is_zero(iteration(mgr))
    assert committed(mgr) == (2, 2, 0, 2)


def test_reverted_context_allocation_does_not_report_pending_stats():
    """KVCM2 ``...::test_reverted_context_allocation_does_not_report_pending_stats``: a prompt
    of 8 in chunks of 4. Chunk 1: 1/1/missed 1, request (1, 1, 0, 1). Chunk 2 grown to 8 and
    reverted (resize(4, 4), suspend): every field 0, no request delta, committed still
    (1, 1, 0, 1). Chunk 2 again: 1/1/missed 1, request (1, 1, 0, 1). A miss is counted per
    allocated block, not at create."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(4)
    c.commit(toks(0, 4))
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["missed_blocks"]) == (1, 1, 1)
    assert c.resize(8)
    assert c.resize(4, 4)
    c.suspend()
    assert delta(c.commit_pending_stats()) == ZERO
    assert _row_is_zero(iteration(mgr))
    assert committed(mgr) == (1, 1, 0, 1)
    assert c.resume() and c.resize(8)
    c.commit(toks(4, 4))
    c.stop_committing()
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    assert committed(mgr) == (2, 2, 0, 2)


def test_reverted_disagg_gen_init_allocation_does_not_report_pending_stats():
    """KVCM2 ``...::test_reverted_disagg_gen_init_allocation_does_not_report_pending_stats``:
    resize(8, 8) (the disaggregated generation side's set-up) then the free path
    (discard_pending_stats, close): every iteration field 0 and committed alloc_total, alloc_new
    and missed 0. close() and discard drop what is pending."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(8, 8)
    assert c.pending_stats["missed_blocks"] == 2  # judged before the resize: a miss
    c.discard_pending_stats()
    c.close()
    assert _row_is_zero(iteration(mgr))
    assert committed(mgr) == ZERO


def test_waited_context_allocation_reports_pending_stats_when_scheduled():
    """KVCM2 ``...::test_waited_context_allocation_reports_pending_stats_when_scheduled``: chunk
    1 gives 1/1/missed 1; a resize(8) that waits without committing, published, gives 1/1/missed
    1 and committed (2, 2, 0, 2); the chunk then committed after a no-op resize gives an empty
    delta. Pending statistics are published whenever commit_pending_stats runs."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(4)
    c.commit(toks(0, 4))
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    mgr.get_and_reset_iteration_stats()
    assert c.resize(8)
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["missed_blocks"]) == (1, 1, 1)
    assert committed(mgr) == (2, 2, 0, 2)
    assert c.resize(8)
    c.commit(toks(4, 4))
    c.stop_committing()
    assert delta(c.commit_pending_stats()) == ZERO
    assert _row_is_zero(iteration(mgr))


def test_chunked_context_reports_generation_alloc_only_in_generation():
    """KVCM2 ``...::test_chunked_context_reports_generation_alloc_only_in_generation``: chunk 1
    and chunk 2 each (1, 1, 0, 1) with gen_alloc 0 (the history is 4 < 7 when chunk 2 is
    allocated); the generation step (1, 1, 0, 0) with gen_alloc 1. Readiness is judged before
    the resize."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(4)
    c.commit(toks(0, 4))
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    assert iteration(mgr)["gen_alloc_blocks"] == 0
    assert c.resize(8)
    c.commit(toks(4, 4))
    c.stop_committing()
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 1)
    assert iteration(mgr)["gen_alloc_blocks"] == 0
    assert c.resize(9)
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 0)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["missed_blocks"], row["gen_alloc_blocks"]) == (1, 0, 1)


def test_all_reusable_policy_commits_each_context_chunk():
    """KVCM2 ``...::test_all_reusable_policy_commits_each_context_chunk``: committing a 4-token
    chunk gives num_committed_tokens 4 and history_length 4 (commit raises the history)."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(4)
    c.commit(toks(0, 4))
    assert (c.num_committed_tokens, c.history_length) == (4, 4)


def test_per_request_policy_delays_commit_until_last_context_chunk():
    """KVCM2 ``...::test_per_request_policy_delays_commit_until_last_context_chunk``: the history
    raised without committing: committed 0, history 4 after chunk 1; committed 8, history 8
    after the last chunk commits everything. (KVCM2 sets commit_min_snapshot for this policy;
    kvsim does not model that flag, and the values do not depend on it.)"""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 7))
    assert c.resume() and c.resize(4) and c.resize(4, 4)
    assert (c.num_committed_tokens, c.history_length) == (0, 4)
    assert c.resize(8) and c.resize(8, 8)
    c.commit(toks(0, 8))
    c.stop_committing()
    assert (c.num_committed_tokens, c.history_length) == (8, 8)


def test_per_request_policy_commits_partial_final_context_chunk():
    """KVCM2 ``...::test_per_request_policy_commits_partial_final_context_chunk``: a 6-token
    prompt committed in its last chunk: committed 6, history 6."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 5))
    assert c.resume() and c.resize(6) and c.resize(6, 6)
    c.commit(toks(0, 6))
    c.stop_committing()
    assert (c.num_committed_tokens, c.history_length) == (6, 6)


def test_v2_propagates_partial_reuse_config_off():
    """KVCM2 ``...::test_v2_propagates_partial_reuse_config[False-8]``: after a 12-token prompt,
    a 9-token one reuses 8 without partial reuse (whole blocks)."""
    mgr = stats_manager(partial_reuse=False)
    _warm_up(mgr, 12)
    assert mgr.create_kv_cache(toks(0, 9)).num_committed_tokens == 8


def test_v2_propagates_partial_reuse_config_on():
    """KVCM2 ``...::test_v2_propagates_partial_reuse_config[True-9]``: with partial reuse the
    same 9-token prompt reuses 9 (two blocks and one token of the third)."""
    mgr = stats_manager(partial_reuse=True)
    _warm_up(mgr, 12)
    assert mgr.create_kv_cache(toks(0, 9)).num_committed_tokens == 9


def test_v2_generation_alloc_updates_request_metrics_unlike_v1():
    """KVCM2 ``...::test_v2_generation_alloc_updates_request_metrics_unlike_v1``: context 2/2/
    missed 2, generation 1/1 with gen_alloc 1; the request's totals after generation are
    alloc_total 3, alloc_new 3, reused 0, missed 2 (V2 counts generation allocations in the
    request metrics), and the manager's committed statistics (3, 3, 0, 2)."""
    mgr = stats_manager()
    c = _context(mgr)
    total = [0, 0, 0, 0]
    for step in (c.commit_pending_stats(), (c.resize(9), c.commit_pending_stats())[1]):
        total = [a + b for a, b in zip(total, delta(step))]
    assert tuple(total) == (3, 3, 0, 2)
    assert committed(mgr) == (3, 3, 0, 2)


def test_v2_partial_prompt_reuse_classification_matches_v1():
    """KVCM2 ``...::test_v2_partial_prompt_reuse_classification_matches_v1``: after a 12-token
    prompt, a request matching 9 (create with 9 tokens), resumed, grown to 10 and committing
    one token: iteration alloc_total 1, alloc_new 1, reused 3, full 2, partial 1, missed 0,
    gen_alloc 0, intra-device copies 1 block and 2 MiB; request (1, 1, 3, 0). Reuse is counted at
    create and is no allocation; the private copy of the partial block, made at the first
    resume, is one (not a miss)."""
    mgr = stats_manager()
    _warm_up(mgr, 12)
    r = mgr.create_kv_cache(toks(0, 9))
    assert r.num_committed_tokens == 9
    created = iteration(mgr)
    assert created["alloc_total_blocks"] == created["reused_blocks"] == 0  # still pending
    assert r.resume() and r.resize(10)
    r.commit([9])
    r.stop_committing()
    assert delta(r.commit_pending_stats()) == (1, 1, 3, 0)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["reused_blocks"],
            row["full_reused_blocks"], row["partial_reused_blocks"], row["missed_blocks"],
            row["gen_alloc_blocks"], row["intra_copy_blocks"], row["intra_copy_bytes"]) == \
        (1, 1, 3, 2, 1, 0, 0, 1, 2 * MiB)


def test_block_reuse_disabled_records_generation_alloc():
    """KVCM2 ``...::test_block_reuse_disabled_records_generation_alloc``: without reuse (no input
    tokens, expected_prompt_length 7, stop_committing first): the context, resize(8) then
    resize(8, 8), is 2/2/missed 2, request (2, 2, 0, 2); the generation step (1, 1, 0, 0) with
    gen_alloc 1. Misses do not need reuse: every allocation before generation is one."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(expected_prompt_length=7)
    c.stop_committing()
    assert c.resume() and c.resize(8) and c.resize(8, 8)
    assert delta(c.commit_pending_stats()) == (2, 2, 0, 2)
    assert c.resize(9)
    assert delta(c.commit_pending_stats()) == (1, 1, 0, 0)
    assert iteration(mgr)["gen_alloc_blocks"] == 1


def test_v2_partial_leaf_reuse_counts_reuse_with_private_copy():
    """KVCM2 ``...::test_v2_partial_leaf_reuse_counts_reuse_with_private_copy``: a 9-token
    prompt committed (stop_committing commits the 1-token partial block [8]); a request for the
    same 9 tokens reuses 9; resumed, grown to 10, committing one token: alloc 1, new 1, reused 3,
    full 2, partial 1, missed 0, intra 1 block / 2 MiB, request (1, 1, 3, 0). The warm-up itself
    (from the rule, not asserted by KVCM2): 3/3/missed 3."""
    mgr = stats_manager()
    w = mgr.create_kv_cache(toks(0, 8))
    assert w.resume() and w.resize(9)
    w.commit(toks(0, 9))
    w.stop_committing()
    assert delta(w.commit_pending_stats()) == (3, 3, 0, 3)
    w.close()
    mgr.get_and_reset_iteration_stats()
    r = mgr.create_kv_cache(toks(0, 9))
    assert r.num_committed_tokens == 9
    assert r.resume() and r.resize(10)
    r.commit([9])
    r.stop_committing()
    assert delta(r.commit_pending_stats()) == (1, 1, 3, 0)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["reused_blocks"],
            row["full_reused_blocks"], row["partial_reused_blocks"], row["missed_blocks"],
            row["intra_copy_blocks"], row["intra_copy_bytes"]) == (1, 1, 3, 2, 1, 0, 1, 2 * MiB)


def test_swa_context_reuse_stats_skip_stale_prefix_blocks():
    """KVCM2 ``...::test_swa_context_reuse_stats_skip_stale_prefix_blocks``: one layer with a
    window of 8; a 16-token prompt committed; a request for its first 15 tokens reuses 15; its
    window statistics: alloc 1, new 1, reused 2, full 1, partial 1, missed 0, intra 1 / 2 MiB,
    request (1, 1, 2, 0). Blocks stale at the matched 15 tokens ([0, 2)) are neither held nor
    counted; the partial copy's slot is taken at resume, evicting (every GPU slot holds an
    evictable tree page)."""
    mgr = stats_manager(windows=(8,))
    _warm_up(mgr, 16)
    r = mgr.create_kv_cache(toks(0, 15))
    assert r.num_committed_tokens == 15
    assert mgr.get_storage_statistics(0)[0]["free"] == 0
    assert r.resume() and r.resize(16)
    r.commit([15])
    r.stop_committing()
    assert delta(r.commit_pending_stats()) == (1, 1, 2, 0)
    row = iteration(mgr)
    assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["reused_blocks"],
            row["full_reused_blocks"], row["partial_reused_blocks"], row["missed_blocks"],
            row["intra_copy_blocks"], row["intra_copy_bytes"]) == (1, 1, 2, 1, 1, 0, 1, 2 * MiB)


def test_pool_group_stats_are_reported():
    """KVCM2 ``...::test_pool_group_stats_are_reported``: a full-attention layer and a window-8
    layer share one pool group (GPU 16 MiB); an 8-token context gives each life cycle alloc 2,
    new 2, missed 2, so the pool group sums to alloc 4 and new 4 (KVCM2's wrapper re-aggregates
    per-life-cycle statistics; history 8 leaves no window-8 block stale)."""
    mgr = stats_manager(windows=(None, 8))
    assert len(mgr.layout.pool_groups) == 1 and mgr.layout.num_life_cycles == 2
    c = _context(mgr)
    c.commit_pending_stats()
    rows = mgr.get_and_reset_iteration_stats()["life_cycles"]
    for row in rows:
        assert (row["alloc_total_blocks"], row["alloc_new_blocks"], row["missed_blocks"]) == (2, 2, 2)
    assert sum(r["alloc_total_blocks"] for r in rows) == sum(r["alloc_new_blocks"] for r in rows) == 4


# -- test_kv_cache_stats_life_cycles.py -------------------------------------------------------

def _closed_request(mgr, start: int, n: int = 16) -> None:
    c = mgr.create_kv_cache(toks(start, n - 1))
    assert c.resume() and c.resize(n)
    c.commit(toks(start, n))
    c.close()


def test_offload_is_recorded_for_every_life_cycle_attn():
    """KVCM2 ``test_kv_cache_stats_life_cycles.py::test_offload_is_recorded_for_every_life_cycle
    [ATTN]`` (runtime equivalent): GPU 4 blocks, host 8; 16 committed tokens closed; a new cache
    growing to 8 tokens offloads 2 blocks, 4 MiB, recorded directly (nothing published)."""
    mgr = stats_manager(gpu_blocks=4, host_blocks=8)
    _closed_request(mgr, 0)
    mgr.get_and_reset_iteration_stats()
    x = mgr.create_kv_cache()
    assert x.resume() and x.resize(8)
    row = iteration(mgr)
    assert (row["offload_blocks"], row["offload_bytes"]) == (2, 4 * MiB)


def test_host_drop_is_recorded_for_every_life_cycle_attn():
    """KVCM2 ``...::test_host_drop_is_recorded_for_every_life_cycle[ATTN]`` (runtime equivalent):
    GPU 4, host 4; A's 16 tokens pushed to the host, then B's 16 committed; a cache growing to 16
    offloads 4 blocks (8 MiB) and drops A's 4 from the host (8 MiB): every page evicted from the
    last level inside a cache's make-room is a host drop."""
    mgr = stats_manager(gpu_blocks=4, host_blocks=4)
    _closed_request(mgr, 0)
    x = mgr.create_kv_cache()
    assert x.resume() and x.resize(16)
    x.close()
    _closed_request(mgr, 100)
    mgr.get_and_reset_iteration_stats()
    y = mgr.create_kv_cache()
    assert y.resume() and y.resize(16)
    row = iteration(mgr)
    assert (row["offload_blocks"], row["offload_bytes"]) == (4, 8 * MiB)
    assert (row["host_dropped_blocks"], row["host_dropped_bytes"]) == (4, 8 * MiB)


def test_onboard_counts_globally_only_for_attention():
    """KVCM2 ``...::test_onboard_counts_globally_only_for_attention`` (attention part): 2 full
    blocks matched on the host: create adds reused 2 / full 2 (pending) and nothing else; resume
    onboards 2 blocks (4 MiB) counting alloc_total 2 and alloc_new 2 directly; the committed
    statistics grow by alloc_total 2, alloc_new 2, reused 2."""
    mgr = stats_manager(gpu_blocks=4, host_blocks=8)
    _closed_request(mgr, 0)
    x = mgr.create_kv_cache()
    assert x.resume() and x.resize(16)
    x.close()
    mgr.get_and_reset_iteration_stats()
    before = committed(mgr)
    c = mgr.create_kv_cache(toks(0, 8))
    assert c.num_committed_tokens == 8
    assert c.pending_stats["reused_blocks"] == 2
    assert _row_is_zero(iteration(mgr))
    assert c.resume()
    c.commit_pending_stats()
    row = iteration(mgr)
    assert (row["onboard_blocks"], row["onboard_bytes"], row["alloc_total_blocks"],
            row["alloc_new_blocks"], row["reused_blocks"], row["full_reused_blocks"]) == \
        (2, 4 * MiB, 2, 2, 2, 2)
    after = committed(mgr)
    assert tuple(a - b for a, b in zip(after, before)) == (2, 2, 2, 0)


# -- test_kv_cache_stats_api.py ---------------------------------------------------------------

def _api_manager(enable_stats: bool):
    from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig

    return KVCacheManager(ManagerConfig(layers=(LayerConfig((4096,)),),
                                        levels=(LevelConfig("gpu", 4 * MiB),),
                                        tokens_per_block=4, enable_stats=enable_stats))


def test_manager_stats_config_and_api_disabled():
    """KVCM2 ``test_kv_cache_stats_api.py::test_manager_stats_config_and_api[False]``: committed
    statistics all zero, iteration empty, one peak entry per pool group with available,
    unavailable and evictable >= 0; commit_pending_stats on a fresh cache and after resize(8)
    returns an empty delta, and nothing is recorded."""
    mgr = _api_manager(False)
    assert committed(mgr) == ZERO
    stats = mgr.get_and_reset_iteration_stats()
    assert _row_is_zero(stats["life_cycles"][0])
    (peak,) = stats["levels"][0]
    assert min(peak.values()) >= 0
    c = mgr.create_kv_cache(cache_id=17, expected_prompt_length=8)
    assert delta(c.commit_pending_stats()) == ZERO
    assert c.resume() and c.resize(8)
    assert delta(c.commit_pending_stats()) == ZERO
    assert committed(mgr) == ZERO
    assert _row_is_zero(iteration(mgr))


def test_manager_stats_config_and_api_enabled():
    """KVCM2 ``...::test_manager_stats_config_and_api[True]``: after resume, resize(8),
    commit_pending_stats: the request's alloc_total > 0, the committed alloc_total > 0 and the
    iteration delta non-empty (by the rules 2/2 with missed 2, the history 0 < 8)."""
    mgr = _api_manager(True)
    c = mgr.create_kv_cache(cache_id=17, expected_prompt_length=8)
    assert delta(c.commit_pending_stats()) == ZERO
    assert c.resume() and c.resize(8)
    assert delta(c.commit_pending_stats()) == (2, 2, 0, 2)
    assert committed(mgr)[0] == 2
    assert not _row_is_zero(iteration(mgr))


# -- derived from KVCM2's implementation --------------------------------------------------------

def test_close_discards_pending_create_reuse():
    """Derived from KVCM2 ``_core/_kv_cache.py`` (``close`` discards first; the partial copy
    waits for ``resume``): a cache created over a 9-token match and closed unresumed leaves
    every statistic at 0."""
    mgr = stats_manager()
    _warm_up(mgr, 12)
    before = committed(mgr)
    r = mgr.create_kv_cache(toks(0, 9))
    assert r.num_committed_tokens == 9
    r.close()
    assert _row_is_zero(iteration(mgr))
    assert committed(mgr) == before


def test_missed_counts_allocated_blocks_not_input_blocks():
    """Derived (``_record_resize_pending_allocations``): an 8-token input grown to 9 and
    committed allocates 3 blocks before generation: alloc 3, new 3, missed 3 (not the 2 input
    blocks)."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 8))
    assert c.resume() and c.resize(9)
    c.commit(toks(0, 9))
    c.stop_committing()
    assert delta(c.commit_pending_stats()) == (3, 3, 0, 3)


def test_eviction_overflow_when_last_level_too_small():
    """Derived (``_storage_manager._prepare_free_slots``): GPU 4 blocks, host 2; 4 evictable
    committed GPU pages; growing a new cache to 16 succeeds: 2 pages move to the host (offload 2,
    4 MiB) and the other 2, which no cache holds, are dropped without being recorded."""
    mgr = stats_manager(gpu_blocks=4, host_blocks=2)
    _closed_request(mgr, 0)
    mgr.get_and_reset_iteration_stats()
    x = mgr.create_kv_cache()
    assert x.resume() and x.resize(16)
    row = iteration(mgr)
    assert (row["offload_blocks"], row["offload_bytes"], row["host_dropped_blocks"]) == \
        (2, 4 * MiB, 0)


def test_manager_resize_evictions_are_not_counted():
    """Derived (``adjust_cache_level`` runs without recorders): shrinking the GPU to 2 blocks
    with ``KVCacheManager.resize`` moves 2 committed pages to the host and records nothing."""
    mgr = stats_manager(gpu_blocks=4, host_blocks=8)
    _closed_request(mgr, 0)
    mgr.get_and_reset_iteration_stats()
    shrunk = mgr.resize.with_plan(0, 2 * 2 * MiB)
    assert shrunk.value and shrunk.plan.offloaded_pages == 2
    assert _row_is_zero(iteration(mgr))


def test_gpu_only_eviction_counts_as_host_drop():
    """Derived (``_record_dropped_pages``: "all last-level drops are host drops"): GPU 4 blocks,
    no other level; growing a new cache to 8 drops 2 committed pages: host_dropped 2, 4 MiB."""
    mgr = stats_manager(gpu_blocks=4)
    _closed_request(mgr, 0)
    mgr.get_and_reset_iteration_stats()
    x = mgr.create_kv_cache()
    assert x.resume() and x.resize(8)
    row = iteration(mgr)
    assert (row["host_dropped_blocks"], row["host_dropped_bytes"]) == (2, 4 * MiB)


def test_close_commits_partial_tail():
    """Derived (``_KVCache.close`` calls ``stop_committing``): 9 tokens committed and the cache
    closed without stop_committing: probe_reuse of 10 tokens finds all 9."""
    mgr = stats_manager()
    c = mgr.create_kv_cache(toks(0, 8))
    assert c.resume() and c.resize(9)
    c.commit(toks(0, 9))
    c.close()
    assert mgr.probe_reuse(toks(0, 10)) == 9
