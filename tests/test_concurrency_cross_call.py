"""tools/concurrency_cross_call.py: how far a case's measured figures move between calls."""

from __future__ import annotations

import json

import pytest
from conftest import load_tool


def _judge(root, name: str, values: dict[str, tuple], target_pct: float = 25.0) -> str:
    """values: {case: (writer wait, p50, p99) measured; None for a metric the case lacks}."""
    d = root / name
    d.mkdir()
    cases = {}
    for case, (ww, p50, p99) in values.items():
        cases[case] = {m: (None if v is None else {"measured": v, "predicted": 1.0,
                                                   "measured_per_run": [v * 0.9, v * 1.1]})
                       for m, v in (("writer_wait_ms", ww), ("probe_p50_ms", p50),
                                    ("probe_p99_ms", p99))}
    (d / "concurrency-judge.json").write_text(json.dumps({"cases": cases,
                                                          "target_pct": target_pct}))
    return str(d)


def test_a_case_whose_calls_span_more_than_the_targets_reach_is_counted(tmp_path):
    tool = load_tool("concurrency_cross_call")
    a = _judge(tmp_path, "a", {"x": (1.0, 0.04, 0.1), "y": (2.0, None, None)})
    b = _judge(tmp_path, "b", {"x": (1.6, 0.08, 0.1), "y": (2.2, None, None)})
    out = tmp_path / "cross.json"
    assert tool.main([a, b, "--out", str(out)]) == 0
    m = json.loads(out.read_text())["metrics"]
    ww = m["writer_wait_ms"]
    # 1.6 / 1.0 = 1.6 <= 1.25 / 0.75: one prediction (say 1.25) is within 25 % of both.
    assert ww["cases"]["x"]["one_prediction_can_meet_all"] is True
    assert ww["cases_no_prediction_meets_all"] == 0 and ww["cases_judged"] == 2
    p50 = m["probe_p50_ms"]
    assert p50["cases"]["x"]["span"] == pytest.approx(2.0)
    assert p50["cases"]["x"]["one_prediction_can_meet_all"] is False
    assert p50["cases_judged"] == 1  # y has no probes
    assert m["probe_p99_ms"]["median_span"] == pytest.approx(1.0)
    # each call's own runs span 1.1 / 0.9 in every case: within reach
    assert ww["within_call"][a] == {"cases_judged": 2, "median_run_span": pytest.approx(1.222, abs=1e-3),
                                    "cases_runs_beyond_reach": 0}


def test_judges_of_different_cases_or_targets_are_refused(tmp_path, capsys):
    tool = load_tool("concurrency_cross_call")
    a = _judge(tmp_path, "a", {"x": (1.0, 0.04, 0.1)})
    b = _judge(tmp_path, "b", {"z": (1.0, 0.04, 0.1)})
    c = _judge(tmp_path, "c", {"x": (1.0, 0.04, 0.1)}, target_pct=10.0)
    out = tmp_path / "cross.json"
    for pair, said in (((a, b), "same cases"), ((a, c), "target_pct differ")):
        with pytest.raises(SystemExit):
            tool.main([*pair, "--out", str(out)])
        assert said in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):
        tool.main([a, str(tmp_path / "missing"), "--out", str(out)])
    assert "no such file" in capsys.readouterr().err
