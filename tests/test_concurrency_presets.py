"""tools/concurrency_preset6.py: PROTOCOL-6's design C from preset A and the call's benchmarks."""

from __future__ import annotations

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
