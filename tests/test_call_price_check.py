"""tools/call_price_check.py: a scenario's calls on real threads against the simulator's price."""

from __future__ import annotations

import json

from conftest import REPO, load_tool


def test_groups_and_ratios_are_per_thread_api_and_offload():
    tool = load_tool("call_price_check")
    calls = [{"thread": "a", "api": "KvCache.resize", "cpu_ms": 0.1, "offloaded_pages": 16},
             {"thread": "a", "api": "KvCache.resize", "cpu_ms": 0.3, "offloaded_pages": 16},
             {"thread": "a", "api": "KvCache.resize", "cpu_ms": 0.05, "offloaded_pages": 0},
             {"thread": "b", "api": "KvCache.close", "cpu_ms": 0.02}]
    measured = tool.by_api(calls)
    assert measured[("a", "KvCache.resize", True)] == [100.0, 300.0]
    rows = tool.table(measured, {("a", "KvCache.resize", True): [50.0],
                                 ("c", "KvCache.commit", False): [10.0]})
    by = {(r["thread"], r["api"], r["offloads"]): r for r in rows}
    assert by[("a", "KvCache.resize", True)]["ratio"] == 4.0  # median 200 over 50
    assert by[("b", "KvCache.close", False)]["predicted_calls"] == 0
    assert by[("b", "KvCache.close", False)]["ratio"] is None
    assert by[("c", "KvCache.commit", False)]["measured_calls"] == 0
    # thread CPU: a slim result's column or a full result's cpu_terms_us, in us; absent: left out
    on_cpu = tool.by_api([{"thread": "a", "api": "KvCache.close", "cpu_ms": 0.3, "thread_cpu_ms": 0.1},
                          {"thread": "a", "api": "KvCache.close", "cpu_ms": 0.3,
                           "cpu_terms_us": {"thread_cpu": 300.0}},
                          {"thread": "a", "api": "KvCache.close", "cpu_ms": 0.3}], "thread_cpu_ms")
    assert on_cpu[("a", "KvCache.close", False)] == [100.0, 300.0]
    row, = tool.table({("a", "KvCache.close", False): [300.0]}, {}, on_cpu)
    assert row["measured_thread_cpu_median_us"] == 200.0


def test_a_real_thread_run_and_the_simulator_make_the_same_calls(tmp_path, capsys):
    """gil_deadlock's fixed variant on real threads (no copies, no GPU) and on the simulator:
    the antagonist makes the same calls on both sides, each priced and timed."""
    tool = load_tool("call_price_check")
    out = tmp_path / "check.json"
    rc = tool.main([str(REPO / "scenarios/bugs/gil_deadlock.yaml"), "--variant", "fixed",
                    "--cpu-model", "kvsim-python-h200host", "--runs", "1", "--out", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    calls: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r["thread"] == "antagonist":
            n = calls.setdefault((r["thread"], r["api"]), [0, 0])
            n[0] += r["measured_calls"]
            n[1] += r["predicted_calls"]
    assert {api for _, api in calls} == {"KVCacheManager.create_kv_cache", "KvCache.resume",
                                         "KvCache.resize", "KvCache.commit", "KvCache.close"}
    assert all(m == p == 40 for m, p in calls.values())  # 40 iterations on each side
    assert all(r["ratio"] > 0 for r in rows if r["ratio"] is not None)
    assert all(r["measured_thread_cpu_median_us"] > 0 for r in rows if r["measured_calls"])
    assert "| antagonist | KvCache.resize |" in capsys.readouterr().out


def test_an_unknown_variant_is_refused_naming_it():
    import pytest

    tool = load_tool("call_price_check")
    with pytest.raises(SystemExit, match="no variant 'nope'"):
        tool.main([str(REPO / "scenarios/bugs/gil_deadlock.yaml"), "--variant", "nope",
                   "--cpu-model", "kvsim-python-h200host", "--runs", "1"])
