"""tools/hold_off_cpu.py: readers' time off their CPU, and the hold a writer waited for last."""

from __future__ import annotations

import pytest
from conftest import load_tool


def _call(thread, mode, req, grant, rel, cpu, thread_cpu=None):
    return {"thread": thread, "mode": mode, "lock_requested_ms": req, "lock_granted_ms": grant,
            "lock_released_ms": rel, "cpu_ms": cpu, "thread_cpu_ms": thread_cpu}


CALLS = [
    _call("r1", "shared", 0.0, 0.0, 1.0, 0.9, 0.8),   # released before the writer asked
    _call("r2", "shared", 1.5, 1.5, 6.0, 4.0, 1.0),   # overlaps the wait, released last: 3 ms off
    _call("r3", "shared", 1.6, 1.6, 3.0, 1.2, 1.2),   # overlaps, released earlier
    _call("w", "exclusive", 2.0, 6.5, 7.0, 0.5, 0.5),
    _call("r4", "shared", 7.0, 7.0, 7.1, 0.05, 0.05),  # after the grant
]


def test_the_bottleneck_is_the_overlapping_hold_released_last():
    b = load_tool("hold_off_cpu").bottleneck(CALLS)
    assert b["writer_wait_ms"] == pytest.approx(4.5)
    assert (b["mode"], b["hold_ms"], b["manager_ms"]) == ("shared", 4.5, 4.0)
    assert b["off_cpu_ms"] == pytest.approx(3.0)


def test_a_prediction_has_no_thread_cpu_and_reports_its_hold_less_its_priced_cpu():
    predicted = [{**c, "thread_cpu_ms": None} for c in CALLS]
    b = load_tool("hold_off_cpu").bottleneck(predicted)
    assert "off_cpu_ms" not in b and b["hold_less_manager_ms"] == pytest.approx(0.5)


def test_readers_off_cpu_share_and_no_writer_no_bottleneck():
    tool = load_tool("hold_off_cpu")
    r = tool.readers(CALLS)
    assert r["calls"] == 4
    assert r["share_off_over_0.1ms"] == 0.25  # r2 only (r1 is 0.1 ms off: not over)
    assert r["off_over_wall"] == round((0.1 + 3.0) / (0.9 + 4.0 + 1.2 + 0.05), 4)  # rounded
    assert tool.bottleneck([c for c in CALLS if c["mode"] == "shared"]) is None
