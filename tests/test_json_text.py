"""kvsim.scenario.json_text.dumps writes exactly what json.dumps(finite(...), indent=1,
sort_keys=True, allow_nan=False) writes, for every kind of value results.json can hold."""

from __future__ import annotations

import json
import random

import pytest

from kvsim.scenario.json_text import dumps
from kvsim.scenario.results import finite


def reference(obj) -> str:
    return json.dumps(finite(obj), indent=1, sort_keys=True, allow_nan=False)


SCALARS = ["", "plain", 'quote " and \\ backslash', "tab\tnew\nline\x00\x1f", "héllo ✓ \U0001f600",
           0, -1, 2**70, -(2**64), True, False, None, 0.0, -0.0, 1.5, 1e-05, 1e300, 5e-324,
           0.1 + 0.2, 123456789.123, float("nan"), float("inf"), float("-inf")]


def random_value(rng: random.Random, depth: int):
    r = rng.random()
    if depth <= 0 or r < 0.45:
        return rng.choice(SCALARS)
    n = rng.randrange(0, 5)
    if r < 0.65:
        return [random_value(rng, depth - 1) for _ in range(n)]
    if r < 0.75:
        return tuple(random_value(rng, depth - 1) for _ in range(n))
    keys = rng.choice([[f"k{i}" for i in range(9)], ["b", "a", "A", "_x", "é", ""],
                       [3, 1, 20, -2], [1.5, 0.25], [True, False]])
    return {rng.choice(keys): random_value(rng, depth - 1) for _ in range(n)}


@pytest.mark.parametrize("seed", range(40))
def test_random_nested_values_give_the_standard_librarys_bytes(seed):
    rng = random.Random(seed)
    obj = {"calls": [random_value(rng, 5) for _ in range(20)], "x": random_value(rng, 6)}
    assert dumps(obj) == reference(obj)


@pytest.mark.parametrize("value", SCALARS + [[], {}, (), [[]], {"a": {}}, {1: 2, 0: None}])
def test_each_scalar_and_empty_container_alone(value):
    assert dumps(value) == reference(value)


def test_what_the_standard_library_refuses_is_refused():
    with pytest.raises(TypeError):
        dumps({"a": object()})
    with pytest.raises(TypeError):
        dumps({(1, 2): 3})
    with pytest.raises(ValueError):
        dumps({float("nan"): 1})
    with pytest.raises(TypeError):  # mixed key types cannot be sorted, as in json.dumps
        dumps({1: 1, "a": 2})
