"""tools/copy_submit_gil_share.py: the GIL-release check and the pooled share (its CPU-side
parts; the measurement itself runs on the GPU machine)."""

from __future__ import annotations

import time

from conftest import load_tool


def test_the_release_check_tells_a_sleep_from_python_work():
    """The check's own controls: a 10 us sleep releases the GIL, so with a spinning thread each
    call waits about a switch interval for it; a short Python loop never lets go."""
    tool = load_tool("copy_submit_gil_share")
    released = tool.releases_gil(lambda: time.sleep(1e-5), calls=7, interval_s=0.02)
    held = tool.releases_gil(lambda: sum(range(200)), calls=7, interval_s=0.02)
    assert released["releases"] and released["median_us"] > 10_000
    assert not held["releases"] and held["median_us"] < 10_000


def test_the_share_pools_cuda_time_less_allocations_over_enqueue_time():
    tool = load_tool("copy_submit_gil_share")
    rows = [{"enqueue_us": 40.0, "cuda_us": {"upload": 20.0, "launch": 10.0}, "alloc_us": 6.0},
            {"enqueue_us": 60.0, "cuda_us": {"upload": 30.0, "launch": 20.0}, "alloc_us": 8.0}]
    pooled = tool.share(rows)
    assert pooled["enqueue_us"] == 100.0 and pooled["batches"] == 2
    assert pooled["gil_free_us"] == (30 - 6) + (50 - 8)
    assert pooled["share"] == 0.66 and pooled["share_upper"] == 0.8
    # a kind found to hold the GIL is left out; without uploads, so are their allocations
    only_launch = tool.share(rows, {"launch"})
    assert only_launch["gil_free_us"] == 30.0 and only_launch["share_upper"] == 0.3
    # a row's free time never exceeds its enqueue time
    assert tool.share([{"enqueue_us": 5.0, "cuda_us": {"launch": 9.0}, "alloc_us": 0.0}])[
        "share"] == 1.0
