"""hw.serving_forward on the GPU: real prefills for a serving pass, timed and checked (skips
without CUDA PyTorch). Written 2026-12-04 after the TTFT calls had run the class for real; not
yet run as a test on the device (no device time was left that session)."""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu


def test_a_pass_runs_its_prefills_and_waits_its_decode(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    from hw.serving_forward import TorchForward
    from kvsim.llm.architectures import LLAMA_3_8B
    from kvsim.llm.engine_time import load_engine_times
    from kvsim.runtime.steps import GpuWork

    arch = dataclasses.replace(LLAMA_3_8B, layers=2)
    times = load_engine_times("h200-sxm", arch)
    for wait in ("sleep", "spin"):
        fwd = TorchForward(arch, times, "cuda:0", 4096, decode_wait=wait)
        fwd.warm_up(((128, 0),))
        fwd.run(GpuWork(0.0, 0, ((512, 1024), (256, 0)), (2048, 2048)))
        fwd.run(GpuWork(0.0, 0, (), (2048,)))  # a decode-only pass: no prefill recorded
        s = fwd.summary()
        assert s["passes"] == 2 and s["passes_with_prefill"] == 1
        assert s["not_finite_outputs"] == 0 and s["prefill_s"] > 0
        assert s["per_pass"]["prefills"] == [[[512, 1024], [256, 0]]]
        assert s["decode"] == f"modelled, not run ({wait})"
    with pytest.raises(ValueError, match="exceeds"):
        fwd.run(GpuWork(0.0, 0, ((4096, 1),), ()))
