"""Engine-like forward times of public architectures on this GPU: prefill, decode step and LM
head, the KV cache written and read as a serving engine does (issue 24's engine time model,
fitted by :mod:`kvsim.calibration.engine_fit`; ``hw.bench_prefill`` is calls 1 and 2's bench).

What runs: for each architecture of :data:`kvsim.llm.architectures.ARCHITECTURES`, ``layers``
(default 2) decoder layers at the architecture's per-GPU width, bf16, random weights: the layer
of ``hw.bench_prefill`` (RMSNorm, Q/K/V projections with the KV heads, attention, output
projection, RMSNorm, SwiGLU MLP; no rotary embedding, no tensor-parallel all-reduce).

* prefill: one sequence, ``new`` tokens after ``cached`` ones. Each layer's K/V buffer is
  allocated once at cached + new tokens in an engine's cache layout (tokens, KV heads, head
  size), the cached part random (what onboarding brought); the layer writes the new tokens' K/V
  into the buffer's tail and attends over the whole buffer, without copying or repeating KV
  heads: full attention by ``scaled_dot_product_attention(attn_mask=causal_lower_right(new,
  cached + new), enable_gqa=True)`` (PyTorch dispatches it to the flash kernel, which skips the
  masked blocks, or to the memory-efficient one; with nothing cached the mask is the ordinary
  causal one and the dispatcher may pick cuDNN, which builds a kernel per new sequence length),
  or, with ``--prefill-attention flash``, PyTorch's flash kernel for every prefill (the aten
  op the lower-right mask dispatches to, ``is_causal`` meaning lower right); a sliding window by
  ``flex_attention``,
  compiled, with a block mask of the window (``--window-kernel flex``; with ``none`` windowed
  architectures are left out of prefill). Eager, as engines run prefill.
* decode step: ``batch`` sequences of ``context`` cached tokens, one new token each. Each
  layer's K/V buffer is (batch, S, KV heads, head size), S = context + 1, or with a sliding
  window min(context + 1, window) (the window an engine keeps); the new token's K/V go into its
  last slot; attention by ``scaled_dot_product_attention`` with one query, ``enable_gqa=True``.
  The ``layers`` layers are captured in one CUDA graph and replayed, as engines run decode;
  where capture fails, eager, and the record says which.
* LM head: the final RMSNorm and the product with a hidden x vocab / tensor_parallel matrix
  (a vocab-parallel head's share; the gather of the logits is not run) for ``tokens`` tokens,
  graph-replayed as the decode step.

How it is timed: CUDA events around one forward (prefill) or one replay (decode, head), after
``warmup`` untimed ones; ``samples`` timed, median reported, every sample kept; per-layer time =
median / ``layers``. The first call of each point is timed apart (``first_ms``, CUDA events;
``first_call_s``, the host clock to its end) and a prefill point says whether its new-token
count had run before in the process (``new_seen_before``): a shape's first run against its warm
runs. What is checked: every output has its expected shape and is finite; per
architecture, the engine attention equals an explicit masked reference (``hw.bench_prefill``'s
boolean mask, KV heads repeated) on one small point, to bf16 tolerance. Which kernels ran: the
PyTorch profiler's operator and CUDA kernel names of one prefill and one decode forward per
architecture, recorded with a one-word summary (cudnn, flash, efficient, flex, flex-unfused,
math, cpu).

Memory rule (fixed before measuring): a decode point is dropped, and listed, when its K/V
buffers (2 x layers x batch x S x KV heads x head size x 2 bytes) exceed
:data:`DECODE_KV_BUDGET_BYTES`.

    python3 -m hw.bench_engine --out DIR [--layers 2] [--warmup 5] [--samples 10] [--archs NAME,...]
    python3 -m hw.bench_engine --out DIR --device cpu --tiny   # a smoke test without a GPU
                                                               # (hw.bench_engine.tiny: its shapes)

Writes ``DIR/<YYYY-MM-DD>-engine.json``. The grids are fixed here (``--grid call3``:
:data:`GRID_NEW`, :data:`GRID_CACHED`; ``--grid call4``: :data:`GRID_NEW_CALL4`,
:data:`GRID_CACHED_CALL4`; ``--grid call5``: :data:`GRID_NEW_CALL5`,
:data:`GRID_CACHED_CALL5`; all :data:`GRID_BATCH`, :data:`GRID_CONTEXT`, :data:`GRID_HEAD_TOKENS`),
the fit/judge split in :func:`kvsim.calibration.engine_fit.point_role`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hw.bench_copy import write_doc
from hw.bench_prefill import (
    GRID_CACHED,
    GRID_NEW,
    _layer,
    _mask,
    _rmsnorm,
    architecture_names,
    provenance,
    time_samples,
)
from kvsim.llm.architectures import ARCHITECTURES, Architecture
from kvsim.llm.engine_time import PREFILL_ATTENTION

SCHEMA = "kvsim-engine-bench/1"
# The grids, fixed before any measurement (kvsim.calibration.engine_fit splits each into fit
# and judge points). Prefill: call 1 and 2's grid (hw.bench_prefill). Decode: batches of 1 to
# 256 sequences (issue 24: an engine's decode batch) at contexts of 512 to 32K tokens.
# LM head: the token counts of a decode step's batch, 1 (one prefill's last token) to 256.
GRID_BATCH = (1, 4, 16, 64, 256)
# Call 4's prefill grid (issue 24, reports/validation-h200/ttft/PROTOCOL-4.md): the TTFT slice's
# prompts run to 191,378 tokens and its prefills to 76,331 new after up to 76,288 cached
# (reports/validation-h200/ttft/measured-3/), past call 3's 8192 x 32768. Each new-token count is
# a power of two, so a bucket of every kvsim.llm.engine_time.bucket_list with min 64, multiple 64.
GRID_NEW_CALL4 = (128, 512, 2048, 8192, 32768, 131072)
GRID_CACHED_CALL4 = (0, 4096, 16384, 65536)
# Call 5's prefill grid (mistral-7b-v0.1 only, reports/validation-h200/prefill/PROTOCOL-5.md):
# call 4's without 131,072 new (flex's create_block_mask evaluates the mask densely: 128-192
# GiB, out of memory in call 4), with 65,536 new and 32,768 cached added.
GRID_NEW_CALL5 = (128, 512, 2048, 8192, 32768, 65536)
GRID_CACHED_CALL5 = (0, 4096, 16384, 32768, 65536)
GRID_PREFILL = {"call3": (GRID_NEW, GRID_CACHED), "call4": (GRID_NEW_CALL4, GRID_CACHED_CALL4),
                "call5": (GRID_NEW_CALL5, GRID_CACHED_CALL5)}
GRID_CONTEXT = (512, 2048, 8192, 32768)
GRID_HEAD_TOKENS = (1, 8, 32, 128, 256)
# Tiny grids: 3 x 3, enough points for every fit's terms; prefill token counts multiples of
# 128, flex_attention's block size (its compile failed on the H200 for a 64-query, 4160-key
# point in call 3's smoke run).
TINY_NEW = (128, 256, 384)
TINY_CACHED = (0, 128, 256)
TINY_BATCH = (1, 2, 4)
TINY_CONTEXT = (16, 32, 64)
TINY_HEAD_TOKENS = (1, 4, 8)
# Decode K/V buffers above this are not allocated: 40 GiB, under a third of the H200's 141 GB
# (its datasheet, device notes H200.md), leaving room for weights, activations and the allocator.
DECODE_KV_BUDGET_BYTES = 40 * 2**30
# bf16 tolerance of the attention check: outputs are convex combinations of values ~N(0, 1);
# bf16 keeps 8 bits of mantissa (relative step 2^-8 = 0.4 %), a few roundings: 0.05 absolute.
ATTENTION_TOLERANCE = {"bfloat16": 5e-2, "float32": 1e-4}
PROFILE_KEYWORDS = ("attention", "flash", "fmha", "attn", "flex", "softmax", "bmm", "triton")


def decode_kv_slots(context: int, window: int | None) -> int:
    """KV slots one sequence's buffer holds in a decode step: its context and the new token,
    at most the sliding window."""
    return context + 1 if window is None else min(context + 1, window)


def decode_kv_bytes(arch: Architecture, batch: int, context: int, layers: int) -> int:
    """Bytes of a decode point's K/V buffers, all ``layers`` (bf16: 2 bytes)."""
    return (2 * layers * batch * decode_kv_slots(context, arch.sliding_window)
            * arch.kv_heads_per_gpu * arch.head_dim * 2)


