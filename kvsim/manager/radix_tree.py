"""Radix tree of committed blocks, one root per reuse scope.

KVCM2 names a block by its key, SHA-256(previous block's key || the block's tokens as 4-byte
little-endian) (:func:`block_key`), and looks blocks up by key. A key is determined by the
block's parent and its tokens, so among one parent's children, keys differ exactly where the
tokens do: kvsim finds a child by its tokens' bytes and computes no key (a hash per block
committed and a map of every block's key were a tenth of a long replay's time). The blocks found
are those a lookup by key finds, as long as SHA-256 has no collision (KVCM2 assumes the same).
A partial block (fewer tokens than a block holds, committed when a cache stops committing) is a
child like the others, under its shorter tokens.

Sibling rules, as in KVCM2 (``_block_radix_tree.py``, ``Block.__init__``): a partial block whose
tokens are a prefix of an existing sibling's adds nothing (the sibling already holds them); a new
block that covers a shorter partial sibling replaces it, and the replaced sibling leaves the tree.
Removing a node takes its pages out of the tree (they stay with the caches holding them); roots
that lose their last node are queued for erasure, drained only from exclusive entry points,
because draining mutates the root map and a probe runs under a shared lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, ValuesView
from typing import NamedTuple

import numpy as np

from kvsim.manager.pages import NO_PAGE

# KVCM2 skips the partial-match search below a block with this many children or more
# (find_best_partial_match_in_next_nodes in _block_radix_tree.py).
MAX_PARTIAL_MATCH_CHILDREN = 32


class ReuseScope(NamedTuple):
    """KVCM2's reuse scope: blocks are shared only between caches of equal scope. Any
    hashable value works as a scope in kvsim; ``None`` means ``ReuseScope()``."""

    lora_id: int | None = None
    salt: int | None = None


DEFAULT_SCOPE = ReuseScope()


def block_key(previous_key: bytes, tokens: np.ndarray) -> bytes:
    """KVCM2's key of a block: what the tree's lookups by tokens stand for (see above)."""
    return hashlib.sha256(previous_key + raw_tokens(tokens)).digest()


def raw_tokens(tokens: np.ndarray) -> bytes:
    """A block's tokens as the tree keeps them: little-endian uint32 bytes."""
    return tokens.astype("<u4", copy=False).tobytes()


class Node:
    """One committed block: its tokens and the page of each life cycle (or -1).

    The tokens are kept as their little-endian uint32 bytes (``raw``): a slice of the commit's
    one buffer costs less than a numpy view per block, they name the block among its siblings
    (see the module docstring), prefix tests between siblings are one ``bytes.startswith``, and
    :attr:`tokens` reads them as an array when partial matching needs one (read-only: a block's
    tokens never change).

    The children are kept in ``kids``: None, the one child itself, or a dict by tokens made at
    the second child (in the order they were added). Most blocks are a link of a chain, with
    one child: a dict of one would be 240 bytes (``sys.getsizeof``, CPython 3.11).
    :class:`Root` has the same child methods over its top-level blocks."""

    __slots__ = ("node_id", "root", "parent", "depth", "raw", "pages", "kids")

    def __init__(self, node_id: int, root: Root, parent: Node | None, depth: int, raw: bytes,
                 pages: list[int]) -> None:
        self.node_id = node_id
        self.root = root
        self.parent = parent
        self.depth = depth  # block ordinal
        self.raw = raw  # tokens_per_block tokens, or fewer for a partial block
        self.pages = pages
        self.kids: Node | dict[bytes, Node] | None = None

    def child(self, raw: bytes) -> Node | None:
        """The child holding exactly the tokens ``raw``, if any."""
        kids = self.kids
        if type(kids) is dict:
            return kids.get(raw)
        return kids if kids is not None and kids.raw == raw else None

    def child_nodes(self) -> tuple[Node, ...] | ValuesView[Node]:
        """The children, in the order they were added."""
        kids = self.kids
        if kids is None:
            return ()
        return (kids,) if type(kids) is Node else kids.values()

    @property
    def has_children(self) -> bool:
        return self.kids is not None

    def add_child(self, node: Node) -> None:
        kids = self.kids
        if kids is None:
            self.kids = node
        elif type(kids) is Node:
            self.kids = {kids.raw: kids, node.raw: node}
        else:
            kids[node.raw] = node

    def remove_child(self, raw: bytes) -> None:
        kids = self.kids
        if type(kids) is Node:
            if kids.raw != raw:
                raise KeyError(raw)
            self.kids = None
        else:
            del kids[raw]  # (a dict left with one child stays a dict: same order, same answers)
            if not kids:
                self.kids = None

    @property
    def tokens(self) -> np.ndarray:
        return np.frombuffer(self.raw, dtype="<u4")

    @property
    def num_tokens(self) -> int:
        return len(self.raw) >> 2

    @property
    def is_partial(self) -> bool:
        return len(self.raw) < 4 * self.root.tokens_per_block

    def has_pages(self) -> bool:
        return any(p != NO_PAGE for p in self.pages)


