"""Manager configuration and the storage layout derived from it.

A configuration is a frozen dataclass. ``StorageLayout.from_config`` derives what the manager
works with: layers merged into life cycles (identical window and sink settings merge), life cycles
with the same slot layout sharing a pool group, and the number of slots each cache level gives each
pool group.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

from kvsim.errors import ConfigError
from kvsim.manager.limits import (
    MAX_LAYERS,
    MAX_SEQUENCE_TOKENS,
    MAX_SLOT_BYTES,
    MAX_SLOTS,
    MAX_TOKENS_PER_BLOCK,
)

StatsCommit = Literal["per_batch", "per_page"]


def _require_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum} (kvsim.manager.limits), got {value}")
    return value


@dataclass(frozen=True, slots=True)
class LayerConfig:
    """One attention layer.

    ``window_tokens`` None means full attention; otherwise sliding-window attention over that
    many tokens, with ``sink_tokens`` kept forever at the start. ``slot_bytes`` is the size of
    each of the layer's buffers (for example K and V) for one block.
    """

    slot_bytes: tuple[int, ...] = (8192, 8192)
    window_tokens: int | None = None
    sink_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.slot_bytes, tuple) or not self.slot_bytes:
            raise ConfigError(f"slot_bytes must be a non-empty tuple, got {self.slot_bytes!r}")
        for b in self.slot_bytes:
            _require_int("slot_bytes entry", b, 1, MAX_SLOT_BYTES)
        if self.window_tokens is not None:
            _require_int("window_tokens", self.window_tokens, 1, MAX_SEQUENCE_TOKENS)
        _require_int("sink_tokens", self.sink_tokens, 0, MAX_SEQUENCE_TOKENS)
        if self.window_tokens is None and self.sink_tokens:
            raise ConfigError("sink_tokens only applies to sliding-window layers (window_tokens set)")


@dataclass(frozen=True, slots=True)
class LevelConfig:
    """One cache level (tier). Level 0 is the GPU; the list runs warm to cold."""

    name: str
    quota_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"level name must be a non-empty string, got {self.name!r}")
        _require_int(f"levels[{self.name}].quota_bytes", self.quota_bytes, 0)


@dataclass(frozen=True)
class ManagerConfig:
    """Everything the manager needs; validated on construction."""

    layers: tuple[LayerConfig, ...]
    levels: tuple[LevelConfig, ...]
    tokens_per_block: int = 32
    # KVCM2's defaults (KVCacheManagerConfig in tensorrt_llm/runtime/kv_cache_manager_v2/_config.py):
    # resume() refuses above 97 % GPU utilisation; a match may end inside a block.
    max_util_for_resume: float = 0.97
    partial_reuse: bool = True
    # Tokens trimmed off the tail of every prefix match (KVCM2's reuse_match_backoff, default 0).
    reuse_match_backoff: int = 0
    enable_stats: bool = True
    # "per_batch" commits statistics once per migration batch (the seed's fix); "per_page"
    # reproduces the old behaviour of one commit, and one peak re-sample, per migrated page.
    stats_commit: StatsCommit = "per_batch"
    default_priority: int = 35
    # The bug the seed fixed: probe_reuse drained the root-erase queue, mutating shared state
    # under a shared lock. True reproduces it (for the concurrency scenarios); never the default.
    probe_drains_root_erasures: bool = False

    def __post_init__(self) -> None:
        _require_int("tokens_per_block", self.tokens_per_block, 1, MAX_TOKENS_PER_BLOCK)
        if not isinstance(self.layers, tuple) or not self.layers:
            raise ConfigError("layers must be a non-empty tuple of LayerConfig")
        if len(self.layers) > MAX_LAYERS:
            raise ConfigError(f"at most {MAX_LAYERS} layers (kvsim.manager.limits), "
                              f"got {len(self.layers)}")
        if not isinstance(self.levels, tuple) or not self.levels:
            raise ConfigError("levels must be a non-empty tuple of LevelConfig (GPU first)")
        if len(self.levels) > 3:
            raise ConfigError(f"at most 3 levels (gpu, host, disk) are modelled, got {len(self.levels)}")
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ConfigError(f"level names must be unique, got {names}")
        mu = self.max_util_for_resume
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0.0 < mu <= 1.0:
            raise ConfigError(f"max_util_for_resume must be in (0, 1], got {mu!r}")
        if self.stats_commit not in ("per_batch", "per_page"):
            raise ConfigError(f"stats_commit must be 'per_batch' or 'per_page', got {self.stats_commit!r}")
        _require_int("reuse_match_backoff", self.reuse_match_backoff, 0, MAX_SEQUENCE_TOKENS)
        _require_int("default_priority", self.default_priority, 0)
        if self.default_priority > 100:
            raise ConfigError(f"default_priority must be <= 100, got {self.default_priority}")
        for flag in ("partial_reuse", "enable_stats", "probe_drains_root_erasures"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be a bool, got {getattr(self, flag)!r}")


@dataclass(frozen=True, slots=True)
class LifeCycle:
    """A set of layers that allocate and free blocks identically."""

    index: int
    window_tokens: int | None
    sink_blocks: int
    pool_group: int

    @property
    def is_sliding(self) -> bool:
        return self.window_tokens is not None

    def stale_range(self, history_tokens: int, tokens_per_block: int) -> tuple[int, int]:
        """Blocks ``[begin, end)`` that hold no live tokens for ``history_tokens`` of history.

        Full attention: none. Sliding window: from the end of the sink blocks up to the first
        block the window still reaches, ``(h + 1 - window) // tokens_per_block``.
        """
        if self.window_tokens is None:
            return (0, 0)
        num_blocks = -(-history_tokens // tokens_per_block)
        begin = min(num_blocks, self.sink_blocks)
        end = max(begin, (history_tokens + 1 - self.window_tokens) // tokens_per_block)
        return (begin, end)


@dataclass(frozen=True, slots=True)
class PoolGroup:
    """Life cycles sharing one slot layout; a page is one slot of every pool in the group."""

    index: int
    pool_slot_bytes: tuple[int, ...]
    life_cycles: tuple[int, ...]

    @property
    def page_bytes(self) -> int:
        return sum(self.pool_slot_bytes)


@dataclass(frozen=True)
class StorageLayout:
    """The derived shape of storage: life cycles, pool groups and slots per level."""

    tokens_per_block: int
    life_cycles: tuple[LifeCycle, ...]
    pool_groups: tuple[PoolGroup, ...]
    layer_to_life_cycle: tuple[int, ...]
    level_names: tuple[str, ...]
    # level_slots[level][pool_group] = number of slots
    level_slots: tuple[tuple[int, ...], ...] = field(default=())

    @property
    def num_levels(self) -> int:
        return len(self.level_names)

    @property
    def num_life_cycles(self) -> int:
        return len(self.life_cycles)

    @property
    def num_pool_groups(self) -> int:
        return len(self.pool_groups)

    @functools.cached_property
    def sliding_life_cycles(self) -> tuple[LifeCycle, ...]:
        return tuple(lc for lc in self.life_cycles if lc.is_sliding)

    def page_bytes_of_life_cycle(self, lc: int) -> int:
        return self.pool_groups[self.life_cycles[lc].pool_group].page_bytes

    def split_quota(self, quota: int | tuple[int, ...] | list[int], level_name: str) -> tuple[int, ...]:
        """Slots per pool group for a level quota in bytes.

        An integer quota is split over pool groups in proportion to the bytes one block takes in
        each group (page bytes x life cycles in the group); a sequence gives each group's bytes.
        """
        groups = self.pool_groups
        if isinstance(quota, (tuple, list)):
            if len(quota) != len(groups):
                raise ConfigError(
                    f"quota for level {level_name!r} lists {len(quota)} pool groups, "
                    f"the layout has {len(groups)}"
                )
            per_group = [_require_int(f"quota for level {level_name!r}", q, 0) for q in quota]
        else:
            total = _require_int(f"quota for level {level_name!r}", quota, 0)
            weights = [g.page_bytes * len(g.life_cycles) for g in groups]
            per_group = [total * w // sum(weights) for w in weights]
        slots = tuple(q // g.page_bytes for q, g in zip(per_group, groups))
        for g, n in enumerate(slots):
            if n > MAX_SLOTS:
                raise ConfigError(f"quota for level {level_name!r} gives pool group {g} {n} pages; "
                                  f"at most {MAX_SLOTS} (kvsim.manager.limits)")
        return slots

    @classmethod
    def from_config(cls, config: ManagerConfig) -> StorageLayout:
        lc_keys: list[tuple[int | None, int]] = []
        lc_layout: list[tuple[int, ...]] = []
        layer_to_lc: list[int] = []
        tpb = config.tokens_per_block
        for layer in config.layers:
            key = (layer.window_tokens, math.ceil(layer.sink_tokens / tpb))
            if key not in lc_keys:
                lc_keys.append(key)
                lc_layout.append(())
            i = lc_keys.index(key)
            layer_to_lc.append(i)
            lc_layout[i] = lc_layout[i] + layer.slot_bytes
        group_layouts: list[tuple[int, ...]] = []
        lc_group: list[int] = []
        for layout in lc_layout:
            if layout not in group_layouts:
                group_layouts.append(layout)
            lc_group.append(group_layouts.index(layout))
        life_cycles = tuple(
            LifeCycle(i, w, s, lc_group[i]) for i, (w, s) in enumerate(lc_keys)
        )
        pool_groups = tuple(
            PoolGroup(g, layout, tuple(i for i in range(len(lc_keys)) if lc_group[i] == g))
            for g, layout in enumerate(group_layouts)
        )
        base = cls(tpb, life_cycles, pool_groups, tuple(layer_to_lc),
                   tuple(lv.name for lv in config.levels))
        slots = tuple(base.split_quota(lv.quota_bytes, lv.name) for lv in config.levels)
        return cls(tpb, life_cycles, pool_groups, tuple(layer_to_lc), base.level_names, slots)
