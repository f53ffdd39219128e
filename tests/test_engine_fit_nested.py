"""``engine_fit.fit_max_linear`` never fits a model worse than a model it nests (issue 24, call 5:
the six-term windowed prefill stopped at 3 times the cost of the five-term fit it contains)."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.calibration import engine_fit
from kvsim.calibration.packed import read_json

CALL5 = Path(__file__).resolve().parents[1] / \
    "reports/validation-h200/prefill/2026-12-04-engine-call5.json.xz"


def _cost(X, y):
    return engine_fit._log_cost(engine_fit.fit_max_linear(X, y), np.asarray(X, float), y)


def _call5_fit_points(window_term: str):
    m = read_json(CALL5)
    g = m["grid"]
    grid = {"new": g["new"], "cached": g["cached"]}
    w = m["architectures"]["mistral-7b-v0.1"]["sliding_window"]
    rows = [r for r in engine_fit._on_grid(
        [r for r in m["records"] if r["mode"] == "prefill"], grid, ("new", "cached"))
        if engine_fit.point_role(r, ("new", "cached"), grid) == "fit"]
    X = np.array([engine_fit.prefill_features(r["new"], r["cached"], w, window_term) for r in rows])
    return X, np.array([r["per_layer_ms"] for r in rows])


def test_call5s_six_term_prefill_fits_no_worse_than_the_five_terms_it_nests():
    X6, y = _call5_fit_points("new_sq")
    X5, y5 = _call5_fit_points("none")
    assert len(y) == 15 and np.array_equal(y, y5) and np.array_equal(X6[:, :4], X5)
    five, six = _cost(X5, y), _cost(X6, y)
    assert five == pytest.approx(0.04925, rel=1e-3)
    assert six <= five * (1 + engine_fit.COST_TIE)  # the old solver: 0.162


@pytest.mark.parametrize("seed", range(6))
def test_a_model_never_fits_worse_than_any_model_it_nests(seed):
    rng = np.random.default_rng(seed)
    n = rng.uniform(1, 1000, 14)
    X = np.c_[np.ones(14), n, n * n, rng.uniform(0, 1, 14) * n]
    y = np.maximum(0.5, 0.1 + 1e-3 * n + 1e-7 * n * n) * np.exp(rng.normal(0, 0.2, 14))
    full = _cost(X, y)
    for drop in range(X.shape[1]):  # each column left out: the same model with that term at 0
        assert full <= _cost(np.delete(X, drop, axis=1), y) * (1 + engine_fit.COST_TIE)
    no_floor = engine_fit._fit_free(X / np.abs(X).max(axis=0), y, (1, 2, 3, 4), {})
    assert full <= engine_fit._log_cost(no_floor, X / np.abs(X).max(axis=0), y) * \
        (1 + engine_fit.COST_TIE)


def test_terms_held_at_zero_stay_zero_and_the_first_starts_win_ties():
    X = np.c_[np.ones(6), np.arange(1.0, 7.0)]
    y = 0.2 + 0.1 * np.arange(1.0, 7.0)
    p = engine_fit.fit_max_linear(X, y)
    assert p[1:] == pytest.approx([0.2, 0.1], rel=1e-6)
    only_b = engine_fit._fit_free(X, y, (2,), {})
    assert only_b[0] == 0.0 and only_b[1] == 0.0 and only_b[2] > 0
