"""tools/pack_measurements.py: packing raw measurements in place, each checked as it reads back."""

from __future__ import annotations

import json
import lzma

import pytest
from conftest import load_tool

from kvsim.calibration.packed import read_lines


def _runs(times: list[tuple[float, float]]) -> list[dict]:
    return [{"threads": 1, "calls": [["probe0", a, b] for a, b in times],
             "thread_starts": {"probe0": [0.0, 1e-5]}}]


def test_gil_runs_from_a_long_up_host_pack_to_nanoseconds(tmp_path):
    """perf_counter differences on a host up for days carry ~1e-10 s of float quantization
    (0.00021353099873522297 is such a start): they pack to whole nanoseconds, which reads back
    within half a nanosecond, and the original goes."""
    tool = load_tool("pack_measurements")
    times = [(0.00021353099873522297, 0.0004626099980669096), (0.2550588800004334, 0.25505888051)]
    path = tmp_path / "gil-bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _runs(times)))
    dest = tool.pack(path)
    assert dest.name == "gil-bench.jsonl.xz" and not path.exists()
    (back,) = read_lines(dest)
    for (_, a, b), (x, y) in zip(back["calls"], times):
        assert abs(a - x) <= 0.5e-9 + 1e-12 and abs(b - y) <= 0.5e-9 + 1e-12
    assert back["calls"][0][1] == pytest.approx(0.000213531, abs=1e-15)


def test_a_json_file_packs_exactly_and_keeps_nothing_else(tmp_path):
    tool = load_tool("pack_measurements")
    path = tmp_path / "samples.json"
    data = {"a": [1.0000000001, 2], "b": {"c": "d"}}
    path.write_text(json.dumps(data))
    dest = tool.pack(path)
    assert dest.name == "samples.json.xz" and not path.exists()
    assert json.loads(lzma.decompress(dest.read_bytes())) == data
