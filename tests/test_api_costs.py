"""kvsim.calibration.api_costs: each manager method's fixed cost from a churn loop."""

from __future__ import annotations

import pytest

from kvsim.calibration import api_costs
from kvsim.calibration.api_costs import ChurnCall


def _call(api: str, us: float, rounds: int = 0, pages: int = 0) -> ChurnCall:
    return ChurnCall(api, us * 1e-6, {"pages_allocated": pages, "eviction_rounds": rounds})


def test_intercepts_are_median_residuals_and_rounds_pay_over_the_plain_resize():
    """Each method's intercept: the median of its times less the unit costs of its counts; an
    evicting resize's extra over the plain resizes' intercept, per round, is the round cost."""
    calls = [_call("KvCache.resume", us) for us in (50.0, 52.0, 90.0)]
    calls += [_call("KvCache.resize", 80.0 + 0.5 * 4, pages=4) for _ in range(3)]
    calls += [_call("KvCache.resize", 80.0 + 0.5 * 4 + 100.0, rounds=1, pages=4),
              _call("KvCache.resize", 80.0 + 0.5 * 4 + 200.0, rounds=2, pages=4),
              _call("KvCache.resize", 80.0 + 0.5 * 4 + 300.0, rounds=1, pages=4)]
    calls += [_call("KvCache.close", 5.0, pages=20)]  # its units cost more than it took
    intercepts, per_round = api_costs.fit(calls, {"pages_allocated": 0.5})
    assert intercepts["KvCache.resume"] == 52.0
    assert intercepts["KvCache.resize"] == pytest.approx(80.0)
    assert per_round == pytest.approx(100.0)  # median of 100, 100 and 300 per round
    assert intercepts["KvCache.close"] == 0.0  # floored


def test_every_resize_evicting_gives_the_resize_their_intercept_and_no_round_cost():
    intercepts, per_round = api_costs.fit([_call("KvCache.resize", us, rounds=1)
                                           for us in (150.0, 170.0, 190.0)], {})
    assert intercepts == {"KvCache.resize": pytest.approx(170.0)} and per_round == 0.0


def test_the_churn_loop_times_every_method_and_evicts_once_the_tier_is_full():
    calls = api_costs.measure(iterations=80, warm_up=0)
    by_api = {}
    for c in calls:
        by_api.setdefault(c.api, []).append(c)
    assert {api: len(v) for api, v in by_api.items()} == {
        "KVCacheManager.create_kv_cache": 80, "KvCache.resume": 80, "KvCache.resize": 80,
        "KvCache.commit": 80, "KvCache.close": 80}
    rounds = [c.counts["eviction_rounds"] for c in by_api["KvCache.resize"]]
    full_after = api_costs.CHURN_GPU_PAGES // 4  # 4 pages a request
    assert not any(rounds[:full_after]) and all(rounds[full_after:])
    assert all(c.seconds > 0 for c in calls)
    summary = api_costs.summary(calls)
    assert summary["KvCache.resize (evicting)"]["calls"] == 80 - full_after
    with pytest.raises(ValueError):
        api_costs.measure(iterations=0)


def test_the_speed_ratio_is_the_median_over_shared_methods_of_the_probes_mean():
    reference = {"a": 10.0, "b": 20.0, "c": 40.0, "only_here": 1.0}
    before = {"a": 20.0, "b": 30.0, "c": 40.0, "only_there": 5.0}
    after = {"a": 20.0, "b": 50.0, "c": 120.0}
    # means 20, 40, 80 over 10, 20, 40: ratios 2, 2, 2 -> 2; before alone: 2, 1.5, 1 -> 1.5
    assert api_costs.speed_ratio([before, after], reference) == pytest.approx(2.0)
    assert api_costs.speed_ratio([before], reference) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no method in both"):
        api_costs.speed_ratio([{"x": 1.0}], reference)


def test_reference_medians_read_a_calibration_samples_file_or_a_probe_and_refuse_the_rest():
    samples = {"api_churn": {"summary": {"KvCache.close": {"calls": 3, "median_us": 30.0,
                                                           "p90_us": 33.0}}}}
    assert api_costs.reference_medians(samples, "s.json") == {"KvCache.close": 30.0}
    assert api_costs.reference_medians({"medians_us": {"x": 2}}, "p.json") == {"x": 2.0}
    for bad, why in (({"cases": []}, "neither a calibration samples file"),
                     ({"medians_us": {}}, "none given"),
                     ({"medians_us": {"x": 0.0, "y": True}}, "x, y")):
        with pytest.raises(ValueError, match=why):
            api_costs.reference_medians(bad, "f.json")


def test_the_speed_probe_gives_each_methods_median():
    medians = api_costs.speed_probe(iterations=70, warm_up=0)
    assert set(medians) == {"KVCacheManager.create_kv_cache", "KvCache.resume", "KvCache.resize",
                            "KvCache.resize (evicting)", "KvCache.commit", "KvCache.close"}
    assert all(v > 0 for v in medians.values())
