"""The concurrency judge (kvsim/calibration/concurrency_judge.py) end to end, without a GPU: a
tiny measured set made by tools/concurrency_validation_runs.sh --dry-run (the simulator standing
in for the hardware executor), judged as it is (every error 0, verdicts equal) and doctored (the
expected error, a missed target, a changed verdict), plus the checks on bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.calibration import concurrency_judge as cj
from kvsim.calibration.packed import SLIM_CALL_FIELDS, pack_results, read_json, read_lines
from kvsim.errors import KvsimError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "concurrency_validation_runs.sh"
CASES = ("probe_starvation.buggy", "probe_drain.fixed")  # cheap: ~1 s of simulation together


def _dry_run(out: Path, **env: str) -> subprocess.CompletedProcess:
    # The repository first, then whatever the caller's path holds (dependencies installed
    # with pip --target, as on the GPU machine).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": path, "CALIBRATE": "0",
           "CASES": " ".join(CASES), **env}
    return subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("concurrency") / "call"
    # one case per chunk, 2 rounds: 4 chunks; a GIL benchmark pair after the 2nd and the 4th
    proc = _dry_run(out, ROUNDS="2", CHUNK="1", GIL_BENCH_EVERY="2", GIL_PROBES="20",
                    SPEED_PROBE="1")
    assert proc.returncode == 0, proc.stderr
    return out


def _judge(measured: Path, out: Path, preset: str = cj.SHIPPED_PRESET) -> tuple[int, dict | None]:
    rc = cj.main([str(measured), "--cpu-model", preset, "--out", str(out), "--quiet"])
    path = out / "concurrency-judge.json"
    return rc, json.loads(path.read_text()) if rc == 0 else None


def _rewrite(run_dir: Path, change) -> None:
    (path,) = run_dir.glob("results.json*")
    results = read_json(path)
    change(results)
    path.unlink()
    (run_dir / "results.json.xz").write_bytes(pack_results(results))


def test_the_dry_run_writes_every_round_of_the_chosen_cases(measured):
    manifest = json.loads((measured / "manifest.json").read_text())
    assert manifest["mode"] == "dry-run" and manifest["executor"] == "sim"
    assert [c["name"] for c in manifest["cases"]] == [c.name for c in cj.CASES]
    lines = [json.loads(x) for x in (measured / "runs.jsonl").read_text().splitlines()]
    assert sorted((x["case"], x["round"], x["status"]) for x in lines) == sorted(
        (c, r, "ok") for c in CASES for r in (1, 2))
    for c in CASES:
        for r in (1, 2):
            results = read_json(measured / "v" / c / f"r{r}" / "results.json.xz")
            assert results["executor"] == "sim"
            # round r's GIL draws are seeded as the judge predicts round r
            assert results["resolved"]["sim"]["gil_seed"] == results["scenario"]["seed"] + r - 1
            assert set(results["calls"][0]) == set(SLIM_CALL_FIELDS)


def test_the_gil_benchmark_pairs_come_after_every_kth_chunk_at_the_probes_asked(measured):
    out = measured
    runs = list(read_lines(out / "gil-bench.jsonl.xz"))
    assert sorted(r["threads"] for r in runs) == [4, 4, 12, 12]
    assert {r["probes_per_thread"] for r in runs} == {20}
    assert "2 GIL benchmark pairs" in (out / "log.txt").read_text()


@pytest.mark.parametrize("env", [{"GIL_BENCH_EVERY": "0"}, {"GIL_PROBES": "x"}])
def test_a_bad_benchmark_setting_is_refused_before_any_work(tmp_path, env):
    out = tmp_path / "call"
    proc = _dry_run(out, ROUNDS="1", **env)
    (name,) = env
    assert proc.returncode == 2 and f"{name} must be a whole number >= 1" in proc.stderr
    assert not out.exists()


def test_identical_inputs_give_zero_error_and_equal_verdicts(measured, tmp_path):
    rc, result = _judge(measured, tmp_path / "judge")
    assert rc == 0
    assert result["mode"] == "dry-run"
    assert result["source_digest"]["same"] is True  # judged with the code the runs ran
    for name in CASES:
        case = result["cases"][name]
        assert case["runs_judged"] == ["r1", "r2"]
        for key in ("writer_wait_ms", "probe_p50_ms", "probe_p99_ms"):
            assert case[key]["error_pct"] == 0.0, (name, key, case[key])
            assert case[key]["measured_per_run"] == case[key]["predicted_per_run"]
        assert case["starvation"]["measured"] == case["starvation"]["predicted"]
        assert case["deadlock"]["measured"] == case["deadlock"]["predicted"] == "no"
        assert set(case["targets"].values()) == {"met"}
    # the buggy probe_starvation starves in both rounds; the writer-preferring probe_drain not
    assert result["cases"]["probe_starvation.buggy"]["starvation"]["measured"] == "yes"
    assert result["cases"]["probe_drain.fixed"]["starvation"]["measured"] == "no"
    assert result["cases"]["gil_deadlock.buggy"]["missing"] == "no run of this case"
    md = (tmp_path / "judge" / "concurrency-judge.md").read_text()
    assert "Mode dry-run" in md and "| probe_starvation.buggy | 2 |" in md


def test_a_doctored_measurement_gives_the_expected_error_and_misses(measured, tmp_path):
    doctored = tmp_path / "doctored"
    shutil.copytree(measured, doctored)

    def slower(results: dict) -> None:  # writer waits x2, probes x1.5, verdict flipped
        results["starvation"]["longest_writer_wait_ms"] *= 2
        results["starvation"]["starved"] = False
        for c in results["calls"]:
            if c["api"] == "KVCacheManager.probe_reuse":
                c["latency_ms"] *= 1.5

    for r in ("r1", "r2"):
        _rewrite(doctored / "v" / "probe_starvation.buggy" / r, slower)
    manifest = json.loads((doctored / "manifest.json").read_text())
    manifest["source_digest"] = "0" * 64  # as if the device had run other code
    (doctored / "manifest.json").write_text(json.dumps(manifest))
    rc, result = _judge(doctored, tmp_path / "judge")
    assert rc == 0
    assert result["source_digest"]["same"] is False
    assert "**not the runs'**" in (tmp_path / "judge" / "concurrency-judge.md").read_text()
    case = result["cases"]["probe_starvation.buggy"]
    # predicted / (2 x predicted) - 1 = -50 %; predicted / (1.5 x predicted) - 1 = -33.3 %
    assert case["writer_wait_ms"]["error_pct"] == pytest.approx(-50.0, abs=1e-9)
    assert case["probe_p50_ms"]["error_pct"] == pytest.approx(-100 / 3, abs=1e-3)
    assert case["probe_p99_ms"]["error_pct"] == pytest.approx(-100 / 3, abs=1e-3)
    assert case["starvation"] == {**case["starvation"], "measured": "no", "predicted": "yes",
                                  "met": False}
    assert case["targets"] == {"writer_wait_ms": "missed", "probe_p50_ms": "missed",
                               "probe_p99_ms": "missed", "starvation": "missed", "deadlock": "met"}
    assert result["tally"]["writer_wait_ms"] == {"met": 1, "missed": 1, "n/a": 0,
                                                  "no_run": 18}
    assert set(result["cases"]["probe_drain.fixed"]["targets"].values()) == {"met"}


def test_a_hung_run_counts_as_a_deadlock_and_cut_or_killed_ones_are_not(measured, tmp_path):
    doctored = tmp_path / "hung"
    shutil.copytree(measured, doctored)
    for r, status in (("r3", "hang"), ("r4", "cut"), ("r5", "killed")):
        d = doctored / "v" / "probe_drain.fixed" / r
        d.mkdir()
        (d / f"{status}.json").write_text(json.dumps({"status": status}) + "\n")
    rc, result = _judge(doctored, tmp_path / "judge")
    assert rc == 0
    case = result["cases"]["probe_drain.fixed"]
    assert case["runs_judged"] == ["r1", "r2", "r3"] and case["runs_hung"] == ["r3"]
    assert case["runs_not_judged"] == {"r4": "cut", "r5": "killed"}
    assert case["deadlock"]["measured"] == "yes" and case["deadlock"]["predicted"] == "no"
    assert case["targets"]["deadlock"] == "missed"


def test_bad_measured_sets_are_refused_naming_the_file(measured, tmp_path, capsys):
    lost = tmp_path / "lost"
    shutil.copytree(measured, lost)
    (lost / "v" / "probe_drain.fixed" / "r2" / "results.json.xz").unlink()
    (lost / "v" / "probe_drain.fixed" / "r2" / "hang.json").write_text("{}\n")
    assert _judge(lost, tmp_path / "j1")[0] == 2
    err = capsys.readouterr().err
    assert "runs.jsonl:" in err and "probe_drain.fixed r2 ok" in err and "holds hang" in err
    shutil.rmtree(lost / "v" / "probe_drain.fixed" / "r2")  # lost on the way back
    assert _judge(lost, tmp_path / "j0")[0] == 2
    assert "holds nothing (lost on the way back?" in capsys.readouterr().err
    rc = cj.main([str(lost), "--cpu-model", cj.SHIPPED_PRESET, "--out", str(tmp_path / "j0"),
                  "--quiet", "--allow-lost"])
    result = json.loads((tmp_path / "j0" / "concurrency-judge.json").read_text())
    assert rc == 0 and result["runs_lost"] == ["probe_drain.fixed r2 (ok)"]
    assert result["cases"]["probe_drain.fixed"]["runs_judged"] == ["r1"]

    other = tmp_path / "other"
    shutil.copytree(measured, other)

    def more_threads(results: dict) -> None:
        results["resolved"]["workload"]["probe_threads"] = 3

    _rewrite(other / "v" / "probe_drain.fixed" / "r1", more_threads)
    assert _judge(other, tmp_path / "j2")[0] == 2
    err = capsys.readouterr().err
    assert "probe_drain.fixed/r1/results.json: resolved.workload:" in err

    assert _judge(tmp_path / "nowhere", tmp_path / "j3")[0] == 2
    assert "nowhere/manifest.json: missing" in capsys.readouterr().err
    assert _judge(measured, tmp_path / "j4", preset="kvcm2-cpp")[0] == 2
    assert "holds_gil is false" in capsys.readouterr().err


def test_the_case_table_covers_every_declared_variant(tmp_path):
    cj.check_cases(REPO)
    names = [c.name for c in cj.CASES]
    assert len(names) == len(set(names)) == 8 + 12
    shutil.copytree(REPO / "scenarios", tmp_path / "scenarios")
    path = tmp_path / "scenarios" / "bugs" / "probe_drain.yaml"
    path.write_text(path.read_text() + "  half:\n    set: {manager.probe_drains_root_erasures: true}\n")
    with pytest.raises(KvsimError, match=r"probe_drain.yaml: declares variants \['buggy', "
                                         r"'fixed', 'half'\]"):
        cj.check_cases(tmp_path)


def test_rounds_are_seeded_permutations():
    one, two = cj.round_order(1), cj.round_order(2)
    assert sorted(one) == sorted(two) == sorted(c.name for c in cj.CASES)
    assert one != two and one == cj.round_order(1)
    # a call seed gives other orders of the same cases, the same for the same seed; 0 as before
    seeded = cj.round_order(1, 12)
    assert sorted(seeded) == sorted(one) and seeded != one and seeded == cj.round_order(1, 12)
    assert cj.round_order(1, 0) == one and cj.round_order(1, 13) != seeded


def test_the_runs_script_orders_each_round_by_its_order_seed(tmp_path):
    """ORDER_SEED reaches the runs script's orders (and its log): the cases run in
    round_order(round, seed)'s order, here the seed that puts them the other way round."""
    seed = next(s for s in range(1, 100) if [c for c in cj.round_order(1, s) if c in CASES]
                != [c for c in cj.round_order(1) if c in CASES])
    out = tmp_path / "call"
    proc = _dry_run(out, ROUNDS="1", CHUNK="1", GIL_BENCH="0", ORDER_SEED=str(seed))
    assert proc.returncode == 0, proc.stderr
    ran = [json.loads(line)["case"] for line in (out / "runs.jsonl").read_text().splitlines()]
    assert ran == [c for c in cj.round_order(1, seed) if c in CASES]
    assert f"order seed {seed}" in (out / "log.txt").read_text()


