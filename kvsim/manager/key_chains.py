"""Block keys of recent prompts, computed once.

A prompt is typically probed (``probe_reuse``), then given to ``create_kv_cache``, then
committed: three walks over the same blocks, each hashing block after block (SHA-256 of the
previous key and the block's tokens). A block's key depends only on the tokens up to it (every
reuse scope chains from the same empty seed; scopes are separate roots), so the keys computed
for a sequence of full blocks serve every later walk of the same tokens.

A cache only, not manager state: it is shared by calls that run at once under a shared lock,
so entries are replaced, never changed in place (a reader sees the old list or the new one),
and the whole memo is dropped when it grows past ``size`` entries.
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


class KeyChains:
    def __init__(self, tokens_per_block: int, size: int = 256) -> None:
        self.width = 4 * tokens_per_block  # bytes of one block's tokens
        self.size = size
        self._memo: dict[bytes, list[bytes]] = {}

    def cached(self, raw: bytes) -> list[bytes]:
        """The keys known for the full blocks of ``raw`` (a prefix of them; maybe none)."""
        return self._memo.get(raw, [])

    def extend(self, raw: bytes, keys: list[bytes], upto: int) -> list[bytes]:
        """``keys`` (a prefix of ``raw``'s chain) completed to ``upto`` blocks, and remembered."""
        if len(keys) >= upto:
            return keys
        out = chain_keys(raw, self.width, upto, keys)
        if len(self._memo) >= self.size:
            self._memo = {}
        self._memo[raw] = out
        return out
