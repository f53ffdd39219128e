"""A resize that only appends blocks (``KvCache._grow``) does what the general resize does.

The short way is taken when every life cycle is full attention and the cache has a page for
every block so far; these runs compare it with the general path call by call: the value, the
plan (counts, copies, events) and, at the end, the page table, the statistics and the tree.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config, tokens

from kvsim.manager import KVCacheManager
from kvsim.manager.kv_cache import KvCache


def _workload(mgr: KVCacheManager, seed: int, steps: int,
              priority_callback=None) -> list[tuple]:
    """Prefills and decode steps that share prefixes on a full GPU tier: what each call
    returned and planned."""
    rng = np.random.default_rng(seed)
    seen: list[tuple] = []
    caches = []

    def call(bound, *args):
        out = bound.with_plan(*args)
        plan = out.plan
        seen.append((plan.api, out.value, None if out.error is None else str(out.error),
                     plan.ok, plan.counts.to_dict(),
                     [(c.to_dict(), c.src_slots.tolist(), c.dst_slots.tolist()) for c in plan.copies]))
        return out.value

    for _ in range(steps):
        roll = rng.random()
        if roll < 0.3 or not caches:
            toks = tokens(int(rng.integers(0, 4)) * 1000, int(rng.integers(3, 30)))
            cache = mgr.create_kv_cache(input_tokens=toks, priority_callback=priority_callback)
            if call(cache.resume) and call(cache.resize, toks.size + int(rng.integers(0, 6))):
                call(cache.commit, toks[cache.num_committed_tokens:])
                caches.append(cache)
            else:
                call(cache.close)
        elif roll < 0.75:
            cache = caches[int(rng.integers(0, len(caches)))]
            if cache.status.name == "ACTIVE":
                grow = cache.capacity + int(rng.integers(1, 9))
                if call(cache.resize, grow, cache.num_committed_tokens):
                    call(cache.commit, tokens(int(rng.integers(0, 10**6)),
                                              grow - cache.num_committed_tokens))
            else:
                call(cache.resume)
        elif roll < 0.9:
            cache = caches[int(rng.integers(0, len(caches)))]
            if cache.status.name == "ACTIVE":
                call(cache.suspend)
        else:
            call(caches.pop(int(rng.integers(0, len(caches)))).close)
    return seen


def _state(mgr: KVCacheManager) -> tuple:
    snap = mgr.storage.pages.snapshot()
    return ({k: v.tolist() for k, v in snap.items()}, mgr.stats.committed(),
            sorted((n.node_id, n.depth, n.raw, tuple(n.pages)) for n in mgr.tree.nodes.values()))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("callback", [None, lambda block, lc: (block * 7) % 101])
def test_growing_by_appending_matches_the_general_resize(monkeypatch, seed, callback) -> None:
    runs = []
    for shortcut in (True, False):
        monkeypatch.setattr(KvCache, "grow_by_appending", shortcut)
        taken = []
        grow = KvCache._grow

        def counting_grow(self, *args, _grow=grow, _taken=taken):
            _taken.append(1)
            return _grow(self, *args)

        monkeypatch.setattr(KvCache, "_grow", counting_grow)
        mgr = KVCacheManager(small_config(gpu_pages=24, host_pages=40))
        calls = _workload(mgr, seed, 300, callback)
        runs.append((calls, _state(mgr), len(taken)))
    (calls_on, state_on, taken_on), (calls_off, state_off, taken_off) = runs
    assert taken_on > 50 and taken_off == 0  # the short way was taken, then never
    # some resizes found no room (the short way's refusal is compared too)
    assert any(api == "KvCache.resize" and value is False for api, value, *_ in calls_on)
    assert calls_on == calls_off
    assert state_on == state_off


def test_a_sliding_window_layout_takes_the_general_path(monkeypatch) -> None:
    taken = []
    monkeypatch.setattr(KvCache, "_grow", lambda self, *a: taken.append(1))
    mgr = KVCacheManager(small_config(window=8))
    cache = mgr.create_kv_cache(input_tokens=tokens(0, 4))
    assert cache.resume() and cache.resize(12)
    assert taken == [] and cache.num_blocks == 3
