"""Capacity-planning sweeps: point expansion, seeds, both backends, resume, failures, report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from kvsim.cli import main  # noqa: E402
from kvsim.sweep.points import expand_values, point_seed, sweep_points  # noqa: E402
from kvsim.sweep.runner import run_sweep  # noqa: E402
from kvsim.sweep.spec import SweepError, load_sweep, load_sweep_scenario, parse_param  # noqa: E402
from kvsim.sweep.table import comparable, read_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

TINY = """\
name: tiny_sweep
executor: sim
hardware: h200-sxm
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [2 KiB, 2 KiB]
  levels:
    - {name: gpu, quota_bytes: 256 KiB}
    - {name: host, quota_bytes: 1 MiB}
workload:
  kind: burst_resize
  history_tokens: 128
  gpu_fill_fraction: 1.0
  filler_requests: 2
"""
PARAMS = ["hardware=h100-pcie,gh200", "workload.history_tokens=64,128", "sim.copy_path=auto,select"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scen") / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def local_run(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    outcome = run_sweep(load_sweep(tiny, PARAMS), out, backend="local", workers=2)
    return out, outcome


# -- expansion and seeds -------------------------------------------------------------------------

GRID = [("a", (1, 2, 3)), ("b", ("x", "y")), ("c", (0.5, 1.5, 2.5, 3.5))]


def test_grid_is_the_product():
    points = expand_values(GRID, "grid")
    assert len(points) == 3 * 2 * 4
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 24
    assert points[0] == {"a": 1, "b": "x", "c": 0.5}
    assert expand_values(GRID, "lhs", sample=100) == points  # a sample >= the grid is the grid


@pytest.mark.parametrize("method", ["random", "lhs"])
def test_sampling_is_seeded_distinct_and_covers(method):
    one = expand_values(GRID, method, sample=8, seed=3)
    assert one == expand_values(GRID, method, sample=8, seed=3)
    assert one != expand_values(GRID, method, sample=8, seed=4)
    keys = [json.dumps(p, sort_keys=True) for p in one]
    assert len(one) == 8 and len(set(keys)) == 8
    grid = {json.dumps(p, sort_keys=True) for p in expand_values(GRID, "grid")}
    assert set(keys) <= grid
    if method == "lhs":  # each value of each parameter appears, as evenly as the sample allows
        for key, values in GRID:
            counts = Counter(p[key] for p in one)
            assert set(counts) == set(values)
            assert max(counts.values()) - min(counts.values()) <= 2


def test_point_seeds_do_not_depend_on_order(tiny):
    assert point_seed(7, {"a": 1, "b": "x"}) == point_seed(7, {"b": "x", "a": 1})
    assert point_seed(7, {"a": 1}) != point_seed(8, {"a": 1})
    assert point_seed(7, {"seed": 42}) == 42  # sweeping the seed itself
    forward = load_sweep(tiny, PARAMS, seed=5)
    backward = load_sweep(tiny, [p.split("=")[0] + "=" + ",".join(reversed(p.split("=")[1].split(",")))
                                 for p in reversed(PARAMS)], seed=5)
    a = {p.point_id: (p.point_seed, p.params) for p in sweep_points(forward)}
    b = {p.point_id: (p.point_seed, p.params) for p in sweep_points(backward)}
    assert a == b and len(a) == 8
    assert [p.point_id for p in sweep_points(forward)] != [p.point_id for p in sweep_points(backward)]


def test_param_parsing_and_bad_keys(tiny):
    assert parse_param("sim.copy_path=auto, select") == ("sim.copy_path", ("auto", "select"))
    assert parse_param("workload.history_tokens=64,128") == ("workload.history_tokens", (64, 128))
    with pytest.raises(SweepError):
        parse_param("sim.copy_path")
    with pytest.raises(SweepError, match="no field"):
        load_sweep(tiny, ["workload.nope.deeper=1,2"])
    with pytest.raises(SweepError, match="sample"):
        load_sweep(tiny, PARAMS, method="grid", sample=3)


def test_example_sweep_definition_loads():
    sweep = load_sweep(REPO / "scenarios/sweeps/example.yaml")
    assert [p.grid_size for p in sweep.parts] == [18, 12]
    assert len(sweep_points(sweep)) == 30
    sf, _ = load_sweep_scenario(REPO / "scenarios/sweeps/example.yaml",
                                ["workload.history_tokens=50000"])
    assert sf.base.workload.capacity_tokens == 50001  # capacity follows the swept length
    assert "sweep" not in sf.data


# -- running -------------------------------------------------------------------------------------

def test_local_sweep_writes_the_table(local_run):
    out, outcome = local_run
    assert (out / "results.parquet").exists() and (out / "results.csv").exists()
    assert (out / "report.md").exists() and not (out / "points.jsonl").exists()
    df = read_table(out / "results.parquet")
    assert len(df) == 8 and outcome.ran == 8 and outcome.failed == 0
    assert list(df["point_id"]) == sorted(df["point_id"])
    assert set(df["status"]) == {"ok"}
    for col in ("hardware", "workload.history_tokens", "sim.copy_path", "point_seed",
                "resize_p50_ms", "resize_copies_done_p50_ms", "offloaded_pages", "probe_p99_ms",
                "longest_writer_wait_ms", "starved", "violations", "deadlocks", "hit_rate",
                "sim_events", "wall_s"):
        assert col in df.columns, col
    assert df["resize_p50_ms"].notna().all() and df["probe_p99_ms"].isna().all()
    assert (df["cfg_hardware"] == df["hardware"]).all()
    assert df["workload.history_tokens"].dtype == "Int64"
    csv = pd.read_csv(out / "results.csv")
    assert list(csv["point_id"]) == list(df["point_id"])
    # the same scenario and seed give the same numbers as an ordinary run
    from kvsim.scenario.run import execute
    from kvsim.sweep.points import summarize

    row = df.iloc[0]
    sf, _ = load_sweep_scenario(row["scenario_file"], [
        f"{k}={row[k]}" for k in ("hardware", "workload.history_tokens", "sim.copy_path")]
        + [f"seed={row['point_seed']}"])
    assert summarize(execute(sf.base))["resize_copies_done_p50_ms"] == row["resize_copies_done_p50_ms"]


def test_rerun_skips_finished_points(local_run, tiny):
    out, first = local_run
    again = run_sweep(load_sweep(tiny, PARAMS), out, backend="local", workers=2, report=False)
    assert again.ran == 0 and again.skipped == 8
    assert comparable(again.table).equals(comparable(first.table))
    assert again.table["wall_s"].equals(first.table["wall_s"])  # the rows were kept, not re-run


def test_rerun_with_a_changed_kvsim_runs_every_point_again(local_run, tiny, tmp_path,
                                                         monkeypatch):
    """A changed preset or code changes what a point gives: its earlier row is not reused."""
    import shutil

    from kvsim.sweep import points

    out = tmp_path / "copy"
    shutil.copytree(local_run[0], out)
    monkeypatch.setattr(points, "kvsim_digest", lambda: "another kvsim")
    again = run_sweep(load_sweep(tiny, PARAMS), out, backend="local", workers=2, report=False)
    assert again.ran == 8 and again.skipped == 0 and again.dropped == 8


def test_rerun_after_the_trace_changed_runs_every_point_again(tmp_path):
    """A point reads its trace: when the file changes, its earlier row is not reused; when the
    trace is a parameter, only the points of the changed file run again."""
    import shutil

    sample = Path(__file__).resolve().parents[1] / "scenarios" / "traces"
    shutil.copy(sample / "mooncake_sample.yaml", tmp_path / "s.yaml")
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copy(sample / "mooncake_sample.jsonl", tmp_path / name)
    (tmp_path / "s.yaml").write_text((tmp_path / "s.yaml").read_text().replace(
        "trace: mooncake_sample.jsonl", "trace: a.jsonl"))
    sweep = load_sweep(tmp_path / "s.yaml", ["workload.trace=a.jsonl,b.jsonl"])
    out = tmp_path / "out"
    assert run_sweep(sweep, out, workers=1, report=False).ran == 2
    assert run_sweep(sweep, out, workers=1, report=False).skipped == 2
    with open(tmp_path / "b.jsonl", "a") as f:  # one more request in b
        f.write((tmp_path / "b.jsonl").read_text().splitlines()[-1] + "\n")
    again = run_sweep(load_sweep(tmp_path / "s.yaml", ["workload.trace=a.jsonl,b.jsonl"]), out,
                      workers=1, report=False)
    assert (again.ran, again.skipped) == (1, 1)
    with open(tmp_path / "a.jsonl", "a") as f:  # the scenario's own trace: every point
        f.write((tmp_path / "a.jsonl").read_text().splitlines()[-1] + "\n")
    again = run_sweep(load_sweep(tmp_path / "s.yaml", ["workload.trace=a.jsonl,b.jsonl"]), out,
                      workers=1, report=False)
    assert (again.ran, again.skipped) == (2, 0)


def test_failing_point_is_recorded_and_retried(tiny, tmp_path, capsys):
    out = tmp_path / "fail"
    argv = ["sweep", str(tiny), "--param", "workload.gpu_fill_fraction=0.5,2.0,1.0",
            "--workers", "2", "--out", str(out), "--no-report"]
    assert main(argv) == 1
    df = read_table(out / "results.parquet")
    bad = df[df["workload.gpu_fill_fraction"] == 2.0].iloc[0]
    assert bad["status"] == "error" and "gpu_fill_fraction" in bad["error"]
    assert pd.isna(bad["resize_p50_ms"])
    assert (df[df["workload.gpu_fill_fraction"] != 2.0]["status"] == "ok").all()
    assert "1 failed" in capsys.readouterr().err
    # a re-run retries the failed point only
    again = run_sweep(load_sweep(tiny, ["workload.gpu_fill_fraction=0.5,2.0,1.0"]), out,
                      workers=2, report=False)
    assert again.ran == 1 and again.skipped == 2 and again.failed == 1


def test_dask_local_cluster_gives_the_same_table(local_run, tiny, tmp_path):
    pytest.importorskip("distributed")
    _, local = local_run
    outcome = run_sweep(load_sweep(tiny, PARAMS), tmp_path / "dask", backend="dask", workers=2,
                        report=False)
    assert outcome.ran == 8 and outcome.failed == 0
    table = read_table(tmp_path / "dask" / "results.parquet")
    assert comparable(table).equals(comparable(local.table))


# -- report --------------------------------------------------------------------------------------

def test_report_from_a_table(local_run, tmp_path):
    out, _ = local_run
    report = (out / "report.md").read_text()
    assert "resize_vs_length.png" in report and (out / "resize_vs_length.png").exists()
    assert "pareto.png" in report and "Pareto-optimal" in report
    # a synthetic table with hit rates and probe latencies draws the other figures
    df = read_table(out / "results.parquet")
    n = len(df)
    df = df.assign(**{
        "hit_rate": pd.array([0.2 + 0.1 * (i % 4) for i in range(n)], dtype="Float64"),
        "cfg_host_tier_bytes": pd.array([2**30 * (1 + i % 4) for i in range(n)], dtype="Int64"),
        "probe_p99_ms": pd.array([1.0 + i for i in range(n)], dtype="Float64"),
        "cfg_probe_interval_us": pd.array([float(i % 2) * 10 for i in range(n)], dtype="Float64"),
    })
    df.loc[0, "status"] = "error"
    df.loc[0, "error"] = "ValueError: synthetic"
    df.to_parquet(tmp_path / "t.parquet", index=False)
    # the table's directory is not kvsim's: the report goes elsewhere, or nowhere
    assert main(["sweep-report", str(tmp_path / "t.parquet"), "--quiet"]) == 2
    assert not (tmp_path / "report.md").exists()
    assert main(["sweep-report", str(tmp_path / "t.parquet"), "--latency-target-ms", "1000",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    for fig in ("hit_rate_vs_host.png", "probe_p99_vs_interval.png", "pareto.png"):
        assert fig in text and (tmp_path / "r" / fig).exists()
    assert "Cheapest configuration meeting 1000 ms" in text and "synthetic" in text