class Root:
    """One reuse scope's top-level blocks (``children``, by tokens), the partial blocks of each
    parent, and how many nodes the scope has."""

    __slots__ = ("scope", "tokens_per_block", "children", "partials", "num_nodes")

    def __init__(self, scope: Hashable, tokens_per_block: int) -> None:
        self.scope = scope
        self.tokens_per_block = tokens_per_block
        self.children: dict[bytes, Node] = {}
        # parent (None at the top) -> its partial children: the sibling rules look them up
        # without scanning every child of a busy parent
        self.partials: dict[Node | None, list[Node]] = {}
        self.num_nodes = 0

    # The child API of Node, over the top-level blocks: a parent is either.
    def child(self, raw: bytes) -> Node | None:
        return self.children.get(raw)

    def child_nodes(self) -> ValuesView[Node]:
        return self.children.values()

    def add_child(self, node: Node) -> None:
        self.children[node.raw] = node

    def remove_child(self, raw: bytes) -> None:
        del self.children[raw]


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    same = a[:n] == b[:n]
    return n if same.all() else int(np.argmin(same))


_WALKS_KEPT = 256  # walks remembered (the memo is dropped when it reaches this many)
_WALK_KEY_BYTES = 64  # the last 16 tokens, with the scope and the length: a walk's memo key


