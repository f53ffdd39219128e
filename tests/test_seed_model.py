"""The simulator reproduces the seed's figures from one parameter set (not a timing test:
simulated milliseconds are deterministic outputs of the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import main
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import run_scenario

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def seed_results():
    return run_scenario(load_scenario_file(REPO / "scenarios/seed/h100_pcie_burst_resize.yaml"))


def test_all_five_seed_variants_within_ten_percent(seed_results):
    variants = seed_results["variants"]
    assert set(variants) == {"before_stats_on", "before_stats_off", "after_stats_on",
                             "after_stats_off", "no_eviction"}
    for name, v in variants.items():
        ref = v["reference"]["metrics"]["resize_p50_ms"]
        assert abs(ref["error_pct"]) <= 10, (name, ref)
    assert variants["no_eviction"]["offloaded_pages"] == 0
    for name in ("before_stats_on", "after_stats_on", "before_stats_off", "after_stats_off"):
        assert variants[name]["offloaded_pages"] == 6380
        assert variants[name]["offloaded_bytes"] == 104_529_920


def test_before_and_after_differ_only_through_the_plans(seed_results):
    """Same hardware and CPU preset for every variant; the per-page statistics commits are
    what make 'before' slower."""
    vr = seed_results["_variant_results"]
    assert {r["hardware"] for r in vr.values()} == {"h100-pcie"}
    assert {r["cpu_model"] for r in vr.values()} == {"kvcm2-cpp"}
    before = [c for c in vr["before_stats_on"]["calls"] if c["phase"] == "growth"][0]
    after = [c for c in vr["after_stats_on"]["calls"] if c["phase"] == "growth"][0]
    # one per page before the fix, one per batch after; the allocation itself stays pending
    assert before["counts"]["stats_commits"] == 6380 and after["counts"]["stats_commits"] == 1
    assert before["counts"]["pages_migrated"] == after["counts"]["pages_migrated"] == 6380
    gap = before["cpu_terms_us"]["stats_scan_units"] - after["cpu_terms_us"]["stats_scan_units"]
    assert gap == pytest.approx((before["latency_ms"] - after["latency_ms"]) * 1e3, rel=1e-6)


def test_run_json_prints_the_variants_table(capsys, tmp_path):
    out = tmp_path / "seed"
    assert main(["run", str(REPO / "scenarios/seed/h100_pcie_burst_resize.yaml"), "--json",
                 "--quiet", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    for name, v in printed["variants"].items():
        assert {"resize_p50_ms", "offloaded_pages", "offloaded_bytes"} <= set(v), name
    assert (out / "variants" / "no_eviction" / "results.json").exists()
    assert (out / "timeline.png").exists() and (out / "report.md").exists()


def test_copy_model_cli_single_and_batch(capsys, tmp_path):
    assert main(["copy-model", "--hardware", "gh200", "--path", "kernel", "--direction", "onboard",
                 "--page-bytes", str(1 << 20), "--pages", "256", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["ctas"] == 12 and one["gbps"] > 300
    batch = tmp_path / "q.jsonl"
    batch.write_text(
        '{"hardware": "h200-sxm", "path": "ce-page", "direction": "offload", '
        '"page_bytes": 536870912, "pages": 1}\n'
        '{"hardware": "h200-sxm", "path": "warp", "page_bytes": 1, "pages": 1}\n')
    assert main(["copy-model", "--batch", str(batch)]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["gbps"] == pytest.approx(55.3, rel=0.01)  # the contiguous CE plateau
    assert "q.jsonl:2" in lines[1]["error"] and "path must be" in lines[1]["error"]
