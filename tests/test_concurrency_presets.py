"""tools/concurrency_preset6.py: PROTOCOL-6's design C from preset A and the call's benchmarks."""

from __future__ import annotations

import json

import pytest
from conftest import load_tool


def _a(speed: float) -> dict:
    return {"name": "p", "description": "d", "host_speed_factor": {"value": speed, "source": "s"},
            "lock_test_us": {"value": 2.0, "source": "bench"},
            "lock_wake_us": {"value": 20.0, "source": "bench"}}


def test_design_c_adds_the_first_test_and_puts_the_lock_terms_at_the_runs_speed():
    tool = load_tool("concurrency_preset6")
    bench = {"derived": {"lock_first_test_us": 10.0}}
    spread = {"probs": [0.0, 1.0], "ratios": [0.5, 2.0], "probes": 8,
              "manager_share_of_probe": 0.7, "upto_median_x": None}
    c = tool.build(_a(0.5), bench, "lb.json", spread, "b400.jsonl")
    # stored divided by the factor: the loader's stretch by 0.5 gives back 2, 20 and 10 us
    assert [c[k]["value"] for k in tool.LOCK_TERMS] == [4.0, 40.0, 20.0]
    assert "lb.json" in c["lock_first_test_us"]["source"]
    assert c["call_cpu_spread"]["value"] == {"probs": [0.0, 1.0], "ratios": [0.5, 2.0]}
    assert c["name"] == "p-c" and c["host_speed_factor"]["value"] == 0.5
    without = tool.build(_a(1.0), bench, "lb.json", None, "")
    assert "call_cpu_spread" not in without and without["lock_test_us"]["value"] == 2.0


def test_a_lock_bench_without_the_first_condition_is_refused_naming_the_file():
    tool = load_tool("concurrency_preset6")
    with pytest.raises(ValueError, match=r"old\.json: derived\.lock_first_test_us: missing"):
        tool.build(_a(1.0), {"derived": {}}, "old.json", None, "")


def test_design_d_takes_the_host_speed_from_the_one_at_a_time_runs(tmp_path):
    import json
    from pathlib import Path

    bench = tmp_path / "b400.jsonl"
    assert load_tool("gil_bench_runs").main([str(bench), "2", "--probes", "30"]) == 0
    preset = Path(__file__).resolve().parents[1] / "kvsim" / "hardware" / "cpu" / "kvsim-python-h200host.json"
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"derived": {"lock_first_test_us": 10.0}}))
    tool = load_tool("concurrency_preset6")
    out_c, out_d = tmp_path / "c.json", tmp_path / "d.json"
    assert tool.main([str(preset), str(lock), str(out_c), str(bench)]) == 0
    assert tool.main([str(preset), str(lock), str(out_d), str(bench), "--speed-from-spread"]) == 0
    c, d = json.loads(out_c.read_text()), json.loads(out_d.read_text())
    shipped = json.loads(preset.read_text()).get("host_speed_factor")
    assert c.get("host_speed_factor") == shipped and d["name"].endswith("-d")
    factor = d["host_speed_factor"]["value"]
    assert factor > 0 and "b400.jsonl" in d["host_speed_factor"]["source"]
    # the first test comes back as measured: stored divided by the factor the loader applies
    assert d["lock_first_test_us"]["value"] == pytest.approx(10.0 / factor, rel=1e-3)


def _measured(root, waits: dict[str, list]) -> str:
    """A measured-runs directory as the concurrency runs write it: manifest, v/CASE/rN."""
    import json

    (root / "manifest.json").write_text(json.dumps({"mode": "hw"}))
    for case, per_run in waits.items():
        for r, wait in enumerate(per_run, 1):
            d = root / "v" / case / f"r{r}"
            d.mkdir(parents=True)
            (d / "results.json").write_text(json.dumps(
                {"starvation": {} if wait is None else {"longest_writer_wait_ms": wait}}))
    return str(root)