def tiny(arch: Architecture, scale: int = 16) -> Architecture:
    """The smoke test's shape: hidden, MLP and vocab widths / ``scale``; heads, KV heads and head
    size kept (the attention kernels' own shapes: flash and flex need head size >= 16)."""
    return replace(arch, hidden=arch.hidden // scale, ffn=arch.ffn // scale,
                   vocab=arch.vocab // scale)


def _backend(names: list[str], flex: bool) -> str:
    """One word for the attention kernel among profiled operator and kernel names."""
    low = " ".join(names).lower()
    if "for_cpu" in low:
        return "cpu"
    if "cudnn" in low:
        return "cudnn"
    if "flash" in low:
        return "flash"
    if "efficient" in low or "fmha" in low or "cutlass" in low:
        return "efficient"
    if flex and ("flex" in low or "triton" in low):
        return "flex-unfused" if "bmm" in low else "flex"
    return "math"


def _profile(torch: Any, fn: Callable[[], Any], cuda: bool) -> dict:
    """Operator and CUDA kernel names of one call of ``fn`` that name attention work."""
    try:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            fn()
            if cuda:
                torch.cuda.synchronize()
        every = sorted({e.key for e in prof.key_averages()})
        names = [n for n in every if any(k in n.lower() for k in PROFILE_KEYWORDS)]
        return {"names": names, "all_names": every}
    except Exception as e:  # noqa: BLE001 - the profiler is evidence, not the measurement
        return {"names": [], "error": f"{type(e).__name__}: {e}"}


class _Flex:
    """``flex_attention`` over a sliding window, compiled once per run (``torch.compile``; on a
    CPU run, eager: a reference, not a speed). The window's offset (the cached tokens) is a
    tensor read by the mask, so a new point changes a value, not the compiled code."""

    def __init__(self, torch: Any, window: int, device: str) -> None:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.torch, self.window, self.device = torch, window, device
        self.offset = torch.zeros((), dtype=torch.int64, device=device)
        self._create = create_block_mask
        self._attend = (torch.compile(flex_attention) if device.startswith("cuda")
                        else flex_attention)
        offset = self.offset

        def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:  # create_block_mask wants a function
            qpos = q + offset
            return (kv <= qpos) & (kv > qpos - window)

        self.mask_mod = mask_mod

    def for_point(self, new: int, cached: int) -> Callable[[Any, Any, Any], Any]:
        self.offset.fill_(cached)
        bm = self._create(self.mask_mod, None, None, new, cached + new, device=self.device)
        return lambda q, k, v: self._attend(q, k, v, block_mask=bm, enable_gqa=True)


def _flash_lower_right(torch: Any) -> Callable[[Any, Any, Any], Any]:
    """PyTorch's flash kernel, causal aligned to the lower right (the aten op is what
    ``causal_lower_right`` dispatches to when flash can run; its ``is_causal`` means lower
    right), for every prefill: no dispatcher choice, no per-length kernel build."""
    op = torch.ops.aten._scaled_dot_product_flash_attention
    return lambda q, k, v: op(q, k, v, 0.0, True, False)[0]


def _sdpa_lower_right(torch: Any, new: int, cached: int) -> Callable[[Any, Any, Any], Any]:
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(new, cached + new)
    F = torch.nn.functional
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


def _prefill_forward(torch: Any, lw: dict, x: Any, kbuf: Any, vbuf: Any, cached: int,
                     attend: Callable[[Any, Any, Any], Any]) -> Any:
    """One layer over ``x`` (new, hidden); ``kbuf``/``vbuf`` (cached + new, KV heads, head size)."""
    F = torch.nn.functional
    n = x.shape[0]
    nh, nkv, hd = lw["nh"], lw["nkv"], lw["hd"]
    a = _rmsnorm(torch, x)
    q = (a @ lw["q"]).view(1, n, nh, hd).transpose(1, 2)
    kbuf[cached:] = (a @ lw["k"]).view(n, nkv, hd)
    vbuf[cached:] = (a @ lw["v"]).view(n, nkv, hd)
    att = attend(q, kbuf.unsqueeze(0).transpose(1, 2), vbuf.unsqueeze(0).transpose(1, 2))
    x = x + att.transpose(1, 2).reshape(n, nh * hd) @ lw["o"]
    b = _rmsnorm(torch, x)
    return x + (F.silu(b @ lw["gate"]) * (b @ lw["up"])) @ lw["down"]


def _decode_forward(torch: Any, lw: dict, x: Any, kbuf: Any, vbuf: Any) -> Any:
    """One layer's decode step over ``x`` (batch, hidden); ``kbuf``/``vbuf`` (batch, S, KV heads,
    head size), the new token's K/V written into slot S - 1."""
    F = torch.nn.functional
    bsz = x.shape[0]
    nh, nkv, hd = lw["nh"], lw["nkv"], lw["hd"]
    a = _rmsnorm(torch, x)
    q = (a @ lw["q"]).view(bsz, 1, nh, hd).transpose(1, 2)
    kbuf[:, -1] = (a @ lw["k"]).view(bsz, nkv, hd)
    vbuf[:, -1] = (a @ lw["v"]).view(bsz, nkv, hd)
    att = F.scaled_dot_product_attention(q, kbuf.transpose(1, 2), vbuf.transpose(1, 2),
                                         enable_gqa=True)
    x = x + att.transpose(1, 2).reshape(bsz, nh * hd) @ lw["o"]
    b = _rmsnorm(torch, x)
    return x + (F.silu(b @ lw["gate"]) * (b @ lw["up"])) @ lw["down"]


def _time(torch: Any, fn: Callable[[], Any], cuda: bool, warmup: int, samples: int,
          graph: bool) -> tuple[list[float], Any, str]:
    """(samples in ms, the last output, how it ran: ``eager``, ``cuda-graph`` or
    ``eager (graph capture failed: ...)``)."""
    how, call = "eager", fn
    if cuda and graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = fn()

            def call() -> Any:
                g.replay()
                return static_out

            how = "cuda-graph"
        except Exception as e:  # noqa: BLE001 - eager instead, and the record says so
            torch.cuda.synchronize()
            how, call = f"eager (graph capture failed: {type(e).__name__}: {e})", fn
    times, out = time_samples(torch, call, cuda, warmup, samples)
    return times, out, how


def _finite(torch: Any, t: Any, shape: tuple[int, ...]) -> bool:
    return tuple(t.shape) == shape and bool(torch.isfinite(t.float()).all())


def _randn(torch: Any, g: Any, shape: tuple[int, ...], device: str, dtype: Any) -> Any:
    return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)


