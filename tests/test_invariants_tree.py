"""The invariant checker's radix-tree rules find what they claim: each corruption of the tree or
of the pages' back-pointers gives its message, and nothing else changes the verdict."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config, tokens

from kvsim.manager import KVCacheManager
from kvsim.manager.invariants import _check_tree, find_violations
from kvsim.manager.radix_tree import Root


def _committed() -> KVCacheManager:
    m = KVCacheManager(small_config(window=8))
    for start in (0, 1000):  # two chains of 5 full blocks (4 tokens each), both life cycles
        c = m.create_kv_cache(tokens(start, 20))
        assert c.resume() and c.resize(20)
        c.commit(tokens(start, 20))
        c.close()
    assert find_violations(m) == []
    return m


def _tree_messages(m: KVCacheManager) -> list[str]:
    out: list[str] = []
    _check_tree(m, out)
    return out


def _nodes(m):
    return list(m.tree.nodes.values())


def test_a_page_pointing_to_another_node_is_found_from_both_sides():
    m = _committed()
    a, b = _nodes(m)[1], _nodes(m)[2]
    page = a.pages[0]
    m.storage.pages.node[page] = b.node_id
    assert _tree_messages(m) == [
        f"node {a.node_id}: page {page} of life cycle 0 does not point back",
        f"committed page {page} is not reachable from the tree"]


def test_a_node_naming_a_freed_page_and_a_wrong_life_cycle():
    m = _committed()
    nodes = _nodes(m)
    x, y = nodes[3], nodes[7]
    freed = x.pages[1]
    m.storage.pages.level[freed] = -1
    m.storage.pages.life_cycle[y.pages[0]] = 1
    got = _tree_messages(m)
    assert f"node {x.node_id}: page {freed} of life cycle 1 does not point back" in got
    assert f"node {y.node_id}: page {y.pages[0]} of life cycle 0 does not point back" in got
    # y's page now claims life cycle 1, where y holds another page
    assert f"committed page {y.pages[0]} is not reachable from the tree" in got
    assert len(got) == 3
    assert got.index(f"node {x.node_id}: page {freed} of life cycle 1 does not point back") < \
        got.index(f"node {y.node_id}: page {y.pages[0]} of life cycle 0 does not point back")


def test_a_removed_node_leaves_its_pages_and_children_unreachable():
    m = _committed()
    nodes = _nodes(m)
    gone = nodes[2]
    del m.tree.nodes[gone.node_id]
    got = _tree_messages(m)
    child = nodes[3]
    assert f"node {child.node_id}: parent {gone.node_id} was removed" in got
    assert f"node {gone.parent.node_id}: child {gone.node_id} was removed" in got
    root = gone.root
    assert f"root {root.scope!r}: counts {root.num_nodes} nodes, has {root.num_nodes - 1}" in got
    for page in gone.pages:
        if page >= 0:
            assert f"committed page {page} is not reachable from the tree" in got


def test_a_removed_top_level_node_is_still_mapped_by_its_root():
    m = _committed()
    top = _nodes(m)[0]
    del m.tree.nodes[top.node_id]
    assert f"root {top.root.scope!r}: maps a removed node" in _tree_messages(m)


def test_a_node_of_another_root_is_reported_and_not_checked_further():
    m = _committed()
    node = _nodes(m)[4]
    node.root = Root(node.root.scope, node.root.tokens_per_block)  # a root the tree does not have
    m.storage.pages.node[node.pages[0]] = 10_000  # a node id that never existed
    got = _tree_messages(m)
    assert got[0] == f"node {node.node_id}: not reachable from its root"
    assert f"committed page {node.pages[0]} is not reachable from the tree" in got
    assert not any(g.startswith(f"node {node.node_id}: page") for g in got)


def test_a_node_its_parent_does_not_list_is_reported():
    m = _committed()
    node = _nodes(m)[4]
    node.parent.kids = None
    got = _tree_messages(m)
    assert f"node {node.node_id}: depth {node.depth} under parent of depth {node.parent.depth}, " \
        "or not among its parent's children" in got


def test_a_wrong_depth_and_a_node_with_a_missing_life_cycle():
    m = _committed()
    node = _nodes(m)[6]
    node.depth += 1
    got = _tree_messages(m)
    assert any(g.startswith(f"node {node.node_id}: depth") for g in got)
    node.depth -= 1
    node.pages = node.pages[:1]
    assert _tree_messages(m) == ["radix tree: a node without exactly 2 pages (one per life cycle)"]


@pytest.mark.parametrize("seed", range(3))
def test_random_back_pointer_corruptions_agree_with_a_per_page_reading(seed):
    """Each corrupted page is reported exactly where a per-page reading of the rules says."""
    m = _committed()
    p = m.storage.pages
    rng = np.random.default_rng(seed)
    committed = np.flatnonzero(p.node >= 0)
    hit = rng.choice(committed, size=4, replace=False)
    for page in hit.tolist():
        field = rng.integers(3)
        if field == 0:
            p.node[page] = rng.integers(0, m.tree._next_node_id)
        elif field == 1:
            p.life_cycle[page] = 1 - p.life_cycle[page]
        else:
            p.level[page] = -1
    want = []
    for node in m.tree.nodes.values():
        for lc, page in enumerate(node.pages):
            if page >= 0 and (p.level[page] < 0 or p.node[page] != node.node_id
                              or p.life_cycle[page] != lc):
                want.append(f"node {node.node_id}: page {page} of life cycle {lc} does not point back")
    for page in np.flatnonzero(p.node >= 0).tolist():
        node = m.tree.nodes.get(int(p.node[page]))
        if node is None or node.pages[int(p.life_cycle[page])] != page:
            want.append(f"committed page {page} is not reachable from the tree")
    assert want and _tree_messages(m) == want
