"""tools/slim_results.py: slim copies of run directories, none overwriting another."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from conftest import load_tool


def _tool():
    return load_tool("slim_results")


def _run(d: Path, marker: str) -> None:
    d.mkdir(parents=True)
    call = {"index": 0, "api": marker, "latency_ms": 0.123456789, "args": {"tokens": [1, 2, 3]}}
    (d / "results.json").write_text(json.dumps({"scenario": marker, "calls": [call]}))


def test_runs_with_the_same_name_land_apart_and_keep_only_the_kept_fields(tmp_path):
    a, b = tmp_path / "runs" / "a" / "variants" / "buggy", tmp_path / "runs" / "b" / "variants" / "buggy"
    _run(a, "first")
    _run(b, "second")
    dest = tmp_path / "slim"
    assert _tool().main([str(dest), str(a), str(b)]) == 0
    got = {}
    for name in ("a", "b"):
        packed = dest / name / "variants" / "buggy" / "results.json.gz"
        data = json.loads(gzip.decompress(packed.read_bytes()))
        got[name] = data["scenario"]
        (call,) = data["calls"]
        assert "args" not in call and call["latency_ms"] == 0.1235
    assert got == {"a": "first", "b": "second"}


def test_one_run_keeps_its_own_name(tmp_path):
    run = tmp_path / "probe7"
    _run(run, "x")
    assert _tool().main([str(tmp_path / "v"), str(run)]) == 0
    assert (tmp_path / "v" / "probe7" / "results.json.gz").exists()