def test_measure_refuses_a_second_run_of_the_same_round(measured, capsys):
    rc = cj.main(["measure", str(measured), "--mode", "dry-run", "--round", "1",
                  "probe_drain.fixed"])
    assert rc == 2
    assert "probe_drain.fixed/r1: holds a run already" in capsys.readouterr().err
    rc = cj.main(["measure", str(measured), "--mode", "hw", "--round", "9", "probe_drain.fixed"])
    assert rc == 2
    assert "mode is 'dry-run'" in capsys.readouterr().err


# -- --run-speed: each run predicted at its own process speed ------------------------------------
SHIPPED_FILE = REPO / "kvsim" / "hardware" / "cpu" / f"{cj.SHIPPED_PRESET}.json"


def test_the_speed_probe_writes_each_runs_churn_medians_before_and_after_it(measured):
    for name in CASES:
        for r in ("r1", "r2"):
            data = json.loads((measured / "v" / name / r / cj.SPEED_FILE).read_text())
            for when in ("before", "after"):
                assert set(data[when]) >= {"KVCacheManager.create_kv_cache", "KvCache.resume",
                                           "KvCache.resize", "KvCache.commit", "KvCache.close"}
                assert all(v > 0 for v in data[when].values())


def _speeds(measured: Path, reference: dict[str, float], slow: dict[tuple[str, str], float]
            ) -> None:
    """Every run's speed.json set to the reference's medians times ``slow[(case, run)]`` (1
    when not named): before at that factor, after at the same."""
    for name in CASES:
        for r in ("r1", "r2"):
            f = slow.get((name, r), 1.0)
            probe = {k: v * f for k, v in reference.items()}
            (measured / "v" / name / r / cj.SPEED_FILE).write_text(
                json.dumps({"before": probe, "after": probe}))


