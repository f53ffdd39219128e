"""Scenario files: validation with file/line/field, runs, results, determinism, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.report.results_dir import write_results
from kvsim.scenario.load import load_scenario
from kvsim.scenario.run import execute
from kvsim.scenario.source import ScenarioError

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "scenarios" / "seed" / "burst_resize.yaml"

SMALL = """\
name: small
seed: 3
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [2 KiB, 2 KiB]
    - slot_bytes: [2 KiB, 2 KiB]
      window_tokens: 16
  levels:
    - {name: gpu, quota_bytes: 64 KiB}
    - {name: host, quota_bytes: 1 MiB}
workload:
  kind: burst_resize
  history_tokens: 40
  growth_steps: 2
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_seed_scenario_offloads_6380_pages():
    results = execute(load_scenario(SEED))
    assert results["offload"]["growth_pages"] == 6380
    assert results["offload"]["growth_bytes"] == 104_529_920
    assert results["violations"] == []
    assert all(r["ok"] for r in results["calls"])


def test_small_scenario_runs_and_writes_a_complete_report(tmp_path):
    out = tmp_path / "out"
    results = execute(load_scenario(write(tmp_path, SMALL)))
    write_results(results, out)
    assert sorted(p.name for p in out.iterdir()) == [
        ".kvsim-output", "calls.csv", "migrations.png", "occupancy.png", "report.md",
        "results.json"]
    saved = json.loads((out / "results.json").read_text())
    for key in ("scenario", "executor", "api", "offload", "onboard", "reuse", "lock",
                "deadlocks", "violations"):
        assert key in saved
    growth = [c for c in saved["calls"] if c["phase"] == "growth"]
    assert len(growth) == 2 and growth[-1]["args"]["capacity"] == 41
    csv_lines = (out / "calls.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(saved["calls"])
    assert "![occupancy](occupancy.png)" in (out / "report.md").read_text()


def test_same_scenario_and_seed_give_byte_identical_outputs(tmp_path):
    path = write(tmp_path, SMALL)
    for name in ("a", "b"):
        write_results(execute(load_scenario(path)), tmp_path / name)
    for f in ("results.json", "calls.csv", "report.md", "occupancy.png", "migrations.png"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_a_different_seed_changes_the_filler_tokens_only(tmp_path):
    path = write(tmp_path, SMALL)
    a = execute(load_scenario(path))
    b = execute(load_scenario(path, ["seed=4"]))
    assert a["scenario"]["seed"] == 3 and b["scenario"]["seed"] == 4
    assert a["offload"] == b["offload"]


@pytest.mark.parametrize("old, new, message", [
    ("  tokens_per_block: 4", "  tokens_per_block: -4",
     r"s.yaml:4: manager.tokens_per_block: must be in \[1, 65536\], got -4"),
    ("    - {name: gpu, quota_bytes: 64 KiB}", "    - {name: gpu, quota_bytes: -3}",
     r"s.yaml:10: manager.levels.0.quota_bytes: must be >= 0, got -3"),
    ("  history_tokens: 40", "  history_tokens: 40\n  colour: red",
     r"s.yaml:15: workload.colour: unknown key"),
    ("  history_tokens: 40", "  history_tokens: forty",
     r"s.yaml:14: workload.history_tokens: must be an integer"),
    ("    - {name: gpu, quota_bytes: 64 KiB}", "    - {name: gpu, quota_bytes: 1 KiB}",
     r"s.yaml:10: manager.levels.0.quota_bytes: level 'gpu' holds no page of pool group 0"),
    ("  kind: burst_resize", "  kind: teleport", r"workload.kind: must be one of burst_resize"),
    ("seed: 3", "seed: 3\nseed: 4", r"s.yaml:3: seed: duplicate key"),
    ("      window_tokens: 16", "      window_tokens: 16\n      sink_tokens: 2.5",
     r"manager.layers.1.sink_tokens: must be an integer"),
    ("seed: 3", "seed: 3\nhw:\n  warmup_runs: -1", r"s.yaml:4: hw.warmup_runs: must be in \[0, 100\]"),
    ("seed: 3", "seed: 3\nhw:\n  warm_gpu_ms: -5", r"s.yaml:4: hw.warm_gpu_ms: must be in \[0.0, 60000.0\]"),
])
def test_invalid_scenarios_name_file_line_and_field(tmp_path, old, new, message):
    text = SMALL.replace(old, new)
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_malformed_and_empty_yaml(tmp_path):
    with pytest.raises(ScenarioError, match=r"bad.yaml:2: malformed YAML"):
        load_scenario(write(tmp_path, "name: x\n  - : [\n", "bad.yaml"))
    with pytest.raises(ScenarioError, match="empty.yaml: the file is empty"):
        load_scenario(write(tmp_path, "", "empty.yaml"))
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    with pytest.raises(ScenarioError, match=r"--set nope.x.y=1: the scenario has no field 'nope'"):
        load_scenario(write(tmp_path, SMALL), ["nope.x.y=1"])


def test_cli_run_writes_report_and_prints_json(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(write(tmp_path, SMALL)), "--out", str(out), "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["scenario"]["name"] == "small" and "calls" not in printed
    assert (out / "report.md").exists()


def test_cli_run_bad_file_exits_nonzero_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    bad = write(tmp_path, SMALL.replace("seed: 3", "seed: -1"))
    assert main(["run", str(bad), "--out", str(out)]) == 2
    assert "seed: must be >= 0" in capsys.readouterr().err
    assert not out.exists()


def test_failed_write_leaves_no_results_directory(tmp_path, monkeypatch):
    import kvsim.report.results_dir as results_dir

    def broken(results, out_dir):
        raise OSError("disk full")

    monkeypatch.setattr(results_dir, "write_report", broken)
    results = execute(load_scenario(write(tmp_path, SMALL)))
    with pytest.raises(OSError):
        write_results(results, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


OVERSIZED = """\
name: oversized
executor: sim
hardware: h100-pcie
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [1 KiB, 1 KiB]
  levels:
    - {name: gpu, quota_bytes: 64 KiB}
    - {name: host, quota_bytes: 256 KiB}
workload:
  kind: op_trace
  trace: t.jsonl
"""
# A request larger than the GPU level (32 pages): its resize fails when the trace runs.
OVERSIZED_TRACE = """\
{"t": 0, "thread": "a", "op": "create_kv_cache", "cache": "c"}
{"t": 0, "thread": "a", "op": "resume", "cache": "c"}
{"t": 0, "thread": "a", "op": "resize", "cache": "c", "capacity": 400}
"""


def test_an_unexpected_failed_call_makes_the_run_say_so_and_fail(tmp_path, capsys):
    write(tmp_path, OVERSIZED_TRACE, "t.jsonl")
    path = write(tmp_path, OVERSIZED)
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "1 call(s) failed that the scenario does not expect (KvCache.resize x1)" in err
    assert (tmp_path / "o" / "results.json").is_file()  # the report is still written
    declared = write(tmp_path, OVERSIZED + "expect_failures: [KvCache.resize]\n", "e.yaml")
    assert main(["run", str(declared), "--out", str(tmp_path / "e")]) == 0
    assert "does not expect" not in capsys.readouterr().err


def test_results_json_is_strict_json(tmp_path):
    from kvsim.scenario.results import results_json

    text = results_json({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")},
                         "_private": 1})
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": {"d": None}}
    assert "NaN" not in text and "Infinity" not in text


VARIANTS = SMALL + """\
executor: sim
hardware: h200-sxm
variants:
  same: {set: {}}
  restated: {set: {manager.tokens_per_block: 4}}
  longer: {set: {workload.history_tokens: 36}}
"""


def _counted_execute(monkeypatch: pytest.MonkeyPatch) -> list:
    """Count run.execute's calls; each runs on the simulator whatever its executor says (an
    ``hw`` run would need real threads and time that these tests do not need)."""
    import dataclasses

    from kvsim.scenario import run

    calls = []
    real = run.execute

    def counted(scenario, progress=None):
        calls.append(scenario)
        return real(dataclasses.replace(scenario, executor="sim"), progress)

    monkeypatch.setattr(run, "execute", counted)
    return calls


def test_a_variant_that_restates_the_scenario_gets_a_copy_of_its_results_not_a_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the simulator the same scenario gives byte-identical results, so a variant equal to a
    run already made (an empty set, or one that sets what is there) reuses that run; the copy
    is what a run of its own writes."""
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.results import results_json
    from kvsim.scenario.run import run_scenario

    sf = load_scenario_file(write(tmp_path, VARIANTS))
    calls = _counted_execute(monkeypatch)
    said: list[str] = []
    results = run_scenario(sf, progress=said.append)
    assert len(calls) == 2  # the run as written and "longer"
    v = results["_variant_results"]
    assert v["same"]["_reused_from"] == v["restated"]["_reused_from"] == "the run as written"
    assert "_reused_from" not in v["longer"]
    assert "variant 1/3: same (the same run as the run as written: its results reused)" in said
    assert "variant 3/3: longer" in said
    for variant, scenario in sf.variants:
        fresh = execute(scenario) | {"variant": v[variant.name]["variant"]}
        assert results_json(v[variant.name]) == results_json(fresh), variant.name
    # a copy, not the same objects: changing one run's results leaves the others as they were
    v["same"]["calls"].clear()
    assert results["calls"] and v["restated"]["calls"]


def test_hardware_variants_are_measured_again_even_when_they_restate_the_scenario(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import run_scenario

    sf = load_scenario_file(write(tmp_path, VARIANTS))
    sf.base = dataclasses.replace(sf.base, executor="hw")
    sf.variants = tuple((v, dataclasses.replace(s, executor="hw")) for v, s in sf.variants)
    calls = _counted_execute(monkeypatch)
    results = run_scenario(sf)
    assert len(calls) == 4
    assert not any("_reused_from" in r for r in results["_variant_results"].values())
