"""tools/plan_batch_repeatability.py: the halves of each judged point's samples, compared."""

from __future__ import annotations

import pytest
from conftest import load_tool


def _tool():
    return load_tool("plan_batch_repeatability")


def _record(samples, role="judge", timing="cuda_events_issue", path="kernel"):
    return {"status": "ok", "path": path, "timing": timing, "params": {"role": role},
            "samples_ms": samples}


def test_a_slower_second_half_shows_in_the_time_split_not_in_the_interleaved_one():
    rep = _tool().repeatability({"records": [
        _record([1.0, 1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.1]),  # a slow spell: +10 % in the second half
        _record([2.0, 2.0, 2.0, 2.0]),
        # left out: a fit batch, a gated record, a select point, too few samples
        _record([1.0, 9.0, 1.0, 9.0], role="fit"), _record([1.0, 9.0, 1.0, 9.0], timing="gated"),
        _record([1.0, 9.0, 1.0, 9.0], path="select"), _record([1.0, 9.0])]})
    assert rep["points"] == 2
    slow = abs(1.0 - 1.1) / 1.1 * 100  # first half's median against the second's
    t = rep["time_split"]
    assert t["all"]["points"] == 2
    assert t["all"]["median_ape_pct"] == pytest.approx(slow / 2)
    assert t["all"]["p90_ape_pct"] == pytest.approx(0.9 * slow)
    assert "under_1ms" not in t and t["from_1ms"]["points"] == 2
    # even and odd samples see the same spell: no difference
    assert rep["interleaved"]["all"]["median_ape_pct"] == 0.0
    assert rep["interleaved"]["all"]["p90_ape_pct"] == 0.0


def test_sub_millisecond_points_are_reported_apart():
    rep = _tool().repeatability({"records": [_record([0.2, 0.2, 0.3, 0.3]),
                                             _record([5.0, 5.0, 5.0, 5.0])]})
    t = rep["time_split"]
    assert t["under_1ms"]["points"] == 1
    assert t["under_1ms"]["median_ape_pct"] == pytest.approx(abs(0.2 - 0.3) / 0.3 * 100)
    assert t["from_1ms"]["median_ape_pct"] == 0.0