def test_design_e_takes_the_first_test_from_the_fit_cases_writer_waits(tmp_path):
    """--first-test-from: the median longest writer wait of the named cases' runs, in us, stored
    divided by the host speed factor like the other lock terms; other cases are not read."""
    tool = load_tool("concurrency_preset6")
    m = _measured(tmp_path, {"probe_starvation.buggy": [0.012, 0.020, None],
                             "probe_starvation.fixed": [0.015, 0.011],
                             "probe_drain.buggy": [9.0, 9.0]})
    value, source = tool.writer_first_test_us(f"{m}:probe_starvation.buggy,probe_starvation.fixed")
    assert value == pytest.approx(13.5) and "median of 4 runs" in source
    bench = {"derived": {"lock_first_test_us": 10.0}}
    e = tool.build(_a(0.5), bench, "lb.json", None, "", "e", (value, source))
    assert e["lock_first_test_us"]["value"] == pytest.approx(27.0) and e["name"] == "p-e"
    assert "probe_starvation.buggy" in e["lock_first_test_us"]["source"]
    with pytest.raises(ValueError, match="has no runs of 'gil_deadlock.buggy'"):
        tool.writer_first_test_us(f"{m}:gil_deadlock.buggy")
    with pytest.raises(ValueError, match="expected MEASURED_DIR:CASE"):
        tool.writer_first_test_us(m)
    with pytest.raises(SystemExit):  # design E is D's terms plus it
        tool.main(["a.json", "lb.json", "out.json", "b.jsonl", "--first-test-from", f"{m}:x"])


def _probe_runs(root, cases: dict[str, tuple[float, list[list[float]]]]) -> str:
    """A measured-runs directory whose runs hold probes: {case: (interval_us, [[ms, ...], ...])}."""
    import json

    (root / "manifest.json").write_text(json.dumps({"mode": "hw"}))
    for case, (interval, per_run) in cases.items():
        for r, latencies in enumerate(per_run, 1):
            d = root / "v" / case / f"r{r}"
            d.mkdir(parents=True)
            calls = [{"api": "KVCacheManager.probe_reuse", "latency_ms": x, "start_ms": 0.0}
                     for x in latencies]
            (d / "results.json").write_text(json.dumps(
                {"calls": calls, "resolved": {"workload": {"probe_interval_us": interval}}}))
    return str(root)


def test_design_f_takes_the_after_sleep_factor_from_the_sleeping_loops_probe_p50(tmp_path):
    """--after-sleep-from: per sleeping case, at its probe interval, its pooled probe p50 over
    the closed loop's; not stretched by the host speed (a ratio); the design's name is F."""
    tool = load_tool("concurrency_preset6")
    closed, s500, s2000 = (f"probe_during_resize.reader_preference.t4.{i}"
                           for i in ("i0", "i500", "i2000"))
    m = _probe_runs(tmp_path, {closed: (0.0, [[0.04, 0.04], [0.05, 0.05, 0.05]]),
                               s2000: (2000.0, [[0.1, 0.1, 0.2]]),
                               s500: (500.0, [[0.09], [0.08, 0.1]]),
                               "probe_during_resize.writer_preference.t4.i500": (500.0, [[0.1]])})
    points, source = tool.after_sleep_factor(f"{m}:{closed},{s2000},{s500}")
    assert points == [[500.0, pytest.approx(0.09 / 0.05)], [2000.0, pytest.approx(0.1 / 0.05)]]
    assert s500 in source and closed in source
    bench = {"derived": {"lock_first_test_us": 10.0}}
    a = _a(0.5) | {"after_sleep_us": {"value": [[500.0, 9.4], [2000.0, 52.2]], "source": "b"}}
    f = tool.build(a, bench, "lb.json", None, "", "f", (13.0, "w"), (points, source))
    assert f["after_sleep_factor"] == {"value": points, "source": source} and f["name"] == "p-f"
    assert "after_sleep_us" not in f  # the factor holds the whole after-sleep cost
    e = tool.build(a, bench, "lb.json", None, "", "e", (13.0, "w"))
    assert e["after_sleep_us"] == a["after_sleep_us"]  # design E keeps it
    for spec, says in ((f"{m}:{s500},{s2000}", "must be a closed loop"),
                       (f"{m}:{closed}", "name the closed loop, then"),
                       (f"{m}:{closed},{s500},probe_during_resize.writer_preference.t4.i500",
                        "not a new sleep"),
                       (f"{m}:{closed},{s500},{s500}", "a case named twice")):
        with pytest.raises(ValueError, match=says):
            tool.after_sleep_factor(spec)
    with pytest.raises(SystemExit):  # design F is E's terms plus it
        tool.main(["a.json", "lb.json", "out.json", "b.jsonl", "--speed-from-spread",
                   "--after-sleep-from", f"{m}:{closed},{s500}"])


