"""tools/validation_summary.py: summary.json assembled from the named judge files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_tool

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "reports" / "validation-h200"


def _tool():
    return load_tool("validation_summary")


def test_summary_takes_each_figure_from_its_own_judge_file():
    """Copy and burst figures from the burst judge, probe figures from the probe judge, dates
    from the measurements' own records."""
    tool = _tool()
    probe_judge = V / "call-e" / "h200_probe_during_resize.json"
    out = tool.build(V / "h200_burst_resize.json", probe_judge, V, note="n")
    probe = json.loads(probe_judge.read_text())["probe"]["all"]
    burst = json.loads((V / "h200_burst_resize.json").read_text())
    assert out["probe_p99_ape_pct"] == probe["p99"]["ape_pct"]
    assert out["probe_p50_ape_pct"] == probe["p50"]["ape_pct"]
    assert out["copy_batch_median_ape_pct"] == burst["copy_bench"]["median_ape_pct"]
    assert out["burst_resize_ape_pct"] == burst["burst_resize"][0]["end_to_end_ms"]["ape_pct"]
    dates = (out["copy_and_burst_date"], out["probe_date"], out["date"])
    assert dates == ("2026-12-02", "2026-12-03", "2026-12-03")
    assert out["probe_from"] == "call-e/h200_probe_during_resize.json" and out["probe_note"] == "n"


def test_committed_summary_is_what_the_tool_writes():
    """summary.json is not edited by hand: the tool, run on the committed judges, gives it."""
    tool = _tool()
    committed = json.loads((V / "summary.json").read_text())
    replication = V / "call-f" / "h200_probe_during_resize.json"
    rebuilt = tool.build(V / "h200_burst_resize.json", V / "call-e" / "h200_probe_during_resize.json",
                         V, note=committed.get("probe_note"),
                         replication=replication if "probe_replication_from" in committed else None)
    assert json.loads(json.dumps(rebuilt)) == committed


def test_a_burst_judge_given_as_the_probe_judge_is_refused(tmp_path):
    tool = _tool()
    with pytest.raises(SystemExit, match="field 'probe' is empty"):
        tool.build(V / "h200_burst_resize.json", V / "h200_burst_resize.json", V)


def test_an_unreadable_machine_date_names_file_line_and_field(tmp_path):
    tool = _tool()
    (tmp_path / "machine.txt").write_text("yesterday\n")
    with pytest.raises(SystemExit, match=r"machine.txt:1: field 'date'"):
        tool._machine_date(tmp_path / "judge.json")


def test_a_replication_adds_its_probe_figures_beside_the_main_call():
    """The replication's figures come from its own judge, under probe_replication_*, and leave
    the main call's probe figures as they are."""
    tool = _tool()
    rep = V / "call-f" / "h200_probe_during_resize.json"
    main = V / "call-e" / "h200_probe_during_resize.json"
    out = tool.build(V / "h200_burst_resize.json", main, V, replication=rep)
    rep_probe = json.loads(rep.read_text())["probe"]["all"]
    main_probe = json.loads(main.read_text())["probe"]["all"]
    assert out["probe_replication_p99_ape_pct"] == rep_probe["p99"]["ape_pct"]
    assert out["probe_replication_p50_ape_pct"] == rep_probe["p50"]["ape_pct"]
    assert out["probe_p99_ape_pct"] == main_probe["p99"]["ape_pct"]
    assert out["probe_replication_from"] == "call-f/h200_probe_during_resize.json"
    with pytest.raises(SystemExit, match="field 'probe' is empty"):
        tool.build(V / "h200_burst_resize.json", main, V, replication=V / "h200_burst_resize.json")


def test_plan_batches_carry_the_protocol3_judgement():
    """PROTOCOL-3's held-out figures, picks and verdicts come from its judge summary."""
    out = _tool().plan_batches(V)
    j = json.loads((V / "plan-batches" / "2026-12-04-judge-3-summary.json").read_text())
    p3 = out["protocol3"]
    assert p3["model_judge_median_ape_pct"] == j["model"]["judge"]["median_ape_pct"]
    assert p3["model_judge_p90_ape_pct"] == j["model"]["judge"]["p90_ape_pct"]
    assert p3["selector_within_same_file"] == f"{j['selector']['within']}/{j['selector']['batches']}"
    assert p3["seed_burst_offload"]["path"] == j["seed_burst"]["pick"]
    assert p3["seed_burst_offload"]["device_gbps"] == j["seed_burst"]["pick_gated_gbps"]
    assert p3["onboard_largest"]["device_gbps"] == j["onboard_largest"]["pick_gated_gbps"]
    assert p3["verdict"] == j["verdict"]
    assert p3["from"].endswith("2026-12-04-judge-3-summary.json")
