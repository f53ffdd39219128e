"""Matching a prompt against the radix tree: which committed blocks a new cache can reuse.

The rules are KVCM2's (``_block_radix_tree.py``: ``_match_token_path``, ``_prune_match``; the
backoff in ``_kv_cache_manager.py`` ``_match_reuse``), in three stages:

1. **Walk.** Blocks are followed by key (kvsim finds a child by its tokens: the same answer,
   see :mod:`kvsim.manager.radix_tree`), the last, short chunk of the prompt included (a stored
   partial block with exactly those tokens matches without partial matching). With partial
   reuse on, where a key misses, the child of the last matched block sharing the most leading
   tokens with the prompt adds those tokens (skipped below a block with 32 children or more).
2. **Backoff.** ``reuse_match_backoff`` tokens come off the tail of the walk (never below 0);
   the match may then end inside a full block, which is then reused partially.
3. **Prune at the endpoint.** With ``n`` the tokens matched, every life cycle needs a page in
   each block it loads at ``n``: every block for full attention; the sink blocks and the blocks
   of the window at ``n`` for a sliding window (blocks stale at ``n`` need none). The match is
   cut before the first block that lacks one, and checked again at the shorter endpoint, until
   nothing changes.

Read-only: nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from kvsim.manager.config import StorageLayout
from kvsim.manager.pages import NO_PAGE
from kvsim.manager.radix_tree import Node, RadixTree


@dataclass(frozen=True, slots=True)
class Match:
    nodes: list[Node]  # full blocks reused
    partial: Node | None  # node whose first ``partial_tokens`` tokens are reused
    partial_tokens: int
    num_tokens: int
    blocks_hashed: int
    tree_nodes_visited: int

    @property
    def blocks(self) -> list[Node]:
        """Every matched block, the partial one last."""
        return self.nodes if self.partial is None else [*self.nodes, self.partial]


def _first_missing(layout: StorageLayout, blocks: list[Node], n: int) -> int | None:
    """The first block a life cycle loads at ``n`` tokens that has no page, or None."""
    tpb = layout.tokens_per_block
    first: int | None = None
    for lc in layout.life_cycles:
        begin, end = lc.stale_range(n, tpb)
        i = lc.index
        # the blocks loaded at n: [0, begin) and [end, len). Each range's pages by a list
        # comprehension (1.2-3x faster than transposing every block's list at once with zip),
        # then list.index searches in C.
        for lo, hi in ((0, begin), (end, len(blocks))):
            if lo >= hi:
                continue
            try:
                b = lo + [node.pages[i] for node in blocks[lo:hi]].index(NO_PAGE)
            except ValueError:
                continue
            first = b if first is None else min(first, b)
            break
    return first


def match_prefix(tree: RadixTree, layout: StorageLayout, partial_reuse: bool, backoff: int,
                 scope: Hashable, tokens: np.ndarray) -> Match:
    """The usable prefix of ``tokens`` in ``tree`` (see the module docstring)."""
    tpb = layout.tokens_per_block
    nodes, hashed, missed = tree.walk(scope, tokens)
    # The blocks matched, and how many tokens of the last one: every other block is matched
    # whole (only the last can be partial: the others were found by a full block's key).
    blocks = list(nodes)
    last = 0
    if blocks:
        last = blocks[-1].num_tokens if blocks[-1].is_partial else tpb
    visited = len(blocks)
    if partial_reuse and missed and (not nodes or not nodes[-1].is_partial):
        child, n = tree.best_partial_child(scope, nodes[-1] if nodes else None,
                                           tokens[len(nodes) * tpb:])
        if child is not None and n > 0:
            blocks.append(child)
            last = n
            visited += 1
    cut = backoff
    while cut and blocks:
        if last > cut:
            last -= cut
            cut = 0
        else:
            cut -= last
            blocks.pop()
            last = tpb
    while blocks:
        missing = _first_missing(layout, blocks, (len(blocks) - 1) * tpb + last)
        if missing is None:
            break
        del blocks[missing:]
        last = tpb
    if blocks and last < tpb:
        partial, partial_tokens = blocks.pop(), last
    else:
        partial, partial_tokens = None, 0
    full = blocks
    return Match(full, partial, partial_tokens, len(full) * tpb + partial_tokens, hashed,
                 visited)