def test_run_speed_predicts_each_run_at_its_own_speed(measured, tmp_path):
    doctored = tmp_path / "speeds"
    shutil.copytree(measured, doctored)
    reference = {"KVCacheManager.create_kv_cache": 50.0, "KvCache.resume": 40.0,
                 "KvCache.close": 30.0}
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps({"medians_us": reference}))
    _speeds(doctored, reference, {("probe_starvation.buggy", "r1"): 2.0})
    rc, plain = _judge(doctored, tmp_path / "plain", str(SHIPPED_FILE))
    assert rc == 0 and "run_speed" not in plain
    rc = cj.main([str(doctored), "--cpu-model", str(SHIPPED_FILE), "--out",
                  str(tmp_path / "fast"), "--quiet", "--run-speed", str(ref)])
    assert rc == 0
    fast = json.loads((tmp_path / "fast" / "concurrency-judge.json").read_text())
    assert fast["run_speed"]["factors"] == {"probe_starvation.buggy": {"r1": 2.0, "r2": 1.0},
                                            "probe_drain.fixed": {"r1": 1.0, "r2": 1.0}}
    # at factor 1 (the shipped preset's own host speed) each prediction is the plain judge's
    for key in ("writer_wait_ms", "probe_p50_ms", "probe_p99_ms"):
        assert fast["cases"]["probe_drain.fixed"][key] == plain["cases"]["probe_drain.fixed"][key]
    # the run at factor 2 is predicted slower: its probes' median at about twice the plain one
    p_plain = plain["cases"]["probe_starvation.buggy"]["probe_p50_ms"]["predicted_per_run"]
    p_fast = fast["cases"]["probe_starvation.buggy"]["probe_p50_ms"]["predicted_per_run"]
    assert p_fast[1] == p_plain[1]
    assert 1.6 < p_fast[0] / p_plain[0] < 2.4
    md = (tmp_path / "fast" / "concurrency-judge.md").read_text()
    assert "host_speed_factor 1.000-2.000 over 4 runs" in md


