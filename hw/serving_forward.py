"""Real forward passes for a serving engine on the hardware executor (``hw.forward: torch``).

:class:`TorchForward` runs each :class:`~kvsim.runtime.steps.GpuWork` of
:mod:`kvsim.serving.engine` on the GPU with PyTorch: every admitted request's prefill is a
forward of ``new`` tokens after ``cached`` ones through the architecture's random-weight decoder
layers (``hw.bench_engine``'s engine layers and attention: the new K/V written into the tail of
a preallocated buffer, flash-style attention over the cached and new tokens), then the LM head
on its last token; then the decode step, which is **not** run: the thread waits the engine
times' decode seconds (the decode model is judged by ``hw.bench_engine`` alone; this mode
measures queueing, onboarding and prefill). ``decode_wait`` says how: ``sleep`` (the GPU idles,
and an idle H200 lowers its clocks) or ``spin`` (every SM spins that long,
:func:`hw.gpu_clocks.keep_busy`, as a real decode step would keep the GPU busy). Before each
pass's prefills the SM clock is read (NVML), kept per pass.

Bounded shapes (call 4 of the TTFT validation): where the engine-times file has
``prefill_buckets`` (:mod:`kvsim.llm.engine_time`), a prefill of ``new`` tokens runs
``times.padded_new(new)`` tokens: the pad tokens after the real ones are projected, attend
(causally: the real tokens never see them) and go through the MLP as real tokens would, and the
LM head reads the last real token; :meth:`TorchForward.warm_up` first runs every bucket up to the
longest prompt's (one layer each: the layers' shapes are the same), so the run meets no new
matrix shape. Where the file says ``prefill_attention: flash``, every full-attention prefill runs
PyTorch's flash kernel (``hw.bench_engine``'s ``--prefill-attention flash``), not the SDPA
dispatcher's choice: with nothing cached the dispatcher is free to pick cuDNN, which builds an
execution plan for every new sequence length (the inferred cause of calls 1-3's first-run cost:
``reports/validation-h200/ttft/PROTOCOL-4.md``).
The simulator prices the padded count with the same file.

The cached tokens' K/V come from one buffer per layer, preallocated at the longest prompt (plus
the widest pad) and filled with random values once (their values do not change the time). What
is checked: every pass's output is finite (once per pass, on its last request). Timed: the
executor's clock around the whole pass (:class:`~kvsim.runtime.steps.GpuTimes`); the prefill
part also with CUDA events, kept in :meth:`TorchForward.summary`.
"""

from __future__ import annotations

import time

from hw.bench_engine import Engine, _prefill_forward, _randn, _rmsnorm
from kvsim.llm.architectures import Architecture
from kvsim.llm.engine_time import EngineTimes


