"""Block keys of a token sequence: the chain of SHA-256 digests that names each full block.

A block's key is the SHA-256 of the key before it (none for the first block) and the block's
tokens as little-endian uint32 bytes, as :func:`kvsim.manager.radix_tree.block_key` keys a
block. The cache-only replay's bound for an infinite cache
(:func:`kvsim.replay.cache_only.max_reuse`) keys whole prompts with it; the manager's tree and the
cache-only replay's block LRU find blocks by their parent and tokens and need no key
(:mod:`kvsim.manager.radix_tree`, :mod:`kvsim.replay.block_lru`).
"""

from __future__ import annotations

import hashlib


def chain_keys(raw: bytes, width: int, upto: int, keys: list[bytes] | None = None) -> list[bytes]:
    """The keys of the first ``upto`` full blocks of ``raw`` (``width`` bytes each), ``keys``
    (a prefix of them) continued: each the SHA-256 of the key before (none for the first) and
    the block's bytes, as :func:`kvsim.manager.radix_tree.block_key` keys a block."""
    out = list(keys) if keys else []
    key = out[-1] if out else b""
    sha256 = hashlib.sha256
    for b in range(len(out), upto):
        key = sha256(key + raw[b * width:(b + 1) * width]).digest()
        out.append(key)
    return out