def test_run_speed_refuses_a_run_without_its_probe_and_a_bad_reference(measured, tmp_path, capsys):
    doctored = tmp_path / "no-probe"
    shutil.copytree(measured, doctored)
    (doctored / "v" / "probe_drain.fixed" / "r2" / cj.SPEED_FILE).unlink()
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps({"medians_us": {"KvCache.close": 30.0}}))
    args = ["--cpu-model", str(SHIPPED_FILE), "--quiet", "--run-speed", str(ref)]
    assert cj.main([str(doctored), *args, "--out", str(tmp_path / "j1")]) == 2
    err = capsys.readouterr().err
    assert f"{doctored / 'v' / 'probe_drain.fixed' / 'r2' / cj.SPEED_FILE}: missing" in err
    ref.write_text(json.dumps({"medians_us": {"KvCache.close": -1.0}}))
    assert cj.main([str(measured), *args, "--out", str(tmp_path / "j2")]) == 2
    assert f"{ref}: churn medians must be positive numbers; KvCache.close" in capsys.readouterr().err
    assert cj.main([str(measured), "--cpu-model", cj.SHIPPED_PRESET, "--quiet", "--run-speed",
                    str(ref), "--out", str(tmp_path / "j3")]) == 2
    assert "--run-speed needs a preset JSON file" in capsys.readouterr().err


