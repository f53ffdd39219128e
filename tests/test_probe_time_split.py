"""tools/probe_time_split.py: a measured probe's time, part by part, against its closed loop."""

from __future__ import annotations

import json

import pytest
from conftest import load_tool


def _runs(root, cases: dict[str, list[tuple]]) -> str:
    """{case: [(latency, cpu, thread_cpu, lock_wait) ms per probe]}, one run each."""
    (root / "manifest.json").write_text(json.dumps({"mode": "hw"}))
    for case, probes in cases.items():
        d = root / "v" / case / "r1"
        d.mkdir(parents=True)
        calls = [{"api": "KVCacheManager.probe_reuse", "ok": True, "latency_ms": a,
                  "cpu_ms": b, "thread_cpu_ms": c, "lock_wait_ms": w} for a, b, c, w in probes]
        calls.append({"api": "KvCache.resize", "ok": True, "latency_ms": 9.0, "cpu_ms": 9.0,
                      "thread_cpu_ms": 9.0, "lock_wait_ms": 9.0})
        (d / "results.json").write_text(json.dumps({"calls": calls}))
    return str(root)


def test_each_part_is_the_median_and_sleeping_loops_are_set_against_their_closed_loop(tmp_path,
                                                                                        capsys):
    tool = load_tool("probe_time_split")
    closed = "probe_during_resize.reader_preference.t4.i0"
    asleep = "probe_during_resize.reader_preference.t4.i500"
    m = _runs(tmp_path, {closed: [(0.04, 0.02, 0.025, 0.004)] * 3,
                         asleep: [(0.08, 0.05, 0.05, 0.01), (0.1, 0.04, 0.045, 0.012),
                                  (0.09, 0.045, 0.05, 0.011)],
                         "probe_drain.buggy": [(0.03, 0.01, 0.01, 0.003)]})
    out = tmp_path / "split.json"
    assert tool.main([m, "--out", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    s = cases[asleep]
    assert s["probes"] == 3  # the resize call is not a probe
    assert s["latency_ms"] == pytest.approx(0.09) and s["lock_wait_ms"] == pytest.approx(0.011)
    assert s["off_cpu_ms"] == pytest.approx(0.04)  # median of 0.03, 0.055, 0.04
    assert s["over_closed_loop"]["latency_ms"] == pytest.approx(2.25)
    assert s["over_closed_loop"]["manager_cpu_ms"] == pytest.approx(2.25)
    assert "over_closed_loop" not in cases[closed] and "over_closed_loop" not in cases["probe_drain.buggy"]
    assert f"| {asleep} | 3 | 90.0 (x2.25)" in capsys.readouterr().out


def test_a_directory_without_runs_is_refused_naming_it(tmp_path, capsys):
    assert load_tool("probe_time_split").main([str(tmp_path / "none")]) == 2
    assert "none/manifest.json: missing" in capsys.readouterr().err
