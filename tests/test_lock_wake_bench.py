"""tools/lock_wake_bench.py: the lock bench's conditions (the timings themselves are the device's)."""

from __future__ import annotations


def test_the_lock_bench_times_a_fresh_threads_first_second_and_after_sleep_acquisitions():
    from conftest import load_tool

    bench = load_tool("lock_wake_bench")
    out = bench.first(5)
    assert set(out) == {"first_lock_log_wait", "second_lock_log_wait",
                        "after_500us_sleep_lock_log_wait"}
    assert all(q["n"] == 5 and 0.0 < q["p10_us"] <= q["median_us"] <= q["p90_us"]
               for q in out.values())


def test_the_first_condition_runs_with_busy_background_threads_and_stops_them():
    """--first-busy: the same three figures with K background threads running a spin (never
    touching the lock); they are stopped and joined after; a negative count is refused."""
    import threading

    import pytest
    from conftest import load_tool

    bench = load_tool("lock_wake_bench")
    before = threading.active_count()
    out = bench.first(4, busy=2)
    assert threading.active_count() == before
    assert all(q["n"] == 4 and q["median_us"] > 0.0 for q in out.values())
    calls = []
    out = bench.first(3, busy=1, work=lambda: calls.append(1))
    assert calls and out["first_lock_log_wait"]["n"] == 3
    with pytest.raises(SystemExit):
        bench.main(["/dev/null", "--first-busy", "2,-1"])