def test_run_speed_relative_keeps_the_presets_level_and_before_reads_one_probe(measured, tmp_path):
    """--run-speed-relative: the preset's own factor times each run's speed over the call's
    median run speed; --run-speed-probes before: the probe after the run is not read."""
    doctored = tmp_path / "relative"
    shutil.copytree(measured, doctored)
    reference = {"KvCache.close": 30.0, "KvCache.resume": 40.0}
    ref = tmp_path / "reference.json"
    ref.write_text(json.dumps({"medians_us": reference}))
    preset = json.loads(SHIPPED_FILE.read_text())
    preset["host_speed_factor"] = {"value": 0.8, "source": "test"}
    preset_file = tmp_path / "preset.json"
    preset_file.write_text(json.dumps(preset))
    for name in CASES:
        for r in ("r1", "r2"):
            before = 3.0 if (name, r) == ("probe_drain.fixed", "r2") else 1.5
            (doctored / "v" / name / r / cj.SPEED_FILE).write_text(json.dumps({
                "before": {k: v * before for k, v in reference.items()},
                "after": {k: v * 10.0 for k, v in reference.items()}}))  # ignored
    rc = cj.main([str(doctored), "--cpu-model", str(preset_file), "--out", str(tmp_path / "j"),
                  "--quiet", "--run-speed", str(ref), "--run-speed-relative",
                  "--run-speed-probes", "before"])
    assert rc == 0
    result = json.loads((tmp_path / "j" / "concurrency-judge.json").read_text())
    # median of 1.5, 1.5, 1.5, 3.0 is 1.5: 0.8 x 1.5 / 1.5 and 0.8 x 3.0 / 1.5
    assert result["run_speed"]["factors"] == {"probe_starvation.buggy": {"r1": 0.8, "r2": 0.8},
                                              "probe_drain.fixed": {"r1": 0.8, "r2": 1.6}}
    assert result["run_speed"]["relative"] is True and result["run_speed"]["probes"] == "before"
    with pytest.raises(SystemExit):
        cj.main([str(doctored), "--cpu-model", str(preset_file), "--out", str(tmp_path / "k"),
                 "--run-speed-relative"])
