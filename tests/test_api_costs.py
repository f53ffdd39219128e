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