class RadixTree:
    def __init__(self, tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        self.roots: dict[Hashable, Root] = {}
        self.nodes: dict[int, Node] = {}
        self.pending_root_erasures: list[Hashable] = []
        self._next_node_id = 0
        # What walk() reads is the roots' children: every change to one bumps this, and a walk
        # of the same tokens in the same scope at the same version has the same answer, kept in
        # _walks (a cache, not state: probes of one prompt repeat while nothing commits).
        self.version = 0
        self._walks: dict[tuple[Hashable, int, bytes], tuple] = {}

    # -- read-only ---------------------------------------------------------------------------
    def walk(self, scope: Hashable, tokens: np.ndarray) -> tuple[list[Node], int, bool]:
        """Nodes of the longest run of blocks of ``tokens`` found in the tree. Read-only.

        The last, short chunk of ``tokens`` is looked up too: a stored partial block with
        exactly those tokens matches without partial matching. Returns the nodes, the number
        of blocks hashed (what KVCM2's walk hashes: the matched blocks and the one that missed;
        the CPU model prices it), and whether the walk stopped at a block that missed (rather than
        at the end of ``tokens``).
        """
        root = self.roots.get(scope)
        if root is None or not root.num_nodes:
            return [], 0, tokens.size > 0
        raw = raw_tokens(tokens)  # one conversion; blocks are slices
        # Remembered under a short key, the tokens compared on a hit: hashing a whole prompt's
        # bytes (tens of KB) for the key cost more than comparing them.
        key = (scope, len(raw), raw[-_WALK_KEY_BYTES:])
        seen = self._walks.get(key)
        if seen is not None and seen[0] == self.version and seen[1] == raw:
            return list(seen[2]), seen[3], seen[4]
        nodes, hashed, missed = self._walk_tokens(root, raw)
        if len(self._walks) >= _WALKS_KEPT:
            self._walks = {}
        self._walks[key] = (self.version, raw, list(nodes), hashed, missed)
        return nodes, hashed, missed

    def _walk_tokens(self, root: Root, raw: bytes) -> tuple[list[Node], int, bool]:
        """:meth:`walk` from the root down, each block of ``raw`` looked up among the children
        of the one before by its tokens (a comparison of bytes with an only child, a dict
        lookup at a fork). The last, short chunk is a block like the others: only a partial
        node's tokens can equal it."""
        nodes: list[Node] = []
        append = nodes.append
        kids: Node | dict[bytes, Node] | None = root.children
        width = 4 * self.tokens_per_block  # bytes of a full block's tokens
        for start in range(0, len(raw), width):
            if kids is None:
                return nodes, len(nodes) + 1, True
            blk = raw[start:start + width]
            if type(kids) is Node:
                if kids.raw != blk:
                    return nodes, len(nodes) + 1, True
                child = kids
            else:
                child = kids.get(blk)
                if child is None:
                    return nodes, len(nodes) + 1, True
            append(child)
            kids = child.kids
        return nodes, len(nodes), False

    def best_partial_child(self, scope: Hashable, parent: Node | None,
                           remaining: np.ndarray) -> tuple[Node | None, int]:
        """The child of ``parent`` sharing the longest leading tokens with ``remaining`` (at
        most a block), and how many; none when ``parent`` has too many children to search.
        Ties go to the child added first. Read-only."""
        root = self.roots.get(scope)
        if root is None or remaining.size == 0:
            return None, 0
        children = (root if parent is None else parent).child_nodes()
        if len(children) >= MAX_PARTIAL_MATCH_CHILDREN:
            return None, 0
        chunk = remaining[:self.tokens_per_block]
        best: Node | None = None
        best_len = 0
        for child in children:
            common = _common_prefix(child.tokens, chunk)
            if common > best_len:
                best, best_len = child, common
        return best, best_len

    def covering_sibling(self, root: Root, parent: Node | None, raw: bytes) -> Node | None:
        """A child of ``parent`` whose tokens start with ``raw`` (which then adds nothing).
        Every child is looked at: this runs once per partial tail committed."""
        for child in (root if parent is None else parent).child_nodes():
            if child.raw.startswith(raw):
                return child
        return None

    def covered_partials(self, root: Root, parent: Node | None, raw: bytes) -> list[Node]:
        """Partial children of ``parent`` that a new block of tokens ``raw`` replaces."""
        return [child for child in root.partials.get(parent, ())
                if len(child.raw) < len(raw) and raw.startswith(child.raw)]

    def has_partial_children(self, root: Root, parent: Node | None) -> bool:
        return parent in root.partials

    def __deepcopy__(self, memo: dict) -> RadixTree:
        """A copy of the tree (roots, nodes, queued erasures), every node and root entered in
        ``memo`` so that what else a deep copy meets refers to the copies.

        Made node by node, parents first, without recursion: ``copy.deepcopy``'s own recursion
        follows a chain of blocks one level per block and exceeds Python's stack at a few
        hundred blocks (a 5,000-token prompt at 32 tokens per block). The copy remembers no
        walks (they name this tree's nodes).
        """
        clone = RadixTree.__new__(RadixTree)
        memo[id(self)] = clone
        clone.tokens_per_block = self.tokens_per_block
        clone.pending_root_erasures = list(self.pending_root_erasures)
        clone._next_node_id = self._next_node_id
        clone.version = self.version
        clone._walks = {}
        roots: dict[Hashable, Root] = {}
        for scope, old in self.roots.items():
            root = roots[scope] = Root(scope, old.tokens_per_block)
            memo[id(old)] = root
        nodes: dict[int, Node] = {}
        new_node = Node.__new__
        for node_id, old in self.nodes.items():  # in creation order: a parent before its children
            node = new_node(Node)
            node.node_id, node.depth = old.node_id, old.depth
            node.root = memo[id(old.root)]
            node.parent = None if old.parent is None else memo[id(old.parent)]
            node.raw, node.pages = old.raw, list(old.pages)
            nodes[node_id] = memo[id(old)] = node
        for old, node in zip(self.nodes.values(), nodes.values()):
            kids = old.kids
            node.kids = None if kids is None else memo[id(kids)] if type(kids) is Node else \
                {raw: memo[id(child)] for raw, child in kids.items()}
        for old, root in zip(self.roots.values(), roots.values()):
            root.num_nodes = old.num_nodes
            root.children = {raw: memo[id(n)] for raw, n in old.children.items()}
            root.partials = {None if parent is None else memo[id(parent)]: [memo[id(n)] for n in ns]
                             for parent, ns in old.partials.items()}
        clone.roots, clone.nodes = roots, nodes
        return clone

    # -- mutation (exclusive entry points only) ---------------------------------------------
    def root_for(self, scope: Hashable) -> Root:
        root = self.roots.get(scope)
        if root is None:
            root = Root(scope, self.tokens_per_block)
            self.roots[scope] = root
        return root

    def add_node(self, root: Root, parent: Node | None, raw: bytes, pages: list[int]) -> Node:
        """A new node of tokens ``raw`` (a full or a partial block) under ``parent``."""
        depth = 0 if parent is None else parent.depth + 1
        node = Node(self._next_node_id, root, parent, depth, raw, pages)
        self._next_node_id += 1
        self.version += 1
        root.num_nodes += 1
        (root if parent is None else parent).add_child(node)
        if len(raw) < 4 * self.tokens_per_block:
            root.partials.setdefault(parent, []).append(node)
        self.nodes[node.node_id] = node
        return node

    def add_chain(self, root: Root, parent: Node | None, raw: bytes, first: int, count: int,
                  pages: list[list[int]]) -> Node:
        """``count`` new full-block nodes, each the child of the one before (the first of
        ``parent``): :meth:`add_node` for a run of blocks, flat because a long prompt's commit
        makes thousands. Node ``i`` takes block ``first + i`` of ``raw`` (whole blocks of tokens
        as little-endian uint32 bytes) and ``pages[i]``. Returns the last."""
        nodes = self.nodes
        first_id = self._next_node_id
        depth = 0 if parent is None else parent.depth + 1
        width = 4 * self.tokens_per_block
        start = first * width
        node = top = Node(first_id, root, parent, depth, raw[start:start + width], pages[0])
        nodes[first_id] = top
        for i in range(1, count):  # each new node the only child of the one before
            start += width
            node_id = first_id + i  # one int object for the node and its entry in nodes
            node.kids = node = nodes[node_id] = Node(node_id, root, node, depth + i,
                                                     raw[start:start + width], pages[i])
        (root if parent is None else parent).add_child(top)
        self._next_node_id = first_id + count
        root.num_nodes += count
        self.version += 1
        return node

    def _detach(self, node: Node) -> None:
        root = node.root
        root.num_nodes -= 1
        self.version += 1
        parent = node.parent
        (root if parent is None else parent).remove_child(node.raw)
        if node.is_partial:
            partials = root.partials[parent]
            partials.remove(node)
            if not partials:
                del root.partials[parent]
        del self.nodes[node.node_id]
        if not root.num_nodes and root.scope not in self.pending_root_erasures:
            self.pending_root_erasures.append(root.scope)

    def remove_subtree(self, node: Node) -> list[Node]:
        """Detach ``node`` and every node below it; returns them, deepest first. The caller
        takes their pages out of the tree."""
        if not node.has_children:  # the common case: eviction drops the deepest blocks first
            self._detach(node)
            return [node]
        out: list[Node] = []
        stack = [node]
        while stack:  # pre-order, reversed below: children before their parents
            current = stack.pop()
            out.append(current)
            stack.extend(current.child_nodes())
        out.reverse()
        for n in out:
            self._detach(n)
        return out

    def remove_if_empty(self, node: Node) -> int:
        """Remove ``node`` and then its ancestors while they hold no page and no child.

        Returns the number of nodes removed; a root left empty is queued for erasure.
        """
        removed = 0
        current: Node | None = node
        while current is not None and not current.has_children and not current.has_pages():
            self._detach(current)
            removed += 1
            current = current.parent
        return removed

    def drain_root_erasures(self) -> int:
        """Erase queued roots that are still empty; returns how many were erased."""
        erased = 0
        for scope in self.pending_root_erasures:
            root = self.roots.get(scope)
            if root is not None and not root.num_nodes:
                del self.roots[scope]
                erased += 1
        self.pending_root_erasures.clear()
        return erased

    def clear(self) -> None:
        self.roots.clear()
        self.nodes.clear()
        self.pending_root_erasures.clear()