class Engine:
    """One architecture's random-weight layers and LM head on ``device``."""

    def __init__(self, torch: Any, arch: Architecture, n_layers: int, device: str, dtype: Any,
                 window_kernel: str, prefill_attention: str = "default") -> None:
        self.torch, self.arch, self.device, self.dtype = torch, arch, device, dtype
        self.cuda = device.startswith("cuda")
        self.layers = [_layer(torch, arch, device, dtype) for _ in range(n_layers)]
        self.hidden = arch.hidden
        self.vocab = arch.vocab // arch.tensor_parallel
        g = torch.Generator(device=device).manual_seed(1)
        self.head_w = (_randn(torch, g, (self.hidden, self.vocab), device, dtype) * 0.02).to(dtype)
        window = arch.sliding_window
        self.flex = (_Flex(torch, window, device) if window is not None and window_kernel == "flex"
                     else None)
        if prefill_attention not in PREFILL_ATTENTION:
            raise ValueError(f"prefill_attention must be one of {', '.join(PREFILL_ATTENTION)}, "
                             f"got {prefill_attention!r}")
        # flash is pinned on CUDA only (the CPU has no such kernel: a smoke run keeps the SDPA path)
        self.flash = (_flash_lower_right(torch) if window is None and self.cuda
                      and prefill_attention == "flash" else None)
        self.prefill_kernel = ("flash-lower-right" if self.flash is not None else
                               "sdpa-causal-lower-right" if window is None else
                               "flex-attention-window" if self.flex else None)

    def attend_for(self, new: int, cached: int) -> Callable[[Any, Any, Any], Any]:
        if self.flex is not None:
            return self.flex.for_point(new, cached)
        return self.flash if self.flash is not None else _sdpa_lower_right(self.torch, new, cached)

    def prefill_inputs(self, new: int, cached: int) -> tuple[Any, list[Any], list[Any]]:
        torch, lw = self.torch, self.layers[0]
        g = torch.Generator(device=self.device).manual_seed(new * 7919 + cached)
        x0 = _randn(torch, g, (new, self.hidden), self.device, self.dtype)
        shape = (cached + new, lw["nkv"], lw["hd"])
        kb = [_randn(torch, g, shape, self.device, self.dtype) for _ in self.layers]
        vb = [_randn(torch, g, shape, self.device, self.dtype) for _ in self.layers]
        return x0, kb, vb

    def prefill_fn(self, new: int, cached: int) -> Callable[[], Any]:
        x0, kb, vb = self.prefill_inputs(new, cached)
        attend = self.attend_for(new, cached)

        def run() -> Any:
            x = x0
            for lw, k, v in zip(self.layers, kb, vb):
                x = _prefill_forward(self.torch, lw, x, k, v, cached, attend)
            return x

        return run

    def decode_fn(self, batch: int, context: int) -> Callable[[], Any]:
        torch, lw = self.torch, self.layers[0]
        g = torch.Generator(device=self.device).manual_seed(batch * 7919 + context)
        x0 = _randn(torch, g, (batch, self.hidden), self.device, self.dtype)
        shape = (batch, decode_kv_slots(context, self.arch.sliding_window), lw["nkv"], lw["hd"])
        kb = [_randn(torch, g, shape, self.device, self.dtype) for _ in self.layers]
        vb = [_randn(torch, g, shape, self.device, self.dtype) for _ in self.layers]

        def run() -> Any:
            x = x0
            for lw_, k, v in zip(self.layers, kb, vb):
                x = _decode_forward(torch, lw_, x, k, v)
            return x

        return run

    def head_fn(self, tokens: int) -> Callable[[], Any]:
        torch = self.torch
        g = torch.Generator(device=self.device).manual_seed(tokens)
        x0 = _randn(torch, g, (tokens, self.hidden), self.device, self.dtype)
        return lambda: _rmsnorm(torch, x0) @ self.head_w

    def check_attention(self) -> dict:
        """The engine attention against the explicit masked reference on one small point whose
        mask binds (after the window for a windowed architecture)."""
        torch, lw, F = self.torch, self.layers[0], self.torch.nn.functional
        window = self.arch.sliding_window
        new, cached = 128, (window if window is not None else 256)  # multiples of 128: flex's block
        g = torch.Generator(device=self.device).manual_seed(3)
        q = _randn(torch, g, (1, lw["nh"], new, lw["hd"]), self.device, self.dtype)
        k = _randn(torch, g, (1, lw["nkv"], cached + new, lw["hd"]), self.device, self.dtype)
        v = _randn(torch, g, (1, lw["nkv"], cached + new, lw["hd"]), self.device, self.dtype)
        got = self.attend_for(new, cached)(q, k, v)
        rep = lw["nh"] // lw["nkv"]
        ref = F.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(rep, dim=1), v.float().repeat_interleave(rep, dim=1),
            attn_mask=_mask(torch, new, cached, window, self.device))
        diff = float((got.float() - ref).abs().max())
        tol = ATTENTION_TOLERANCE[str(self.dtype).split(".")[-1]]
        return {"new": new, "cached": cached, "max_abs_diff": diff, "tolerance": tol,
                "ok": diff <= tol and tuple(got.shape) == tuple(ref.shape)}


