"""Prefill time of public architectures on this GPU: forward passes of randomly initialised
decoder layers over a grid of new and cached token counts (issue 24's prefill model).

What runs: for each architecture of :data:`kvsim.llm.architectures.ARCHITECTURES`, ``layers``
(default 2) decoder layers at the architecture's per-GPU width (its tensor-parallel share of the
heads, KV heads and MLP; the all-reduce of tensor parallelism is not run), bf16, random weights:
RMSNorm, Q/K/V projections (grouped-query: K and V with the KV heads), rotary-free attention by
``torch.nn.functional.scaled_dot_product_attention`` over the cached and the new tokens with a
boolean mask (causal, offset by the cached tokens; within ``sliding_window`` where the
architecture has one), the output projection, RMSNorm and a SwiGLU MLP. The cached tokens' K and
V are random tensors already on the GPU (what onboarding would have brought). One sequence.

How it is timed: CUDA events around the forward of all ``layers`` layers, after ``warmup``
untimed forwards; ``samples`` timed forwards, median reported, every sample kept; the per-layer
time is the median over ``layers``. What is checked: the output has the input's shape and is
finite.

    python3 -m hw.bench_prefill --out DIR [--layers 2] [--samples 5] [--archs NAME,...]
    python3 -m hw.bench_prefill --out DIR --device cpu --tiny   # a smoke test without a GPU

Writes ``DIR/<YYYY-MM-DD>-prefill.json``. The grid is fixed here (:data:`GRID_NEW`,
:data:`GRID_CACHED`), the fit/judge split in :func:`kvsim.calibration.prefill_fit.role`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from hw.bench_copy import write_doc
from kvsim.llm.architectures import ARCHITECTURES, Architecture

SCHEMA = "kvsim-prefill/1"
# The grid, fixed before any measurement (kvsim.calibration.prefill_fit splits it into fit and
# judge points): prompt chunks up to 8K tokens after up to 32K cached tokens.
GRID_NEW = (128, 512, 2048, 8192)
GRID_CACHED = (0, 4096, 16384, 32768)
TINY_NEW = (16, 32, 64)
TINY_CACHED = (0, 64, 128)


def _layer(torch: Any, arch: Architecture, device: str, dtype: Any, scale: int = 1) -> dict:
    """Random weights of one decoder layer at the architecture's per-GPU width (``scale``
    divides every width, for the tiny smoke test)."""
    h = arch.hidden // scale
    hd = arch.head_dim // scale
    nh, nkv, f = arch.heads_per_gpu, arch.kv_heads_per_gpu, arch.ffn_per_gpu // scale
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

    return {"q": w(h, nh * hd), "k": w(h, nkv * hd), "v": w(h, nkv * hd), "o": w(nh * hd, h),
            "gate": w(h, f), "up": w(h, f), "down": w(f, h), "nh": nh, "nkv": nkv, "hd": hd}


def _rmsnorm(torch: Any, x: Any) -> Any:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)


def _forward(torch: Any, lw: dict, x: Any, k_cache: Any, v_cache: Any, mask: Any) -> Any:
    F = torch.nn.functional
    n = x.shape[0]
    nh, nkv, hd = lw["nh"], lw["nkv"], lw["hd"]
    a = _rmsnorm(torch, x)
    q = (a @ lw["q"]).view(n, nh, hd).transpose(0, 1)
    k = torch.cat([k_cache, (a @ lw["k"]).view(n, nkv, hd).transpose(0, 1)], dim=1)
    v = torch.cat([v_cache, (a @ lw["v"]).view(n, nkv, hd).transpose(0, 1)], dim=1)
    rep = nh // nkv
    k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
    att = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                         attn_mask=mask).squeeze(0)
    x = x + att.transpose(0, 1).reshape(n, nh * hd) @ lw["o"]
    b = _rmsnorm(torch, x)
    return x + (F.silu(b @ lw["gate"]) * (b @ lw["up"])) @ lw["down"]


def _mask(torch: Any, new: int, cached: int, window: int | None, device: str) -> Any:
    q = torch.arange(new, device=device)[:, None] + cached
    kpos = torch.arange(cached + new, device=device)[None, :]
    allowed = kpos <= q
    if window is not None:
        allowed &= kpos > q - window
    return allowed


def time_samples(torch: Any, call: Callable[[], Any], cuda: bool, warmup: int,
                 samples: int) -> tuple[list[float], Any]:
    """``warmup`` untimed calls, then ``samples`` timed ones: CUDA events around each on a GPU,
    ``perf_counter`` on the CPU. Returns the times in ms and the last call's output."""
    for _ in range(warmup):
        call()
    times, out = [], None
    for _ in range(samples):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = call()
            times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def provenance(torch: Any, device: str) -> dict[str, Any]:
    """Date, Python, PyTorch and device; on a GPU also its name, CUDA and the NVML snapshot
    (driver version, clocks, link)."""
    prov: dict[str, Any] = {"date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "python": platform.python_version(), "torch": torch.__version__,
                            "device": device}
    if device.startswith("cuda"):
        from hw.bench_copy import nvml_snapshot

        prov["gpu_name"] = torch.cuda.get_device_name(0)
        prov["cuda"] = torch.version.cuda
        prov["nvml"] = nvml_snapshot(torch.cuda.current_device())
    return prov


