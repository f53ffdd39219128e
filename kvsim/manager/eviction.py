"""Eviction order: lowest priority first, then least recently used, then deepest block first.

The queue is not kept as a structure; it is a sort key computed over the candidates when victims
are needed (:mod:`kvsim.manager.eviction_index` keeps those candidates few). Every use of a block
touches its whole prefix with the same LRU tick, so a prefix is never older than its descendants;
breaking ties by depth (deeper first) therefore evicts leaves before the prefixes they hang from.
The last tie-break is the page id, so the order is total and deterministic.
"""

from __future__ import annotations

import numpy as np

from kvsim.manager.pages import PageTable

_DEPTH_BITS = 20
_TICK_BITS = 36
_MAX_DEPTH = (1 << _DEPTH_BITS) - 1
_MAX_TICK = (1 << _TICK_BITS) - 1


def rank_of(priority: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """The bits of the eviction key a page keeps for life: its priority above the tick's bits,
    its depth (deeper first) below them. What :attr:`PageTable.rank` holds."""
    rank = np.asarray(priority).astype(np.int64) << (_TICK_BITS + _DEPTH_BITS)
    rank |= _MAX_DEPTH - np.minimum(np.asarray(depth).astype(np.int64), _MAX_DEPTH)
    return rank


def eviction_keys(pages: PageTable, ids: np.ndarray) -> np.ndarray:
    """One int64 per page; smaller keys are evicted first: (priority, LRU tick, deeper first),
    each field in its own bits."""
    ids = ids.astype(np.intp, copy=False)  # take with native indices: the fast gather
    # In place on the gathers' own arrays: a rebuild keys a whole level (100K+ pages), and
    # every temporary is one more pass over it.
    keys = pages.last_used.take(ids)
    np.minimum(keys, _MAX_TICK, out=keys)
    keys <<= _DEPTH_BITS
    keys |= pages.rank.take(ids)
    return keys


def select_victims(pages: PageTable, candidates: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` first pages of ``candidates`` in eviction order, in that order."""
    if n <= 0:
        return candidates[:0]
    if n > candidates.size:
        raise ValueError(f"asked for {n} victims among {candidates.size} candidates")
    return first_in_order(candidates, eviction_keys(pages, candidates), n)


# A selection of n among at least this many candidates, and at least _NARROW_RATIO times n,
# first narrows them to the keys at or below a key estimated from a sample (see first_in_order).
_NARROW_MIN = 2048
_NARROW_RATIO = 8
_SAMPLE = 1024


def first_in_order(candidates: np.ndarray, keys: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` first of ``candidates`` by (key, page id), in that order.

    Uses a partial selection (O(candidates)) and sorts only the chosen pages. Among many
    candidates (an eviction index's rebuild ranks a whole level), the partial selection is
    narrowed first to the keys at or below one that a strided sample puts safely past the n-th:
    ``np.partition`` of 90K int64 keys costs ~1.2 ms, a comparison and a gather a fraction of it.
    Exact: when fewer than ``n`` keys are at or below the estimate, all candidates are used.
    """
    if n <= 0:
        return candidates[:0]
    if candidates.size >= _NARROW_MIN and n * _NARROW_RATIO <= candidates.size:
        sample = np.sort(keys[::candidates.size // _SAMPLE])
        # twice the share of the sample the n first would take, plus a margin for small n
        at = min(sample.size - 1, 2 * n * sample.size // candidates.size + 8)
        low = keys <= sample[at]
        if np.count_nonzero(low) >= n:
            candidates, keys = candidates[low], keys[low]
    if n < candidates.size:
        kth = np.partition(keys, n - 1)[n - 1]
        below = keys < kth
        tied = (keys == kth).nonzero()[0]
        # Among keys equal to the boundary key, the lowest page ids win (total order).
        need = n - int(below.sum())
        tied = tied[np.argsort(candidates[tied], kind="stable")[:need]]
        chosen = np.concatenate([below.nonzero()[0], tied])
        candidates, keys = candidates[chosen], keys[chosen]
    order = np.lexsort((candidates, keys))
    return candidates[order]