class _SmClock:
    """The SM clock by NVML, one session for the run (a read is tens of microseconds)."""

    def __init__(self, device: int) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(device)
        except Exception:  # noqa: BLE001 - no NVML: the clock is not recorded
            self._nv = None

    def read(self) -> int | None:
        if self._nv is None:
            return None
        try:
            return int(self._nv.nvmlDeviceGetClockInfo(self._h, self._nv.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - one lost reading
            return None


def _pads(buckets: tuple[int, ...], max_tokens: int):
    """(new, bucket) of the widest pad below each bucket up to ``max_tokens``: one token past the
    bucket before (the pad of ``new`` is at most ``bucket - new``)."""
    prev = 0
    for b in buckets:
        if prev >= max_tokens:
            break
        yield prev + 1, b
        prev = b


class TorchForward:
    def __init__(self, arch: Architecture, times: EngineTimes, device: str,
                 max_tokens: int, decode_wait: str = "sleep") -> None:
        import torch

        if decode_wait not in ("sleep", "spin"):
            raise ValueError(f"decode_wait must be sleep or spin, got {decode_wait!r}")
        self.torch, self.times, self.device, self.decode_wait = torch, times, device, decode_wait
        self._clock = _SmClock(int(device.split(":")[-1]))
        torch.cuda.set_device(device)
        self.engine = Engine(torch, arch, arch.layers, device, torch.bfloat16, "flex",
                             times.prefill_attention)
        lw = self.engine.layers[0]
        g = torch.Generator(device=device).manual_seed(11)
        # a prefill after `cached` tokens writes its padded count: room for the largest pad
        pad_room = max((b - n for n, b in _pads(times.prefill_buckets, max_tokens)), default=0)
        shape = (max_tokens + pad_room, lw["nkv"], lw["hd"])
        self.kbuf = [_randn(torch, g, shape, device, torch.bfloat16) for _ in self.engine.layers]
        self.vbuf = [_randn(torch, g, shape, device, torch.bfloat16) for _ in self.engine.layers]
        self.x = _randn(torch, g, (max_tokens + pad_room, arch.hidden), device, torch.bfloat16)
        self.max_tokens = max_tokens
        self.pad_room = pad_room
        self.padded_tokens = 0  # pad tokens run in the measured passes
        self.prefill_ms: list[float] = []  # CUDA-event time of each pass's prefills
        self.pass_prefills: list[list] = []  # per pass with prefills: [(new, cached), ...]
        self.pass_clock_mhz: list[int | None] = []  # SM clock just before those prefills
        self.passes = 0
        self.not_finite = 0

    def _prefill(self, new: int, cached: int, layers: int | None = None):
        """One prefill of ``new`` tokens (run padded to its bucket) after ``cached``; the LM head
        on the last real token. ``layers``: the first N layers only (the warm-up's). A prompt
        that is all cached (``new`` 0) runs nothing and returns None, as the engine times price
        it (0 s): the flash kernel over no query fails (call 4's first host_800k run stopped with
        CUDA "invalid argument" at such a prompt)."""
        if cached + new > self.max_tokens:
            raise ValueError(f"a prefill of {new} after {cached} tokens exceeds the "
                             f"{self.max_tokens}-token buffers")
        if new <= 0:
            return None
        run = self.times.padded_new(new)
        total = cached + run
        eng = self.engine
        attend = eng.attend_for(run, cached)
        x = self.x[:run]
        for lw, k, v in list(zip(eng.layers, self.kbuf, self.vbuf))[:layers]:
            x = _prefill_forward(self.torch, lw, x, k[:total], v[:total], cached, attend)
        return _rmsnorm(self.torch, x[new - 1:new]) @ eng.head_w

    def run(self, work) -> None:
        """One pass: the prefills for real, then the decode step's modelled seconds."""
        torch = self.torch
        if work.prefills:
            self.pass_clock_mhz.append(self._clock.read())
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = None
            for new, cached in work.prefills:
                got = self._prefill(new, cached)
                out = out if got is None else got
                self.padded_tokens += self.times.padded_new(new) - new
            end.record()
            end.synchronize()
            self.prefill_ms.append(start.elapsed_time(end))
            self.pass_prefills.append([list(p) for p in work.prefills])
            if out is not None and not bool(torch.isfinite(out.float()).all()):
                self.not_finite += 1
        self.passes += 1
        decode = self.times.decode_seconds(list(work.decode))
        if decode > 0 and self.decode_wait == "spin":
            from hw.gpu_clocks import keep_busy

            keep_busy(decode * 1e3)
        elif decode > 0:
            time.sleep(decode)

    WARM_SHAPES = ((128, 0), (2048, 0), (2048, 4096), (8192, 8192))
    # with buckets: small buckets also after a cache (the flash kernel's split-KV variant runs
    # for few queries over many keys), with a key count off the kernel's 128-token block
    WARM_CACHED = (4096 + 32, 32768 + 32)
    WARM_CACHED_UP_TO = 2048

    def warm_up(self, shapes=WARM_SHAPES) -> None:
        """Kernel selection and allocator warm-up before the measured threads start. With
        buckets: every bucket up to the longest prompt's, one layer each, nothing cached (the
        bucket's matrix shapes and allocations; the full-length forwards' cost is the largest
        bucket's layer); buckets up to :data:`WARM_CACHED_UP_TO` also after each of
        :data:`WARM_CACHED`; then ``shapes`` through every layer."""
        t0 = time.perf_counter()
        self.warmed_buckets = 0
        for b in self.times.prefill_buckets:
            if b > self.times.padded_new(self.max_tokens):
                break
            self._prefill(min(b, self.max_tokens), 0, layers=1)
            self.warmed_buckets += 1
            if b <= self.WARM_CACHED_UP_TO:
                for cached in self.WARM_CACHED:
                    if cached + b <= self.max_tokens:
                        self._prefill(b, cached, layers=1)
        for new, cached in shapes:
            if new + cached <= self.max_tokens:
                self._prefill(new, cached)
        self.torch.cuda.synchronize()
        self.warm_up_s = time.perf_counter() - t0

    def summary(self) -> dict:
        return {"passes": self.passes, "passes_with_prefill": len(self.prefill_ms),
                "prefill_s": sum(self.prefill_ms) / 1e3, "not_finite_outputs": self.not_finite,
                "decode": f"modelled, not run ({self.decode_wait})",
                "layers": len(self.engine.layers),
                "buffer_tokens": self.max_tokens,
                "prefill_attention": self.engine.prefill_kernel,
                "buckets": len(self.times.prefill_buckets),
                "warmed_buckets": getattr(self, "warmed_buckets", None),
                "warm_up_s": round(getattr(self, "warm_up_s", 0.0), 3),
                "padded_tokens": self.padded_tokens,
                "per_pass": {"prefills": self.pass_prefills,
                             "prefill_ms": [round(t, 4) for t in self.prefill_ms],
                             "sm_clock_mhz": self.pass_clock_mhz}}
