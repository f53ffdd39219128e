"""Matching a prompt against the radix tree: which committed blocks a new cache can reuse.

The walk follows full blocks by key (:meth:`RadixTree.walk_full_blocks`), then is pruned to
blocks that still have what each life cycle needs: full attention needs every block's page (a
dropped page ends the match there); a sliding-window life cycle needs the pages of the blocks
its window and sinks cover at the match's length, so the match shortens block by block until
they are all present. With partial reuse, when every full block matched, the best partially
matching child of the last one may add its first tokens. Read-only: nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from kvsim.manager.config import LifeCycle, StorageLayout
from kvsim.manager.pages import NO_PAGE
from kvsim.manager.radix_tree import Node, RadixTree


@dataclass(frozen=True, slots=True)
class Match:
    nodes: list[Node]  # full blocks reused
    partial: Node | None  # node whose first ``partial_tokens`` tokens are reused
    partial_tokens: int
    num_tokens: int
    blocks_hashed: int

    @property
    def tree_nodes_visited(self) -> int:
        return len(self.nodes) + (1 if self.partial is not None else 0)


def window_present(layout: StorageLayout, lc: LifeCycle, nodes: list[Node], history: int,
                   extra: Node | None) -> bool:
    """Does every non-stale block of ``lc`` up to ``history`` tokens have a page?"""
    num_blocks = len(nodes) + (1 if extra is not None else 0)
    begin, end = lc.stale_range(history, layout.tokens_per_block)
    for b in list(range(0, begin)) + list(range(end, num_blocks)):
        node = nodes[b] if b < len(nodes) else extra
        if node.pages[lc.index] == NO_PAGE:
            return False
    return True


def match_prefix(tree: RadixTree, layout: StorageLayout, partial_reuse: bool, scope: Hashable,
                 tokens: np.ndarray) -> Match:
    """The usable prefix of ``tokens`` in ``tree`` (see the module docstring)."""
    tpb = layout.tokens_per_block
    nodes, hashed = tree.walk_full_blocks(scope, tokens)
    walked = len(nodes)
    for lc in layout.life_cycles:
        if not lc.is_sliding:
            for i, node in enumerate(nodes):
                if node.pages[lc.index] == NO_PAGE:
                    nodes = nodes[:i]
                    break
    for lc in layout.life_cycles:
        if lc.is_sliding:
            while nodes and not window_present(layout, lc, nodes, len(nodes) * tpb, None):
                nodes = nodes[:-1]
    partial, partial_tokens = None, 0
    if partial_reuse and len(nodes) == walked:
        parent = nodes[-1] if nodes else None
        child, n = tree.best_partial_child(scope, parent, tokens[len(nodes) * tpb:])
        if child is not None and n > 0 and all(
            window_present(layout, lc, nodes, len(nodes) * tpb + n, child)
            for lc in layout.life_cycles
        ):
            partial, partial_tokens = child, n
    return Match(nodes, partial, partial_tokens, len(nodes) * tpb + partial_tokens, hashed)