def _record(mode: str, arch: str, key: dict, times: list[float], layers: int | None, ok: bool,
            how: str, kernel: str | None, first_call_s: float, first_ms: float | None = None) -> dict:
    med = statistics.median(times)
    r = {"mode": mode, "arch": arch, **key, "samples_ms": times, "median_ms": med,
         "verified": ok, "run": how, "first_call_s": round(first_call_s, 3)}
    if first_ms is not None:
        r["first_ms"] = first_ms
    if layers is not None:
        r["layers"] = layers
        r["per_layer_ms"] = med / layers
    if kernel is not None:
        r["attention"] = kernel
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hw.bench_engine", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--archs", default=",".join(ARCHITECTURES))
    ap.add_argument("--modes", default="prefill,decode,head")
    ap.add_argument("--window-kernel", default="flex", choices=("flex", "none"),
                    help="prefill of a sliding-window architecture: compiled flex_attention, or none")
    ap.add_argument("--prefill-attention", default="default", choices=PREFILL_ATTENTION,
                    help="full-attention prefill: SDPA's dispatcher (call 3), or the flash kernel pinned")
    ap.add_argument("--grid", default="call3", choices=tuple(GRID_PREFILL),
                    help="the prefill grid: call 3's (new <= 8192, cached <= 32768), call 4's or 5's")
    ap.add_argument("--no-graph", action="store_true", help="decode and head eager, not graph-replayed")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test: hidden, MLP and vocab widths / 16, small grids")
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args(argv)
    import torch

    names = architecture_names(ap, args.archs)
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"prefill", "decode", "head"}:
        ap.error(f"--modes: prefill, decode, head; got {args.modes}")
    if args.samples < 1 or args.layers < 1:
        ap.error("--samples and --layers must be >= 1")
    scale = 16 if args.tiny else 1
    grids = ({"new": TINY_NEW, "cached": TINY_CACHED, "batch": TINY_BATCH,
              "context": TINY_CONTEXT, "head_tokens": TINY_HEAD_TOKENS} if args.tiny else
             {"new": GRID_PREFILL[args.grid][0], "cached": GRID_PREFILL[args.grid][1],
              "batch": GRID_BATCH, "context": GRID_CONTEXT, "head_tokens": GRID_HEAD_TOKENS})
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    graph = cuda and not args.no_graph
    t0 = time.perf_counter()
    records: list[dict] = []
    problems: list[str] = []
    skipped: list[str] = []
    dropped: list[dict] = []
    left_out: list[str] = []
    backends: dict[str, dict] = {}
    checks: dict[str, dict] = {}

    def point(label: str, mode: str, eng: Engine, key: dict, make: Callable[[], Callable[[], Any]],
              shape: tuple[int, ...], layers: int | None, use_graph: bool, kernel: str | None,
              extra: dict | None = None) -> None:
        if time.perf_counter() - t0 > args.budget_s:
            skipped.append(label)
            return
        first_ms = None
        try:
            fn = make()
            if cuda:
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            f0 = time.perf_counter()
            if cuda:
                e0.record()
            out = fn()
            if cuda:
                e1.record()
                torch.cuda.synchronize()
                first_ms = e0.elapsed_time(e1)
            first = time.perf_counter() - f0
            times, out2, how = _time(torch, fn, cuda, args.warmup, args.samples, use_graph)
            ok = _finite(torch, out, shape) and _finite(torch, out2, shape)
        except Exception as e:  # noqa: BLE001 - an out-of-memory point is reported
            problems.append(f"{label}: {type(e).__name__}: {e}")
            return
        finally:
            if cuda:
                torch.cuda.empty_cache()
        r = _record(mode, eng.arch.name, key, times, layers, ok, how, kernel, first, first_ms)
        r.update(extra or {})
        records.append(r)
        shown = r.get("per_layer_ms", r["median_ms"])
        print(f"{label:50}: {shown:9.4f} ms{'/layer' if layers else ''} [{how[:10]}]"
              f"{'' if ok else '  CHECK FAILED'}", flush=True)

    run_archs = {n: tiny(ARCHITECTURES[n], scale) if args.tiny else ARCHITECTURES[n] for n in names}
    for name in names:
        arch = run_archs[name]
        eng = Engine(torch, arch, args.layers, args.device, dtype, args.window_kernel,
                     args.prefill_attention)
        nl = len(eng.layers)
        backends[name] = {}
        if "prefill" in modes and eng.prefill_kernel is None:
            left_out.append(f"{name} prefill: sliding window and --window-kernel none")
        elif "prefill" in modes:
            try:
                checks[name] = eng.check_attention()
            except Exception as e:  # noqa: BLE001 - reported; the points still run
                checks[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            seen_new: set[int] = set()
            for cached in grids["cached"]:
                for new in grids["new"]:
                    point(f"{name} prefill new={new} cached={cached}", "prefill", eng,
                          {"new": new, "cached": cached},
                          lambda n=new, c=cached, e=eng: e.prefill_fn(n, c), (new, eng.hidden), nl,
                          False, eng.prefill_kernel, {"new_seen_before": new in seen_new})
                    seen_new.add(new)
            # the kernels of a prefill after the longest cache, and of one with nothing cached
            for key, cached in (("prefill", grids["cached"][-1]), ("prefill_uncached", 0)):
                try:
                    prof = _profile(torch, eng.prefill_fn(grids["new"][0], cached), cuda)
                except Exception as e:  # noqa: BLE001
                    prof = {"names": [], "error": f"{type(e).__name__}: {e}"}
                prof["backend"] = _backend(prof["names"], eng.flex is not None)
                backends[name][key] = prof
        if "decode" in modes:
            for context in grids["context"]:
                for batch in grids["batch"]:
                    need = decode_kv_bytes(arch, batch, context, nl)
                    label = f"{name} decode batch={batch} context={context}"
                    if need > DECODE_KV_BUDGET_BYTES:
                        dropped.append({"arch": name, "batch": batch, "context": context,
                                        "kv_bytes": need})
                        print(f"{label:50}: dropped, K/V {need / 2**30:.1f} GiB > budget")
                        continue
                    point(label, "decode", eng, {"batch": batch, "context": context},
                          lambda b=batch, c=context, e=eng: e.decode_fn(b, c), (batch, eng.hidden), nl,
                          graph, "sdpa-decode")
            try:
                prof = _profile(torch, eng.decode_fn(grids["batch"][-1], grids["context"][0]), cuda)
            except Exception as e:  # noqa: BLE001
                prof = {"names": [], "error": f"{type(e).__name__}: {e}"}
            prof["backend"] = _backend(prof["names"], False)
            backends[name]["decode"] = prof
        if "head" in modes:
            for tokens in grids["head_tokens"]:
                point(f"{name} head tokens={tokens}", "head", eng, {"tokens": tokens},
                      lambda t=tokens, e=eng: e.head_fn(t), (tokens, eng.vocab), None, graph, None)
        del eng
        if cuda:
            torch.cuda.empty_cache()
    prov = provenance(torch, args.device)
    doc = {"schema": SCHEMA, "command": "python3 -m hw.bench_engine " + " ".join(argv or sys.argv[1:]),
           "method": (__doc__ or "").split("\n\n", 1)[1].split("\n\n    python3")[0],
           "provenance": prov, "tiny_scale": scale,
           "architectures": {n: run_archs[n].__dict__ for n in names},
           "grid": {k: list(v) for k, v in grids.items()},
           "config": {"layers": args.layers, "warmup": args.warmup, "samples": args.samples,
                      "dtype": str(dtype), "modes": modes, "window_kernel": args.window_kernel,
                      "prefill_attention": args.prefill_attention, "grid": args.grid,
                      "graph": graph, "decode_kv_budget_bytes": DECODE_KV_BUDGET_BYTES},
           "backend": backends, "attention_check": checks,
           "records": records, "problems": problems, "skipped_for_time": skipped,
           "dropped_for_memory": dropped, "left_out": left_out,
           "elapsed_s": round(time.perf_counter() - t0, 1)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{prov['date_utc'][:10]}-engine.json")
    write_doc(doc, None, path, t0)
    bad = sum(not r["verified"] for r in records)
    bad_checks = [n for n, c in checks.items() if not c.get("ok")]
    for n, b in backends.items():
        print(f"{n}: " + ", ".join(f"{m} {p['backend']}" for m, p in b.items()))
    print(f"{len(records)} points, {bad} failed checks, {len(bad_checks)} failed attention checks "
          f"{bad_checks}, {len(problems)} errors, {len(skipped)} skipped, {len(dropped)} dropped "
          f"for memory; {doc['elapsed_s']} s; wrote {path}")
    return 1 if bad or bad_checks or (problems and not records) else 0


if __name__ == "__main__":
    sys.exit(main())
