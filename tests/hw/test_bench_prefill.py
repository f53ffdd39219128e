"""hw.bench_prefill on the GPU: a tiny run, every point verified (skips without CUDA PyTorch)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


def test_tiny_prefill_run_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    from hw.bench_prefill import main

    assert main(["--out", str(tmp_path), "--tiny", "--samples", "2", "--warmup", "1"]) == 0
    (path,) = tmp_path.glob("*-prefill.json")
    doc = json.loads(path.read_text())
    assert doc["records"] and all(r["verified"] for r in doc["records"])
    assert doc["provenance"]["gpu_name"]
    assert doc["provenance"]["nvml"]["driver_version"]  # raw data names its driver
