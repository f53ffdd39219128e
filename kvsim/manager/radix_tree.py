"""Radix tree of committed blocks, one root per reuse scope.

A block's key is SHA-256(previous block's key || the block's tokens as 4-byte little-endian), so a
key names the whole prefix up to and including the block. Each root keeps a flat ``key -> node``
map for the full-block walk and each node its children for partial matching. Roots that lose their
last node are queued for erasure; the queue is drained only from exclusive entry points, because
draining mutates the root map and a probe runs under a shared lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np

from kvsim.manager.pages import NO_PAGE


def block_key(previous_key: bytes, tokens: np.ndarray) -> bytes:
    return hashlib.sha256(previous_key + tokens.astype("<u4", copy=False).tobytes()).digest()


class Node:
    """One committed block: its key, tokens, and the page of each life cycle (or -1)."""

    __slots__ = ("node_id", "key", "root", "parent", "depth", "tokens", "pages", "children")

    def __init__(self, node_id: int, key: bytes, root: Root, parent: Node | None, depth: int,
                 tokens: np.ndarray, pages: list[int]) -> None:
        self.node_id = node_id
        self.key = key
        self.root = root
        self.parent = parent
        self.depth = depth  # block ordinal
        self.tokens = tokens  # tokens_per_block of them, or fewer for a partial block
        self.pages = pages
        self.children: dict[bytes, Node] = {}

    @property
    def is_partial(self) -> bool:
        return self.tokens.size < self.root.tokens_per_block

    def has_pages(self) -> bool:
        return any(p != NO_PAGE for p in self.pages)


class Root:
    __slots__ = ("scope", "tokens_per_block", "nodes_by_key", "children")

    def __init__(self, scope: Hashable, tokens_per_block: int) -> None:
        self.scope = scope
        self.tokens_per_block = tokens_per_block
        self.nodes_by_key: dict[bytes, Node] = {}
        self.children: dict[bytes, Node] = {}


class RadixTree:
    def __init__(self, tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        self.roots: dict[Hashable, Root] = {}
        self.nodes: dict[int, Node] = {}
        self.pending_root_erasures: list[Hashable] = []
        self._next_node_id = 0

    # -- read-only ---------------------------------------------------------------------------
    def walk_full_blocks(self, scope: Hashable, tokens: np.ndarray) -> tuple[list[Node], int]:
        """Nodes of the longest run of full blocks of ``tokens`` present in the tree.

        Returns the nodes and the number of blocks hashed. Read-only.
        """
        root = self.roots.get(scope)
        if root is None or not root.nodes_by_key:
            return [], 0
        tpb = self.tokens_per_block
        nodes: list[Node] = []
        key = b""
        hashed = 0
        for b in range(tokens.size // tpb):
            key = block_key(key, tokens[b * tpb : (b + 1) * tpb])
            hashed += 1
            node = root.nodes_by_key.get(key)
            if node is None:
                break
            nodes.append(node)
        return nodes, hashed

    def best_partial_child(self, scope: Hashable, parent: Node | None,
                           remaining: np.ndarray) -> tuple[Node | None, int]:
        """The child of ``parent`` sharing the longest token prefix with ``remaining``.

        Only a strict prefix of a block counts (a full-block match is found by key). Ties go to
        the child added first. Read-only.
        """
        root = self.roots.get(scope)
        if root is None or remaining.size == 0:
            return None, 0
        children = root.children if parent is None else parent.children
        best: Node | None = None
        best_len = 0
        limit = min(remaining.size, self.tokens_per_block)
        for child in children.values():
            n = min(limit, child.tokens.size)
            same = child.tokens[:n] == remaining[:n]
            common = n if same.all() else int(np.argmin(same))
            common = min(common, self.tokens_per_block - 1)
            if common > best_len:
                best, best_len = child, common
        return best, best_len

    # -- mutation (exclusive entry points only) ---------------------------------------------
    def root_for(self, scope: Hashable) -> Root:
        root = self.roots.get(scope)
        if root is None:
            root = Root(scope, self.tokens_per_block)
            self.roots[scope] = root
        return root

    def add_node(self, root: Root, parent: Node | None, key: bytes, tokens: np.ndarray,
                 pages: list[int], copy_tokens: bool = True) -> Node:
        """A new node; ``copy_tokens=False`` when the caller hands over a buffer nobody else
        writes (the node then keeps a view of it)."""
        depth = 0 if parent is None else parent.depth + 1
        node = Node(self._next_node_id, key, root, parent, depth,
                    tokens.copy() if copy_tokens else tokens, pages)
        self._next_node_id += 1
        root.nodes_by_key[key] = node
        (root.children if parent is None else parent.children)[key] = node
        self.nodes[node.node_id] = node
        return node

    def remove_if_empty(self, node: Node) -> int:
        """Remove ``node`` and then its ancestors while they hold no page and no child.

        Returns the number of nodes removed; a root left empty is queued for erasure.
        """
        removed = 0
        current: Node | None = node
        while current is not None and not current.children and not current.has_pages():
            root = current.root
            del root.nodes_by_key[current.key]
            siblings = root.children if current.parent is None else current.parent.children
            del siblings[current.key]
            del self.nodes[current.node_id]
            removed += 1
            if not root.nodes_by_key and root.scope not in self.pending_root_erasures:
                self.pending_root_erasures.append(root.scope)
            current = current.parent
        return removed

    def drain_root_erasures(self) -> int:
        """Erase queued roots that are still empty; returns how many were erased."""
        erased = 0
        for scope in self.pending_root_erasures:
            root = self.roots.get(scope)
            if root is not None and not root.nodes_by_key:
                del self.roots[scope]
                erased += 1
        self.pending_root_erasures.clear()
        return erased

    def clear(self) -> None:
        self.roots.clear()
        self.nodes.clear()
        self.pending_root_erasures.clear()
