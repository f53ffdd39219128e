"""Cache-only replay of a Mooncake trace: prefix-cache hit rate against cache capacity.

As in Mooncake's paper (FAST'25, Fig. 9), requests are sequential and instantaneous: no time, no
concurrency, no decode; only which prompt blocks are still cached when the next request arrives.
The cache is the real manager (:class:`~kvsim.manager.KVCacheManager`) configured by
:func:`cache_only_config`: one full-attention layer, ``tokens_per_block`` B, and a single level
(the GPU) of ``capacity_tokens // B`` slots, so making room drops committed blocks in the
manager's eviction order (least recently used first, leaves before their prefixes).

Per request, in trace order:

1. ``create_kv_cache(prompt)``: the cache adopts the reusable prefix, whose length (full blocks
   only: partial reuse is off) is the request's *reused* tokens;
2. ``resume()``, ``resize(input_length)``, ``commit(prompt beyond the prefix)``, ``close()``:
   every full block of the prompt enters the radix tree and stays reusable until evicted.

A request needing more blocks than the level has is only probed (``probe_reuse``, read-only): its
prompt counts in the input tokens and its reusable prefix in the reused tokens, but it caches
nothing and touches nothing (``oversized_requests`` counts them).

``hit_rate = reused_tokens / input_tokens``. :func:`max_hit_rate` computes the infinite-cache
value straight from the hash ids (a trie of id prefixes), without the manager; a replay with a
capacity of at least every prompt token gives the same figure (the tests check it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.traces.mooncake import BLOCK_TOKENS, MooncakeTrace, tokens_for

# Bytes do not matter here (only slot counts do): one byte per token keeps quotas readable.
_SLOT_BYTES_PER_TOKEN = 1

Progress = Callable[[str], None]


def cache_only_config(capacity_tokens: int, tokens_per_block: int = BLOCK_TOKENS) -> ManagerConfig:
    """One full-attention layer; one level of ``capacity_tokens // tokens_per_block`` slots."""
    for name, value in (("capacity_tokens", capacity_tokens), ("tokens_per_block", tokens_per_block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if capacity_tokens < tokens_per_block:
        raise ConfigError(f"capacity_tokens {capacity_tokens} holds no block of "
                          f"{tokens_per_block} tokens")
    page_bytes = tokens_per_block * _SLOT_BYTES_PER_TOKEN
    slots = capacity_tokens // tokens_per_block
    return ManagerConfig(
        layers=(LayerConfig(slot_bytes=(page_bytes,)),),
        levels=(LevelConfig("gpu", slots * page_bytes),),
        tokens_per_block=tokens_per_block,
        # Sequential requests: the only locked pages are the current request's, which must
        # fit; the 0.97 headroom of a serving engine would only refuse near-full requests.
        max_util_for_resume=1.0,
        enable_stats=False,  # not read here; the hit rate is counted by the replay itself
    )


@dataclass(frozen=True)
class CacheReplayResult:
    capacity_tokens: int
    tokens_per_block: int
    capacity_blocks: int
    requests: int
    input_tokens: int
    reused_tokens: int
    oversized_requests: int  # needed more blocks than the cache has: probed only
    dropped_blocks: int  # committed blocks evicted (dropped) to make room

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.input_tokens if self.input_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "capacity_tokens": self.capacity_tokens,
            "input_tokens": self.input_tokens,
            "reused_tokens": self.reused_tokens,
            "hit_rate": self.hit_rate,
            "tokens_per_block": self.tokens_per_block,
            "capacity_blocks": self.capacity_blocks,
            "requests": self.requests,
            "oversized_requests": self.oversized_requests,
            "dropped_blocks": self.dropped_blocks,
        }


class ReplayBug(RuntimeError):
    """A call that cannot fail in a cache-only replay failed: a bug in the manager or here."""


def replay_cache(trace: MooncakeTrace, capacity_tokens: int, tokens_per_block: int = BLOCK_TOKENS,
                 progress: Progress | None = None, progress_every_s: float = 2.0,
                 manager: KVCacheManager | None = None) -> CacheReplayResult:
    """Replay ``trace`` through a manager of ``capacity_tokens``; see the module docstring.

    ``progress`` (if given) receives a line every ``progress_every_s`` seconds. ``manager``
    overrides the one built from :func:`cache_only_config` (tests use it to look inside).
    """
    config = cache_only_config(capacity_tokens, tokens_per_block)
    mgr = manager if manager is not None else KVCacheManager(config)
    tpb = mgr.layout.tokens_per_block
    slots = mgr.layout.level_slots[0][0]
    input_tokens = reused_tokens = oversized = dropped = 0
    n = len(trace.requests)
    next_report = time.perf_counter() + progress_every_s
    for i, req in enumerate(trace.requests):
        prompt = tokens_for(req)
        input_tokens += req.input_length
        if math.ceil(req.input_length / tpb) > slots:
            oversized += 1
            reused_tokens += mgr.probe_reuse(prompt)
            continue
        cache = mgr.create_kv_cache(prompt)
        matched = cache.num_committed_tokens
        reused_tokens += matched
        if not cache.resume():
            raise ReplayBug(f"{trace.path}:{req.line}: resume() refused a {matched}-token "
                            f"prefix on a {slots}-slot cache with nothing else locked")
        grown = cache.resize.with_plan(req.input_length)
        if grown.error is not None:
            raise grown.error
        if not grown.value:
            raise ReplayBug(f"{trace.path}:{req.line}: resize({req.input_length}) ran out of "
                            f"pages on a {slots}-slot cache with nothing else locked")
        dropped += grown.plan.counts.pages_dropped
        if matched < req.input_length:
            cache.commit(prompt[matched:])
        cache.close()
        if progress is not None and time.perf_counter() >= next_report:
            next_report = time.perf_counter() + progress_every_s
            progress(f"capacity {capacity_tokens} tokens: {i + 1}/{n} requests, "
                     f"hit rate so far {reused_tokens / input_tokens if input_tokens else 0:.4f}")
    return CacheReplayResult(capacity_tokens, tpb, slots, n, input_tokens, reused_tokens,
                             oversized, dropped)


def max_reuse(trace: MooncakeTrace, tokens_per_block: int = BLOCK_TOKENS) -> tuple[int, int]:
    """``(reused_tokens, input_tokens)`` of an infinite cache, from the hash ids alone.

    A trie over hash-id prefixes remembers, per node (a 512-token block after a given prefix),
    how many of the block's tokens some earlier request committed (its prompt's full
    ``tokens_per_block`` blocks only). A request reuses the longest prefix that earlier commits
    cover, rounded down to whole blocks. Blocks without a hash id are never shared.
    """
    B = tokens_per_block
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise ConfigError(f"tokens_per_block must be an integer >= 1, got {B!r}")
    child: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node; the root is -1
    covered: list[int] = []  # node -> tokens of its block committed by some earlier request
    reused = total = 0
    for req in trace.requests:
        length = req.input_length
        total += length
        matched, parent = 0, -1
        for k, h in enumerate(req.hash_ids):
            node = child.get((parent, h))
            if node is None:
                break
            own = min(BLOCK_TOKENS, length - k * BLOCK_TOKENS)
            t = min(covered[node], own)
            matched += t
            if t < BLOCK_TOKENS:
                break
            parent = node
        reused += matched // B * B
        committed = length // B * B
        parent = -1
        for k, h in enumerate(req.hash_ids):
            mine = max(0, min(BLOCK_TOKENS, committed - k * BLOCK_TOKENS))
            if mine == 0:
                break
            key = (parent, h)
            node = child.get(key)
            if node is None:
                node = child[key] = len(covered)
                covered.append(mine)
            elif mine > covered[node]:
                covered[node] = mine
            if mine < BLOCK_TOKENS:
                break
            parent = node
    return reused, total


def max_hit_rate(trace: MooncakeTrace, tokens_per_block: int = BLOCK_TOKENS) -> float:
    """The infinite-cache hit rate (see :func:`max_reuse`)."""
    reused, total = max_reuse(trace, tokens_per_block)
    return reused / total if total else 0.0


def capacity_curve(trace: MooncakeTrace, capacities: Sequence[int],
                   tokens_per_block: int = BLOCK_TOKENS,
                   progress: Progress | None = None) -> dict:
    """The ``--json`` object of ``kvsim replay-cache``: one result per capacity, and the max."""
    results = []
    for capacity in capacities:
        t0 = time.perf_counter()
        result = replay_cache(trace, capacity, tokens_per_block, progress)
        if progress is not None:
            progress(f"capacity {capacity} tokens: {result.requests} requests in "
                     f"{time.perf_counter() - t0:.2f} s, hit rate {result.hit_rate:.4f}")
        results.append(result.to_dict())
    return {"results": results, "max_hit_rate": max_hit_rate(trace, tokens_per_block)}