def architecture_names(ap: argparse.ArgumentParser, text: str) -> list[str]:
    """``--archs``: comma-separated names of kvsim.llm.architectures (an unknown one is the
    parser's error)."""
    names = [a for a in text.split(",") if a]
    unknown = [a for a in names if a not in ARCHITECTURES]
    if unknown:
        ap.error(f"--archs: unknown {unknown}; known: {', '.join(ARCHITECTURES)}")
    return names


def measure_point(torch: Any, layers: list[dict], arch: Architecture, new: int, cached: int,
                  device: str, dtype: Any, warmup: int, samples: int, scale: int) -> dict:
    lw = layers[0]
    h = arch.hidden // scale
    g = torch.Generator(device=device).manual_seed(new * 7919 + cached)
    x0 = torch.randn(new, h, generator=g, device=device, dtype=torch.float32).to(dtype)
    kc = [torch.randn(lw["nkv"], cached, lw["hd"], generator=g, device=device,
                      dtype=torch.float32).to(dtype) for _ in layers]
    vc = [torch.randn(lw["nkv"], cached, lw["hd"], generator=g, device=device,
                      dtype=torch.float32).to(dtype) for _ in layers]
    mask = _mask(torch, new, cached, arch.sliding_window, device)

    def run() -> Any:
        x = x0
        for lw_, k_, v_ in zip(layers, kc, vc):
            x = _forward(torch, lw_, x, k_, v_, mask)
        return x

    times, out = time_samples(torch, run, device.startswith("cuda"), warmup, samples)
    ok = tuple(out.shape) == (new, h) and bool(torch.isfinite(out.float()).all())
    med = statistics.median(times)
    return {"arch": arch.name, "new": new, "cached": cached, "layers": len(layers),
            "samples_ms": times, "median_ms": med, "per_layer_ms": med / len(layers),
            "verified": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hw.bench_prefill", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--archs", default=",".join(ARCHITECTURES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="smoke test: widths / 16, a small grid")
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args(argv)
    import torch

    names = architecture_names(ap, args.archs)
    scale = 16 if args.tiny else 1
    grid_new, grid_cached = (TINY_NEW, TINY_CACHED) if args.tiny else (GRID_NEW, GRID_CACHED)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    t0 = time.perf_counter()
    records, problems, skipped = [], [], []
    for name in names:
        arch = ARCHITECTURES[name]
        layers = [_layer(torch, arch, args.device, dtype, scale) for _ in range(args.layers)]
        for cached in grid_cached:
            for new in grid_new:
                if time.perf_counter() - t0 > args.budget_s:
                    skipped.append(f"{name} new={new} cached={cached}")
                    continue
                try:
                    r = measure_point(torch, layers, arch, new, cached, args.device, dtype,
                                      args.warmup, args.samples, scale)
                except Exception as e:  # noqa: BLE001 - an out-of-memory point is reported
                    problems.append(f"{name} new={new} cached={cached}: {type(e).__name__}: {e}")
                    continue
                records.append(r)
                print(f"{name:18} new {new:6} cached {cached:6}: {r['per_layer_ms']:8.3f} ms/layer"
                      f"{'' if r['verified'] else '  CHECK FAILED'}", flush=True)
        del layers
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    prov = provenance(torch, args.device)
    doc = {"schema": SCHEMA, "command": "python3 -m hw.bench_prefill " + " ".join(argv or sys.argv[1:]),
           "method": (__doc__ or "").split("\n\n", 1)[1].split("\n\n    python3")[0],
           "provenance": prov, "tiny_scale": scale,
           "architectures": {n: ARCHITECTURES[n].__dict__ for n in names},
           "grid": {"new": list(grid_new), "cached": list(grid_cached)},
           "config": {"layers": args.layers, "warmup": args.warmup, "samples": args.samples,
                      "dtype": str(dtype)},
           "records": records, "problems": problems, "skipped_for_time": skipped,
           "elapsed_s": round(time.perf_counter() - t0, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{prov['date_utc'][:10]}-prefill.json")
    write_doc(doc, None, path, t0)
    bad = sum(not r["verified"] for r in records)
    print(f"{len(records)} points, {bad} failed checks, {len(problems)} errors, {len(skipped)} "
          f"skipped; {doc['elapsed_s']} s; wrote {path}")
    return 1 if bad or (problems and not records) else 0


if __name__ == "__main__":
    sys.exit(main())

