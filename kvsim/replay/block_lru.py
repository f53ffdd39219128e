"""The cache-only replay without the manager: a block LRU that gives the manager's answers.

In a cache-only replay (:mod:`kvsim.replay.cache_only`) requests run one after another on one
level, with one full-attention life cycle and one priority for every block. The manager's state
between two requests is then only the set of committed blocks and the LRU tick of each block's
last use, and each of its calls comes down to the rules below, kept here in dictionaries, sorted
lists and an ordered dictionary, each block named by its parent and its tokens as the manager's
radix tree finds it (:mod:`kvsim.manager.radix_tree`). The same trace, capacity and block size give the
same reused tokens, oversized requests and dropped blocks as the replay through the manager
(``tests/test_replay_cache.py`` compares the two on the shipped traces at many capacities and
block sizes, and on random traces made to collide), several times faster (the whole replay of
11,979 requests at 3M tokens: 8.5 s of CPU through the manager, 2.0 s here, on an earlier and
faster host; on 2026-12-07's, 2.5-3.2 s here, after the ordered dictionary and the keys by
tokens).

* **Match** (``create_kv_cache``, ``probe_reuse``; partial reuse off): the leading full blocks
  found by key, then the prompt's partial last block if a stored partial block holds exactly its
  tokens.
* **Room** (``resume`` for the private copy of a matched partial block, ``resize`` for the
  prompt's new blocks): blocks are evicted in the manager's order, lowest tick first and the
  deeper first at equal ticks, never one the request holds, each with whatever hangs below it
  (nothing, in practice: every use of a block touches its prefix too, so a block is never older
  than the blocks below it and goes first). Page ids, the manager's last tie-break, never decide
  here: the pages that share a tick are one request's, one per depth. Only ``resize``'s
  evictions count as dropped blocks, as the manager-based replay counts them.
* **Commit** (``commit``, and ``close`` for the partial last block), KVCM2's sibling rules: a
  new block replaces the shorter partial siblings its tokens start with; a partial block that a
  sibling already holds (one whose tokens start with its tokens) is not stored, and its page is
  freed.
* **Ticks**: ``resume`` releases a matched partial block (its tick then); ``close`` releases the
  request's blocks (the close tick). Only their order matters, so each request takes two ticks.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kvsim.traces.mooncake import MooncakeTrace, tokens_for


class OutOfRoom(RuntimeError):
    """Fewer evictable blocks than a request needs (cannot happen when the request fits)."""


@dataclass(frozen=True)
class LruCounts:
    input_tokens: int
    reused_tokens: int
    oversized_requests: int
    dropped_blocks: int


class BlockLru:
    """Committed blocks of one cache-only replay: see the module docstring."""

    def __init__(self, slots: int, tokens_per_block: int) -> None:
        self.slots = slots
        self.tokens_per_block = tokens_per_block
        self.width = 4 * tokens_per_block  # bytes of a full block (uint32 tokens)
        # A block is named by its parent and its tokens, as the manager's radix tree finds it
        # (a SHA-256 chain key names the same block, but costs 3x a dictionary's hash of the
        # tokens); each stored block has an id, 0 standing for no block above the first.
        self.ids: dict[tuple[int, bytes], int] = {}  # (parent id, tokens) -> id
        self.tick: dict[int, int] = {}  # id -> tick of last use; the stored blocks
        self.parent: dict[int, int] = {}
        self.raw: dict[int, bytes] = {}
        self.kids: dict[int, set[int]] = {}
        # Per parent id, its full and its partial children's tokens, sorted: the children that
        # start with some bytes then begin at their insertion point, and (no stored partial
        # block being a prefix of another) the one partial block that is a prefix of a block
        # sits just before it. Bisects instead of scans of a busy parent.
        self.fulls: dict[int, list[bytes]] = {}
        self.partials: dict[int, list[bytes]] = {}
        # The released blocks in eviction order, next victim first: (tick, deeper first). A
        # release appends its blocks, deepest first: they share its tick, one per depth (see
        # the module docstring), so appending keeps the order without comparing.
        self.order: OrderedDict[int, None] = OrderedDict()
        self.used = 0  # slots taken: stored blocks and the current request's uncommitted pages
        self._next_id = 1

    # -- blocks ------------------------------------------------------------------------------
    def _add(self, parent: int, raw: bytes) -> int:
        """Store a block of tokens ``raw`` below ``parent``; returns its id."""
        block = self._next_id
        self._next_id += 1
        self.ids[(parent, raw)] = block
        self.tick[block] = -1  # stamped at close
        self.parent[block] = parent
        self.raw[block] = raw
        self.kids.setdefault(parent, set()).add(block)
        siblings = self.fulls if len(raw) == self.width else self.partials
        bisect.insort(siblings.setdefault(parent, []), raw)
        return block

    def _remove(self, block: int) -> None:
        """Take ``block`` and every block below it out; their slots are freed. Iterative: a
        chain below a block can be as deep as a prompt is long."""
        below = [block]
        for b in below:  # grows as it goes: the subtree, parents before children
            below.extend(self.kids.pop(b, ()))
        for b in reversed(below):
            raw = self.raw.pop(b)
            parent = self.parent.pop(b)
            del self.tick[b], self.ids[(parent, raw)]
            self.order.pop(b, None)
            siblings = self.kids.get(parent)
            if siblings is not None:  # a removed parent's set went first
                siblings.discard(b)
            same_kind = (self.fulls if len(raw) == self.width else self.partials)[parent]
            del same_kind[bisect.bisect_left(same_kind, raw)]
            self.used -= 1

    def _stamp(self, block: int, tick: int) -> None:
        """Release ``block`` at ``tick`` (the newest tick so far): last in eviction order."""
        self.tick[block] = tick
        self.order[block] = None
        self.order.move_to_end(block)

    def _evict(self, n: int, held: set[int]) -> None:
        """Evict ``n`` blocks in eviction order, none of ``held``."""
        order = self.order
        while n:
            for block in order:  # the first not held (held blocks are few)
                if block not in held:
                    break
            else:
                raise OutOfRoom(f"{n} more blocks to evict, none evictable")
            self._remove(block)
            n -= 1

    def _drop_covered(self, parent: int, raw: bytes) -> None:
        """A new block of ``raw`` replaces the shorter partial sibling it starts with, if any."""
        partials = self.partials.get(parent)
        if partials:
            i = bisect.bisect_right(partials, raw) - 1
            if i >= 0 and len(partials[i]) < len(raw) and raw.startswith(partials[i]):
                self._remove(self.ids[(parent, partials[i])])

    def _covered(self, parent: int, raw: bytes) -> bool:
        """Whether a child of ``parent`` (full or partial) starts with ``raw``."""
        for siblings in (self.fulls.get(parent, ()), self.partials.get(parent, ())):
            i = bisect.bisect_left(siblings, raw)
            if i < len(siblings) and siblings[i].startswith(raw):
                return True
        return False

    # -- one request -------------------------------------------------------------------------
    def request(self, raw: bytes, tick: int, probe_only: bool) -> tuple[int, int]:
        """Replay one prompt (``raw``: its tokens as little-endian uint32 bytes) with ticks
        ``tick`` (resume) and ``tick + 1`` (close); ``probe_only``: match, change nothing.
        Returns ``(reused tokens, blocks dropped by resize)``."""
        width = self.width
        n_full, tail_bytes = divmod(len(raw), width)
        ids = self.ids
        mine: list[int] = []  # the request's blocks: the leading stored ones, then its new ones
        parent = 0
        for b in range(n_full):  # match
            block = ids.get((parent, raw[b * width:(b + 1) * width]))
            if block is None:
                break
            mine.append(block)
            parent = block
        k = len(mine)
        tail = raw[n_full * width:]
        tail_block = ids.get((parent, tail)) if tail_bytes and k == n_full else None
        partial_hit = tail_block is not None
        reused = k * self.tokens_per_block + (tail_bytes // 4 if partial_hit else 0)
        if probe_only:
            return reused, 0
        held = set(mine)
        if partial_hit:  # resume: a private copy of the matched partial block, then release it
            held.add(tail_block)
            if self.used + 1 > self.slots:
                self._evict(self.used + 1 - self.slots, held)
            self.used += 1
            held.discard(tail_block)
            self._stamp(tail_block, tick)
        wanted = n_full - k + (1 if tail_bytes and not partial_hit else 0)
        dropped = max(0, self.used + wanted - self.slots)
        if dropped:  # resize
            self._evict(dropped, held)
        self.used += wanted
        for b in range(k, n_full):  # commit
            block = raw[b * width:(b + 1) * width]
            self._drop_covered(parent, block)
            parent = self._add(parent, block)
            mine.append(parent)
        if tail_bytes:  # close commits the partial last block
            if self._covered(parent, tail):
                self.used -= 1  # not stored: its page is freed
            else:
                self._drop_covered(parent, tail)
                mine.append(self._add(parent, tail))
        stored, order, last = self.tick, self.order, self.order.move_to_end
        closed = tick + 1
        for block in reversed(mine):  # close releases the request's blocks, deepest first (flat)
            stored[block] = closed
            order[block] = None
            last(block)
        if self.used != len(stored):
            raise AssertionError(f"{self.used} slots used by {len(stored)} stored blocks")
        return reused, dropped


def lru_replay(trace: MooncakeTrace, slots: int, tokens_per_block: int,
               fits: Callable[[int], bool],
               progress: Callable[[int, int, int], None] | None = None) -> LruCounts:
    """Replay ``trace`` on a :class:`BlockLru` of ``slots`` blocks; a request for which
    ``fits(input_length)`` is false is only matched. ``progress(i, input, reused)`` is called
    after each request (the caller throttles its output)."""
    lru = BlockLru(slots, tokens_per_block)
    input_tokens = reused_tokens = oversized = dropped = 0
    for i, req in enumerate(trace.requests):
        raw = tokens_for(req).astype("<u4", copy=False).tobytes()
        input_tokens += req.input_length
        fit = fits(req.input_length)
        oversized += not fit
        try:
            reused, drops = lru.request(raw, 2 * i, probe_only=not fit)
        except OutOfRoom as e:
            raise OutOfRoom(f"{trace.path}:{req.line}: {e}") from None
        reused_tokens += reused
        dropped += drops
        if progress is not None:
            progress(i, input_tokens, reused_tokens)
    return LruCounts(input_tokens, reused_tokens, oversized, dropped)
