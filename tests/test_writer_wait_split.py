"""tools/writer_wait_split.py: the lock terms it derives, and None where the runs give none."""

from __future__ import annotations

from conftest import load_tool


def _case(free_waits, alone_measured, alone_predicted):
    longest = [{"free": True, "wait_ms": w} for w in free_waits]
    return {"measured": {"longest_per_run": longest, "judge_per_run": list(free_waits),
                         "after_holder_alone": {"n": 1 if alone_measured is not None else 0,
                                                "p50_ms": alone_measured}},
            "predicted": {"after_holder_alone": {"n": 1 if alone_predicted is not None else 0,
                                                 "p50_ms": alone_predicted}}}


def test_both_terms_from_free_runs_and_lone_wake_ups():
    d = load_tool("writer_wait_split").derived({"a": _case([0.010, 0.014], 0.050, 0.020)})
    assert d["lock_test_us"] == 12.0  # median of the free writers' waits, in us
    assert d["lock_wake_us"] == 18.0  # (0.050 - 0.020) ms = 30 us, less the test


def test_a_call_whose_model_queued_no_writer_gives_no_wake_term():
    """Call 4: the writers found the lock free, and no case had a lone wake-up on both sides."""
    d = load_tool("writer_wait_split").derived({"a": _case([0.010], 0.050, None)})
    assert d["lock_test_us"] == 10.0 and d["lock_wake_us"] is None
    d = load_tool("writer_wait_split").derived({"a": _case([], None, None)})
    assert d["lock_test_us"] is None and d["lock_wake_us"] is None and d["free_runs"] == 0
