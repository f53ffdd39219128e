"""Cache-only replay of a Mooncake trace: prefix-cache hit rate against cache capacity.

As in Mooncake's paper (FAST'25, Fig. 9), requests are sequential and instantaneous: no time, no
concurrency, no decode; only which prompt blocks are still cached when the next request arrives.
The cache is the manager (:class:`~kvsim.manager.KVCacheManager`) configured by
:func:`cache_only_config`: one full-attention layer, ``tokens_per_block`` B, and a single level
(the GPU) of ``capacity_tokens // B`` slots, so making room drops committed blocks in the
manager's eviction order (least recently used first, leaves before their prefixes). Two engines
run it: ``"manager"`` makes the calls below on a real manager; ``"lru"`` (the default,
:mod:`kvsim.replay.block_lru`) applies the same rules to a block map without the manager and
gives the same results (the tests compare the two) about four times faster.

Per request, in trace order:

1. ``create_kv_cache(prompt)``: the cache adopts the reusable prefix, whose length is the
   request's *reused* tokens. Partial reuse is off (reuse is counted in blocks, as the paper
   does), so the prefix is whole blocks, plus the prompt's last, partial block when a stored
   partial block holds exactly its tokens (KVCM2 finds that one by key);
2. ``resume()``, ``resize(input_length)``, ``commit(prompt beyond the prefix)``, ``close()``:
   every full block of the prompt enters the radix tree, and ``close()`` commits the partial
   last block too (KVCM2 does), unless a sibling already holds its tokens; a block that covers a
   shorter stored partial block replaces it. What entered stays reusable until evicted.

A request needing more slots than the level has is only probed (``probe_reuse``, read-only): its
prompt counts in the input tokens and its reusable prefix in the reused tokens, but it caches
nothing and touches nothing (``oversized_requests`` counts them). Its slots are its blocks, and
one more when it ends in a partial block: a matched partial block is copied into a private page
at ``resume()`` while the stored one stays held.

``hit_rate = reused_tokens / input_tokens``. :func:`max_hit_rate` computes the infinite-cache
value straight from the prompts, without the manager (a map of committed block prefixes and the
same sibling rules); a replay with a capacity of at least every request's slots gives the same
figure (the tests check it).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.manager.key_chains import chain_keys
from kvsim.replay.block_lru import OutOfRoom, lru_replay
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
        partial_reuse=False,  # reuse in blocks (see the module docstring)
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


ENGINES = ("lru", "manager")


def replay_cache(trace: MooncakeTrace, capacity_tokens: int, tokens_per_block: int = BLOCK_TOKENS,
                 progress: Progress | None = None, progress_every_s: float = 2.0,
                 manager: KVCacheManager | None = None, engine: str = "lru") -> CacheReplayResult:
    """Replay ``trace`` on a cache of ``capacity_tokens``; see the module docstring.

    ``engine``: ``"lru"`` (:mod:`kvsim.replay.block_lru`, the manager's rules without the
    manager: the same result, about four times faster) or ``"manager"`` (every call through a
    :class:`KVCacheManager`). ``progress`` (if given) receives a line every
    ``progress_every_s`` seconds. ``manager`` overrides the one built from
    :func:`cache_only_config` (tests use it to look inside; it implies ``"manager"``).
    """
    config = cache_only_config(capacity_tokens, tokens_per_block)
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if manager is None and engine == "lru":
        return _replay_lru(trace, capacity_tokens, tokens_per_block, progress, progress_every_s)
    mgr = manager if manager is not None else KVCacheManager(config)
    tpb = mgr.layout.tokens_per_block
    slots = mgr.layout.level_slots[0][0]
    input_tokens = reused_tokens = oversized = dropped = 0
    n = len(trace.requests)
    report = _reporter(progress, progress_every_s, capacity_tokens, n)
    for i, req in enumerate(trace.requests):
        prompt = tokens_for(req)
        input_tokens += req.input_length
        if request_slots(req.input_length, tpb) > slots:
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
        if report is not None:
            report(i, input_tokens, reused_tokens)
    return CacheReplayResult(capacity_tokens, tpb, slots, n, input_tokens, reused_tokens,
                             oversized, dropped)


def _reporter(progress: Progress | None, every_s: float, capacity_tokens: int,
              n: int) -> Callable[[int, int, int], None] | None:
    """``report(i, input tokens, reused tokens)`` after request ``i``: a line to ``progress`` at
    most every ``every_s`` seconds (None without ``progress``)."""
    if progress is None:
        return None
    next_report = time.perf_counter() + every_s

    def report(i: int, input_tokens: int, reused_tokens: int) -> None:
        nonlocal next_report
        if time.perf_counter() >= next_report:
            next_report = time.perf_counter() + every_s
            progress(f"capacity {capacity_tokens} tokens: {i + 1}/{n} requests, "
                     f"hit rate so far {reused_tokens / input_tokens if input_tokens else 0:.4f}")

    return report


def _replay_lru(trace: MooncakeTrace, capacity_tokens: int, tokens_per_block: int,
                progress: Progress | None, progress_every_s: float) -> CacheReplayResult:
    slots = capacity_tokens // tokens_per_block
    n = len(trace.requests)
    report = _reporter(progress, progress_every_s, capacity_tokens, n)
    try:
        counts = lru_replay(trace, slots, tokens_per_block,
                            lambda length: request_slots(length, tokens_per_block) <= slots, report)
    except OutOfRoom as e:
        raise ReplayBug(str(e)) from None
    return CacheReplayResult(capacity_tokens, tokens_per_block, slots, n, counts.input_tokens,
                             counts.reused_tokens, counts.oversized_requests,
                             counts.dropped_blocks)


def request_slots(input_length: int, tokens_per_block: int) -> int:
    """Slots one request needs at most: its blocks, and one for the private copy of a
    matched partial last block (made at ``resume()`` while the stored block stays held)."""
    return math.ceil(input_length / tokens_per_block) + (1 if input_length % tokens_per_block else 0)


def max_reuse(trace: MooncakeTrace, tokens_per_block: int = BLOCK_TOKENS) -> tuple[int, int]:
    """``(reused_tokens, input_tokens)`` of an infinite cache, without the manager.

    A map from each committed full block's prefix to its block, and per prefix the stored
    partial blocks below it, with KVCM2's sibling rules (a partial block is stored unless a
    sibling starts with its tokens; a new block replaces the shorter partial siblings it
    covers). A request reuses its leading full blocks found in the map and then its partial
    last block if exactly that one is stored (partial reuse off).
    """
    B = tokens_per_block
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise ConfigError(f"tokens_per_block must be an integer >= 1, got {B!r}")
    full: set[bytes] = set()  # keys (chained digests) of committed full-block prefixes
    # Per prefix key, the partial blocks and the full blocks stored below it, each list sorted.
    # Sorted, the blocks that start with some bytes begin at their insertion point, and (no
    # stored partial being a prefix of another) the one partial that is a prefix of some bytes,
    # if any, sits just before it: bisects instead of scans of a busy prefix.
    partials: dict[bytes, list[bytes]] = {}
    fulls: dict[bytes, list[bytes]] = {}
    reused = total = 0
    width = 4 * B
    for req in trace.requests:
        raw = tokens_for(req).astype("<u4").tobytes()
        n_full, tail = divmod(len(raw), width)
        total += req.input_length
        keys = [b"", *chain_keys(raw, width, n_full)]  # keys[b]: the prefix before block b
        k = 0
        while k < n_full and keys[k + 1] in full:
            k += 1
        matched = k * B
        last = raw[n_full * width:]
        if k == n_full and tail and _holds(partials.get(keys[k], ()), last):
            matched += tail // 4
        reused += matched
        for b in range(n_full):  # commit the full blocks
            if keys[b + 1] not in full:
                block = raw[b * width:(b + 1) * width]
                full.add(keys[b + 1])
                bisect.insort(fulls.setdefault(keys[b], []), block)
                if keys[b] in partials:
                    _drop_prefix_of(partials[keys[b]], block)
        if tail:  # close() commits the partial last block
            stored = partials.setdefault(keys[n_full], [])
            if not _starts_with(fulls.get(keys[n_full], ()), last) and not _starts_with(stored, last):
                _drop_prefix_of(stored, last)
                bisect.insort(stored, last)
    return reused, total


def _holds(ordered: Sequence[bytes], item: bytes) -> bool:
    i = bisect.bisect_left(ordered, item)
    return i < len(ordered) and ordered[i] == item


def _starts_with(ordered: Sequence[bytes], prefix: bytes) -> bool:
    """Whether some item of the sorted ``ordered`` starts with ``prefix``."""
    i = bisect.bisect_left(ordered, prefix)
    return i < len(ordered) and ordered[i].startswith(prefix)


def _drop_prefix_of(ordered: list[bytes], item: bytes) -> None:
    """Remove from the sorted ``ordered`` (no element a prefix of another) its one element
    that is a prefix of ``item``, if any: the element just before ``item``'s place."""
    i = bisect.bisect_right(ordered, item) - 1
    if i >= 0 and item.startswith(ordered[i]):
        del ordered[i]


def max_hit_rate(trace: MooncakeTrace, tokens_per_block: int = BLOCK_TOKENS) -> float:
    """The infinite-cache hit rate (see :func:`max_reuse`)."""
    reused, total = max_reuse(trace, tokens_per_block)
    return reused / total if total else 0.0


def capacity_curve(trace: MooncakeTrace, capacities: Sequence[int],
                   tokens_per_block: int = BLOCK_TOKENS,
                   progress: Progress | None = None, engine: str = "lru") -> dict:
    """The ``--json`` object of ``kvsim replay-cache``: one result per capacity, and the max."""
    results = []
    for capacity in capacities:
        t0 = time.perf_counter()
        result = replay_cache(trace, capacity, tokens_per_block, progress, engine=engine)
        if progress is not None:
            progress(f"capacity {capacity} tokens: {result.requests} requests in "
                     f"{time.perf_counter() - t0:.2f} s, hit rate {result.hit_rate:.4f}")
        results.append(result.to_dict())
    return {"results": results, "max_hit_rate": max_hit_rate(trace, tokens_per_block)}