def test_design_g_takes_the_measured_gil_free_share_of_the_copy_submission(tmp_path):
    """--submit-gil-free-from: tools/copy_submit_gil_share.py's pooled share, named with the
    file, GPU and driver; refused from a run whose controls failed or with no share in 0..1."""
    tool = load_tool("concurrency_preset6")
    run = {"scenario": "scenarios/bugs/gil_deadlock.yaml", "when": "2026-12-06T14:00:00+00:00",
           "machine": {"gpu": "NVIDIA H100 80GB HBM3", "driver": 13000},
           "gil_release": {"method": "ok: the controls were told apart"},
           "pooled": {"share": 0.61237, "batches": 480}}
    f = tmp_path / "share.json"
    f.write_text(json.dumps(run))
    value, source = tool.submit_gil_free(f)
    assert value == 0.6124
    assert str(f) in source and "480 batch" in source and "H100" in source and "13000" in source
    g = tool.build(_a(0.5), {"derived": {"lock_first_test_us": 10.0}}, "lb.json", None, "", "g",
                   (13.0, "w"), ([[500.0, 1.7]], "s"), (value, source))
    assert g["copy_submit_gil_free"] == {"value": 0.6124, "source": source} and g["name"] == "p-g"
    for change, says in (({"gil_release": {"method": "failed: the controls were not told apart"}},
                          "gil_release.method: failed"),
                         ({"gil_release": {}}, "not checked"),
                         ({"pooled": {"share": 1.2}}, "pooled.share: a share, 0 to 1, got 1.2"),
                         ({"pooled": {}}, "got None")):
        f.write_text(json.dumps(run | change))
        with pytest.raises(ValueError, match=says):
            tool.submit_gil_free(f)
    with pytest.raises(SystemExit):  # design G is F's terms plus it
        tool.main(["a.json", "lb.json", "out.json", "b.jsonl", "--speed-from-spread",
                   "--first-test-from", "m:c", "--submit-gil-free-from", str(f)])


def test_no_call_costs_drops_the_per_method_costs_and_nothing_else():
    tool = load_tool("concurrency_preset6")
    src = {"source": "s"}
    preset = _a(1.0) | {"per_call_us": {"value": 20.0, **src},
                        "api_call_us": {"value": {"KvCache.resize": 90.0}, **src},
                        "unit_us": {"pages_allocated": {"value": 0.1, **src},
                                    "eviction_rounds": {"value": 80.0, **src}}}
    out = tool.without_call_costs(preset)
    assert "api_call_us" not in out and out["unit_us"] == {"pages_allocated": {"value": 0.1, **src}}
    assert out["per_call_us"] == preset["per_call_us"] and out["name"] == "p-no-call-costs"
    assert "api_call_us" in preset  # the input is left as it was


def test_bad_inputs_are_refused_naming_the_file_before_anything_is_written(tmp_path, capsys):
    """A missing preset, a preset that is not JSON and a lock bench without ``derived``: exit 2,
    the file named, no output file."""
    import json

    tool = load_tool("concurrency_preset6")
    out = tmp_path / "out.json"
    bench = tmp_path / "b.jsonl"
    bench.write_text("")
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"free": {}}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for preset, named in ((tmp_path / "missing.json", "missing.json"), (bad, "bad.json: not JSON")):
        assert tool.main([str(preset), str(lock), str(out), str(bench)]) == 2
        assert named in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match=r"lock\.json: derived: missing"):
        tool.build(_a(1.0), {"free": {}}, "lock.json", None, "")
