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


def test_bucketed_flash_prefills_pad_warm_and_leave_the_real_tokens_output_alone():
    """Call 4's engine: a prefill runs padded to its bucket on the flash kernel; the last real
    token's logits equal those of the unpadded default-dispatch forward (same weights, same
    inputs) to bf16 tolerance; every bucket up to the longest prompt's is warmed; a prefill that
    ends at the buffer's end still fits with its pad."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    from hw.serving_forward import TorchForward
    from kvsim.llm.architectures import LLAMA_3_8B
    from kvsim.llm.engine_time import bucket_list, load_engine_times
    from kvsim.runtime.steps import GpuWork

    arch = dataclasses.replace(LLAMA_3_8B, layers=2)
    plain = load_engine_times("h200-sxm", arch)
    bucketed = dataclasses.replace(plain, prefill_buckets=bucket_list(64, 64, 8, 262144),
                                   prefill_attention="flash")
    fp = TorchForward(arch, plain, "cuda:0", 4096)
    fb = TorchForward(arch, bucketed, "cuda:0", 4096)
    assert fb.engine.prefill_kernel == "flash-lower-right" and fb.pad_room > 0
    for a, b in zip(fp.kbuf + fp.vbuf, fb.kbuf + fb.vbuf):
        b[:4096].copy_(a)
    fb.x[:4096].copy_(fp.x)
    for new, cached in ((300, 1000), (1000, 0), (65, 0)):
        assert bucketed.padded_new(new) > new
        ref, got = fp._prefill(new, cached).float(), fb._prefill(new, cached).float()
        rel = float((got - ref).norm() / ref.norm())
        assert rel < 2e-2, (new, cached, rel)
    fb.warm_up()
    assert fb.warmed_buckets == sum(b <= bucketed.padded_new(4096) for b in bucketed.prefill_buckets)
    fb.run(GpuWork(0.0, 0, ((1025, 3071), (0, 2829), (19, 0)), ()))  # an all-cached prompt
    assert fb._prefill(0, 2829) is None  # runs nothing (the flash kernel refuses no queries)
    fb.run(GpuWork(0.0, 0, ((0, 2829),), ()))  # a pass of only that
    s = fb.summary()
    assert s["padded_tokens"] == (1152 - 1025) + (64 - 19)
    assert s["passes_with_prefill"] == 2
    assert s["not_finite_outputs"] == 0 and s["prefill_attention"] == "flash-lower-right"
    with pytest.raises(ValueError, match="exceeds"):
        fb.run(GpuWork(0.0, 0, ((4096, 1),), ()))
