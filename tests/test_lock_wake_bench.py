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
