"""The eviction index picks exactly the victims a full scan picks, and the check that says so
can fail.

``tests/conftest.py`` turns on ``Storage.check_eviction_index`` (every selection compared with a
full scan) and shrinks the reservoirs to 3 pages, so every manager test exercises the index.
These tests add a long random workload on a bigger tier, where the reservoir's bound decides most
selections, and show that an unreported change is caught.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO, production_eviction_index, small_config, tokens

from kvsim.manager import KVCacheManager, eviction_index
from kvsim.manager.plan import Plan
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import execute


def _churn(mgr: KVCacheManager, rng: np.random.Generator, steps: int) -> None:
    """Requests that share prefixes, grow, suspend, resume and close, on a full GPU tier."""
    open_caches = []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.35 or not open_caches:
            prefix = int(rng.integers(0, 6)) * 1000
            toks = tokens(prefix, int(rng.integers(4, 40)))
            cache = mgr.create_kv_cache(input_tokens=toks)
            if cache.resume() and cache.resize(toks.size + 8):
                cache.commit(toks[cache.num_committed_tokens:])  # past the reused prefix
                open_caches.append(cache)
            else:
                cache.close()
        elif roll < 0.6:
            cache = open_caches[int(rng.integers(0, len(open_caches)))]
            if cache.status.name == "ACTIVE":
                grow = cache.capacity + int(rng.integers(1, 12))
                if cache.resize(grow):
                    cache.commit(tokens(int(rng.integers(0, 10**6)), grow - cache.num_committed_tokens))
        elif roll < 0.8:
            cache = open_caches[int(rng.integers(0, len(open_caches)))]
            if cache.status.name == "ACTIVE":
                cache.suspend()
            else:
                cache.resume()
        else:
            cache = open_caches.pop(int(rng.integers(0, len(open_caches))))
            cache.close()


def test_index_matches_full_scans_over_a_long_random_workload() -> None:
    mgr = KVCacheManager(small_config(gpu_pages=64, host_pages=96))
    _churn(mgr, np.random.default_rng(11), 600)  # every selection is checked (conftest)
    index = mgr.storage.index
    assert index.selections > 100
    # Most selections were answered from a reservoir, not by a full scan.
    assert 0 < index.rebuilds < index.selections / 2


def test_index_matches_full_scans_at_production_sizes_on_the_timed_mooncake_replay(monkeypatch):
    """The shipped timed replay's first 600 requests, with a smaller host tier so both tiers
    evict, at the production reservoir sizes (4096 pages, a bound on a 93,750-page GPU tier):
    every selection is checked against a full scan, and a mismatch raises out of the run."""
    seen: list[tuple[int, bool]] = []  # (level, answered without a rebuild)
    select, rebuild = eviction_index.EvictionIndex.select, eviction_index.EvictionIndex._rebuild

    def counting_select(self, level, group, n):
        seen.append((level, True))
        return select(self, level, group, n)

    def counting_rebuild(self, level, group, n):
        seen[-1] = (level, False)
        return rebuild(self, level, group, n)

    monkeypatch.setattr(eviction_index.EvictionIndex, "select", counting_select)
    monkeypatch.setattr(eviction_index.EvictionIndex, "_rebuild", counting_rebuild)
    scenario = load_scenario_file(REPO / "scenarios/traces/mooncake_timed.yaml",
                                  ["workload.max_requests=600",
                                   "manager.levels.1.quota_bytes=1000000 KiB"]).base
    with production_eviction_index(check=True):
        assert eviction_index.RESERVOIR_PAGES == 4096
        result = execute(scenario)
    assert result["api"]["KvCache.close"]["count"] == 600  # every request ran to its end
    levels = {level for level, _ in seen}
    from_reservoir = sum(kept for _, kept in seen)
    assert levels == {0, 1}
    assert 0 < len(seen) - from_reservoir < from_reservoir  # rebuilds, and mostly not


def test_an_unreported_change_is_caught_by_the_check() -> None:
    """Make a page evictable behind the index's back: the selection differs from a full scan and
    the check raises, naming both answers."""
    mgr = KVCacheManager(small_config(gpu_pages=16, host_pages=32))
    a = mgr.create_kv_cache(input_tokens=tokens(0, 40))
    assert a.resume() and a.resize(40)
    a.commit(tokens(0, 40))
    a.suspend()  # 10 committed pages, held by a suspended cache: evictable
    storage = mgr.storage
    storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))  # builds
    b = mgr.create_kv_cache(input_tokens=tokens(500, 8))
    assert b.resume() and b.resize(8)
    b.commit(tokens(500, 8))  # 2 locked pages, not candidates
    storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))  # sees them
    page = int(b.held_pages()[0])
    storage.pages.lockers[page] = 0  # now HELD and evictable, with the newest tick: not reported
    storage.pages.last_used[page] = 0  # ... and the oldest tick, so it should go first
    with pytest.raises(AssertionError, match="eviction index"):
        storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))


@pytest.mark.parametrize("reported", [True, False])
def test_pages_locked_for_a_call_leave_the_reservoir_only_when_reported(reported) -> None:
    """A selection re-checks only the pages reported since the last one: pages of the reservoir
    that a call locks (``resume``, ``prefetch``) must be reported with ``Storage.locked`` before
    the call makes room. Reported, none of them is chosen and the selection agrees with a full
    scan; not reported, the index still offers them and the check says so."""
    mgr = KVCacheManager(small_config(gpu_pages=16, host_pages=32))
    a = mgr.create_kv_cache(input_tokens=tokens(0, 40))
    assert a.resume() and a.resize(40)
    a.commit(tokens(0, 40))
    a.suspend()  # 10 committed pages, held by a suspended cache: evictable
    b = mgr.create_kv_cache(input_tokens=tokens(500, 8))
    assert b.resume() and b.resize(8)
    b.commit(tokens(500, 8))
    b.suspend()  # 2 more, used after a's: they go after a's
    storage = mgr.storage
    storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))  # builds
    ours = a.held_pages()
    oldest = storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))
    assert int(oldest[0].victims[0]) in ours.tolist()  # the reservoir offers a's pages
    storage.pages.lockers[ours] += 1
    if reported:
        storage.locked(ours)
        steps = storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))
        assert set(steps[-1].victims.tolist()) <= set(b.held_pages().tolist())
    else:
        with pytest.raises(AssertionError, match="eviction index"):
            storage.plan_room(0, 0, storage.allocators[0][0].num_free + 1, Plan("probe"))
