"""Configuration validation and the derived storage layout."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig, StorageLayout

ONE_MIB_GPU = (LevelConfig("gpu", 1 << 20),)


def layout(*layers, levels=ONE_MIB_GPU, tpb=32) -> StorageLayout:
    return StorageLayout.from_config(ManagerConfig(layers=tuple(layers), levels=levels,
                                                   tokens_per_block=tpb))


def test_identical_layers_merge_into_one_life_cycle():
    lay = layout(LayerConfig(), LayerConfig(), LayerConfig(window_tokens=128))
    assert len(lay.life_cycles) == 2
    assert lay.layer_to_life_cycle == (0, 0, 1)
    # both life cycles have the layout (8192, 8192) per layer... but lc 0 has two layers
    assert lay.pool_groups[lay.life_cycles[0].pool_group].pool_slot_bytes == (8192,) * 4


def test_life_cycles_with_the_same_slot_layout_share_a_pool_group():
    lay = layout(LayerConfig(), LayerConfig(window_tokens=4096))
    assert len(lay.pool_groups) == 1
    assert lay.pool_groups[0].page_bytes == 16384
    assert lay.pool_groups[0].life_cycles == (0, 1)


def test_sink_tokens_round_up_to_blocks():
    lay = layout(LayerConfig(window_tokens=64, sink_tokens=33), tpb=32)
    assert lay.life_cycles[0].sink_blocks == 2


def test_quota_split_in_proportion_to_block_bytes():
    lay = layout(LayerConfig(slot_bytes=(1000,)), LayerConfig(slot_bytes=(3000,), window_tokens=8),
                 levels=(LevelConfig("gpu", 8000),))
    # weights 1000 and 3000: 2000 and 6000 bytes -> 2 slots each
    assert lay.level_slots == ((2, 2),)
    assert lay.split_quota([1000, 9000], "gpu") == (1, 3)
    with pytest.raises(ConfigError, match="lists 1 pool groups"):
        lay.split_quota([1], "gpu")


def test_stale_range_formula():
    lay = layout(LayerConfig(window_tokens=4096), tpb=32)
    lc = lay.life_cycles[0]
    assert lc.stale_range(200_000, 32) == (0, (200_001 - 4096) // 32)
    assert lc.stale_range(100, 32) == (0, 0)
    full = layout(LayerConfig()).life_cycles[0]
    assert full.stale_range(10**6, 32) == (0, 0)


@pytest.mark.parametrize("kwargs, message", [
    ({"tokens_per_block": 0}, "tokens_per_block must be >= 1"),
    ({"max_util_for_resume": 1.5}, r"max_util_for_resume must be in \(0, 1\]"),
    ({"stats_commit": "sometimes"}, "stats_commit must be"),
    ({"default_priority": 101}, "default_priority must be <= 100"),
    ({"reuse_match_backoff": -1}, "reuse_match_backoff must be >= 0"),
    ({"levels": ()}, "levels must be a non-empty tuple"),
    ({"layers": ()}, "layers must be a non-empty tuple"),
])
def test_bad_manager_config_is_rejected(kwargs, message):
    base = {"layers": (LayerConfig(),), "levels": (LevelConfig("gpu", 1 << 20),)}
    base.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        ManagerConfig(**base)


def test_bad_layer_and_level_are_rejected():
    with pytest.raises(ConfigError, match="sink_tokens only applies"):
        LayerConfig(sink_tokens=4)
    with pytest.raises(ConfigError, match="slot_bytes entry must be >= 1"):
        LayerConfig(slot_bytes=(0,))
    with pytest.raises(ConfigError, match="quota_bytes must be >= 0"):
        LevelConfig("gpu", -1)
