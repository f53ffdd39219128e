"""tools/host_steadiness.py: the points and spells it reports, and a CPU-only run."""

from __future__ import annotations

import json

import pytest
from conftest import load_tool


def _tool():
    return load_tool("host_steadiness")


def _rounds(walls: list[float]) -> list[tuple[float, float]]:
    """One pass of samples per round, every sample of a round at that round's wall time."""
    tool = _tool()
    return [(w, w) for w in walls for _ in range(tool.PASS)]


def test_a_steady_host_gives_points_equal_to_the_median():
    s = _tool().summarise(_rounds([100.0] * 9), rounds=9)
    assert s["points"] == 3 and s["samples"] == 63
    assert s["point_vs_median_pct"] == {"median": 0.0, "p90": 0.0}
    assert s["point_half_vs_half_pct"]["p90"] == 0.0 and s["stopped_share"] == 0.0


def test_a_slow_spell_moves_the_points_it_covers():
    # 12 rounds = 4 points; rounds 9-11 (the last point) run 1.5x slower
    s = _tool().summarise(_rounds([100.0] * 9 + [150.0] * 3), rounds=12)
    dev = s["point_vs_median_pct"]
    assert dev["median"] == 0.0
    assert dev["p90"] == pytest.approx(0.7 * 50.0)  # numpy's linear quantile of (0, 0, 0, 50)
    assert s["wall_us"]["median"] == 100.0 and s["wall_us"]["p99"] == 150.0


def test_a_sample_whose_wall_time_exceeds_its_cpu_counts_as_stopped():
    samples = _rounds([100.0] * 3)
    samples[0] = (200.0, 100.0)  # the thread was off its CPU for half of it
    assert _tool().summarise(samples, rounds=3)["stopped_share"] == pytest.approx(1 / 21)


def test_a_cpu_only_run_writes_every_condition_it_could_enter(tmp_path):
    out = tmp_path / "h.json"
    assert _tool().main([str(out), "--rounds", "3", "--works", "python",
                         "--conditions", "free,gc_off,pinned"]) == 0
    doc = json.loads(out.read_text())
    # pinning may be refused in a sandbox: then it is named, with the error, and not run
    assert "free" in doc["summary"] and "gc_off" in doc["summary"]
    assert sorted([*doc["summary"], *doc["refused"]]) == ["free", "gc_off", "pinned"]
    assert all(len(doc["samples_us"][c]["python"]) == 3 * 7 for c in doc["summary"])


def test_an_unknown_condition_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _tool().main([str(tmp_path / "h.json"), "--conditions", "free,turbo"])
    assert "--conditions" in capsys.readouterr().err
