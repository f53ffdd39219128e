"""Host<->device copy measurements for the simulator's hardware presets (nvbandwidth style).

Usage::

    python3 -m hw.bench_copy --out DIR [--quick] [--device N] [--seed S] [--budget-s SECONDS]

Writes ``DIR/<YYYY-MM-DD>-copy-bench.json`` (UTC date) with provenance and every raw sample, and
prints a summary table last. Exit status 1 when any configuration failed its data check or any
section raised (so ``--quick && full`` stops after a bad smoke run).

Every measurement is named ``<src>_to_<dst>_<mechanism>`` and states what it moves and how it is
timed:

* **Buffers.** Two device buffers (``cudaMalloc`` through CuPy) and two pinned *mapped* host buffers
  (``cudaHostAlloc(n, cudaHostAllocMapped)``) of the same size ("pool"). Sources are filled with
  pseudo-random bytes (splitmix64); destinations are poisoned with 0xA5 before each configuration.
  Host->device copies read host buffer A into device buffer B; device->host copies read device
  buffer A into host buffer B; "both at once" runs the two on two non-blocking streams.
* **Timing.** CUDA events recorded on the copy stream around the copies. ``cuda_events_gated``: a
  one-thread kernel holds the stream (spinning on a mapped host flag) while the host enqueues every
  copy, then the flag releases it, so the events bracket device execution only (host issue cost
  excluded; a gate that times out marks the sample invalid). ``cuda_events_issue``: no gate, the
  events bracket the host issuing the copies too (what a caller that issues and waits sees). Warm-up
  samples first (discarded), then ``samples`` timed samples; the median is reported and every sample
  is kept. GB/s = 1e9 bytes/s; bytes = bytes moved in one direction (payload, counted once).
* **Check.** After each configuration the destination pages are compared with the source pages
  they came from, and destination slots that no page targeted must still hold the poison.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from typing import Any

KiB = 1024
MiB = 1024 * KiB
POISON = 0xA5
GATE_TIMEOUT_NS = 2_000_000_000
# The gate holds the stream while the host enqueues; the driver's command queue only takes so many
# copies before the host blocks (seen on H200: 1536 per-page cudaMemcpyAsync calls overflowed, 384
# did not; a 24576-copy cudaMemcpyBatchAsync call sometimes did). Gated samples therefore time the
# first GATED_PERPAGE_MAX / GATED_BATCH_MAX pages of the batch; the issue-inclusive samples use all.
GATED_PERPAGE_MAX = 256
GATED_BATCH_MAX = 4096

HOST = "host"      # pinned + mapped host memory (cudaHostAllocMapped)
DEVICE = "device"  # cudaMalloc'd device memory


def _fmt_bytes(n: int) -> str:
    if n % MiB == 0:
        return f"{n // MiB}M"
    if n % KiB == 0:
        return f"{n // KiB}K"
    return f"{n}B"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import cupy
        import numpy as np

        from hw import copy_engine, copy_kernels

        self.cp = cupy
        self.np = np
        self.ce = copy_engine
        self.ck = copy_kernels
        self.args = args
        self.quick = bool(args.quick)
        self.dev = int(args.device)
        self.t_start = time.perf_counter()
        self.deadline = self.t_start + float(args.budget_s)
        self.records: list[dict] = []
        self.problems: list[str] = []
        self.skipped: list[str] = []
        self.failed_checks = 0
        self.section_errors = 0
        self.rng = np.random.default_rng(args.seed)
        self.warmup = 1 if self.quick else 2
        self.samples = 5 if self.quick else 9

        cupy.cuda.Device(self.dev).use()
        self.pool = (256 if self.quick else 512) * MiB
        rt = cupy.cuda.runtime
        self._host_ptrs: list[int] = []
        self.h_a = self._host_alloc(self.pool)
        self.h_b = self._host_alloc(self.pool)
        self.gate_ptr = self._host_alloc(4096)
        self.gate = np.ctypeslib.as_array((ctypes.c_int32 * 2).from_address(self.gate_ptr))
        self.gate[:] = 0
        self.d_a_arr = cupy.empty(self.pool, dtype=cupy.uint8)
        self.d_b_arr = cupy.empty(self.pool, dtype=cupy.uint8)
        self.d_a = int(self.d_a_arr.data.ptr)
        self.d_b = int(self.d_b_arr.data.ptr)
        self.h_a_arr = self._host_view(self.h_a, self.pool)
        self.h_b_arr = self._host_view(self.h_b, self.pool)
        self.s1 = cupy.cuda.Stream(non_blocking=True)
        self.s2 = cupy.cuda.Stream(non_blocking=True)
        self._fill = cupy.ElementwiseKernel(
            "uint64 seed", "uint64 y",
            """
            unsigned long long z = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            y = z ^ (z >> 31);
            """,
            "kvsim_splitmix_fill")
        self._fill(np.uint64(args.seed * 2 + 1), self.d_a_arr.view(cupy.uint64))
        self._fill(np.uint64(args.seed * 2 + 2), self.h_a_arr.view(cupy.uint64))
        rt.deviceSynchronize()
        self.batcher = copy_engine.BatchCopier(device=self.dev)
        # compile everything once, outside any timed region
        for name in [copy_kernels.GATE, copy_kernels.SIMPLE_U32, copy_kernels.SIMPLE_U8]:
            copy_kernels.get_kernel(name)

    # ------------------------------------------------------------------ memory helpers
    def _host_alloc(self, n: int) -> int:
        from hw.cuda_check import cupy_call

        ptr = int(cupy_call(f"cudaHostAlloc({n}, cudaHostAllocMapped)",
                            self.cp.cuda.runtime.hostAlloc, n, 2))
        self._host_ptrs.append(ptr)
        return ptr

    def _host_view(self, ptr: int, n: int) -> Any:
        cp = self.cp
        mem = cp.cuda.UnownedMemory(ptr, n, self, device_id=self.dev)
        return cp.ndarray((n,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))

    def close(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()
        for p in self._host_ptrs:
            try:
                self.cp.cuda.runtime.freeHost(p)
            except Exception:
                pass
        self._host_ptrs.clear()

    def buffers(self, direction: str) -> tuple[int, Any, int, Any, str, str]:
        """(src_ptr, src_arr, dst_ptr, dst_arr, src_kind, dst_kind) for 'h2d' / 'd2h' / 'd2d'."""
        if direction == "h2d":
            return self.h_a, self.h_a_arr, self.d_b, self.d_b_arr, HOST, DEVICE
        if direction == "d2h":
            return self.d_a, self.d_a_arr, self.h_b, self.h_b_arr, DEVICE, HOST
        if direction == "d2d":
            return self.d_a, self.d_a_arr, self.d_b, self.d_b_arr, DEVICE, DEVICE
        raise ValueError(direction)

    def poison(self, *arrs: Any) -> None:
        for a in arrs:
            a.fill(POISON)
        self.cp.cuda.runtime.deviceSynchronize()

    # ------------------------------------------------------------------ timing
    def time_left(self) -> float:
        return self.deadline - time.perf_counter()

    def measure(self, work: list[tuple[Any, Any]], gated: bool) -> dict:
        """Run warm-up + timed samples of ``work`` = [(stream, enqueue_fn), ...] (one per stream).

        Returns dict with per-stream ms lists, aggregate ms list (first start to last end), host
        enqueue ms, gate timeouts. Samples whose gate timed out are kept but flagged.
        """
        cp = self.cp
        out: dict[str, Any] = {"stream_ms": [[] for _ in work], "aggregate_ms": [],
                               "host_enqueue_ms": [], "host_total_ms": [], "gate_timed_out": []}
        for it in range(self.warmup + self.samples):
            starts = [cp.cuda.Event() for _ in work]
            ends = [cp.cuda.Event() for _ in work]
            if gated:
                self.gate[0] = 0
                self.gate[1] = 0
                for s, _ in work:
                    self.ck.launch_gate(self.gate_ptr, GATE_TIMEOUT_NS, s)
            for (s, _), ev in zip(work, starts):
                ev.record(s)
            h0 = time.perf_counter()
            for _, fn in work:
                fn()
            h1 = time.perf_counter()
            for (s, _), ev in zip(work, ends):
                ev.record(s)
            if gated:
                self.gate[0] = 1
            for s, _ in work:
                s.synchronize()
            h2 = time.perf_counter()
            timed_out = bool(self.gate[1]) if gated else False
            if gated and it == 0 and timed_out:
                out["gate_overflow"] = True
                return out
            if it < self.warmup:
                continue
            per = [cp.cuda.get_elapsed_time(a, b) for a, b in zip(starts, ends)]
            rel_starts = [cp.cuda.get_elapsed_time(starts[0], a) for a in starts]
            rel_ends = [cp.cuda.get_elapsed_time(starts[0], b) for b in ends]
            for k, v in enumerate(per):
                out["stream_ms"][k].append(v)
            out["aggregate_ms"].append(max(rel_ends) - min(rel_starts))
            out["host_enqueue_ms"].append((h1 - h0) * 1e3)
            out["host_total_ms"].append((h2 - h0) * 1e3)
            out["gate_timed_out"].append(timed_out)
        return out

    # ------------------------------------------------------------------ checks
    def verify_pages(self, src_arr: Any, src_off: int, dst_arr: Any, dst_off: int,
                     page_bytes: int, src_slots: Any, dst_slots: Any) -> tuple[bool, str]:
        """dst page dst_slots[i] == src page src_slots[i]; untouched dst slots still poisoned."""
        cp, np = self.cp, self.np
        n_src = (src_arr.size - src_off) // page_bytes
        n_dst = (dst_arr.size - dst_off) // page_bytes
        s2 = src_arr[src_off:src_off + n_src * page_bytes].reshape(n_src, page_bytes)
        d2 = dst_arr[dst_off:dst_off + n_dst * page_bytes].reshape(n_dst, page_bytes)
        si = np.asarray(src_slots, dtype=np.int64)
        di = np.asarray(dst_slots, dtype=np.int64)
        bad = 0
        step = max(1, (64 * MiB) // page_bytes)  # gather in pieces to bound temporary memory
        for k in range(0, len(si), step):
            a = d2[cp.asarray(di[k:k + step])]
            b = s2[cp.asarray(si[k:k + step])]
            bad += int(cp.count_nonzero(cp.any(a != b, axis=1)))
        mask = np.ones(n_dst, dtype=bool)
        mask[di] = False
        untouched = np.nonzero(mask)[0]
        clobbered = 0
        for k in range(0, len(untouched), step):
            a = d2[cp.asarray(untouched[k:k + step])]
            clobbered += int(cp.count_nonzero(cp.any(a != POISON, axis=1)))
        cp.get_default_memory_pool().free_all_blocks()
        ok = bad == 0 and clobbered == 0
        detail = (f"{len(si)} pages compared, {bad} wrong; {len(untouched)} untouched slots, "
                  f"{clobbered} overwritten")
        return ok, detail

    def verify_range(self, src_arr: Any, dst_arr: Any, nbytes: int) -> tuple[bool, str]:
        cp = self.cp
        bad = int(cp.count_nonzero(dst_arr[:nbytes] != src_arr[:nbytes]))
        tail = dst_arr[nbytes:nbytes + 4096]
        over = int(cp.count_nonzero(tail != POISON)) if tail.size else 0
        return bad == 0 and over == 0, f"{nbytes} bytes compared, {bad} wrong; {over} bytes past end"

    # ------------------------------------------------------------------ records
    def add(self, rec: dict, meas: dict, bytes_per_stream: list[int], verified: bool | None,
            detail: str, labels: list[str] | None = None) -> dict:
        """Turn a measure() result into a record with GB/s per sample and medians."""
        rec = dict(rec)
        rec["warmup"] = self.warmup
        rec["samples"] = self.samples
        if meas.get("gate_overflow"):
            rec["status"] = "gate_overflow"
            rec["note"] = ("the host could not enqueue every copy while the gate held the stream "
                           f"(gate timed out after {GATE_TIMEOUT_NS / 1e9:.0f} s); not measured")
            rec["verified"] = None
            self.records.append(rec)
            self.problems.append(f"{rec['name']} {rec.get('params')}: gate overflow (not measured)")
            print(f"  {rec['name']:<44} {json.dumps(rec.get('params'))}: GATE OVERFLOW", flush=True)
            return rec
        total = sum(bytes_per_stream)
        agg = meas["aggregate_ms"]
        good = [not t for t in meas["gate_timed_out"]]  # samples whose gate held to the end
        rec["bytes_per_sample"] = total
        rec["samples_ms"] = agg
        rec["samples_gbs"] = [total / (ms * 1e-3) / 1e9 for ms in agg]
        rec["median_ms"] = _median([x for x, g in zip(agg, good) if g])
        rec["median_gbs"] = _median([x for x, g in zip(rec["samples_gbs"], good) if g])
        rec["host_enqueue_ms"] = meas["host_enqueue_ms"]
        rec["host_total_ms"] = meas["host_total_ms"]
        if not all(good):
            rec["gate_timed_out"] = meas["gate_timed_out"]
            rec["note_gate"] = "samples whose gate timed out are kept here but left out of medians"
            self.problems.append(f"{rec['name']} {rec.get('params')}: gate timed out in "
                                 f"{good.count(False)} of {len(good)} samples (left out of median)")
        if rec["median_gbs"] is None:
            rec["status"] = "no_valid_sample"
            rec["verified"] = verified
            rec["verify_detail"] = detail
            self.records.append(rec)
            print(f"  {rec['name']:<44} {json.dumps(rec.get('params'))}: NO VALID SAMPLE",
                  flush=True)
            return rec
        if len(bytes_per_stream) > 1:
            per = {}
            for k, lab in enumerate(labels or []):
                ms = meas["stream_ms"][k]
                gbs = [bytes_per_stream[k] / (m * 1e-3) / 1e9 for m in ms]
                per[lab] = {"bytes_per_sample": bytes_per_stream[k], "samples_ms": ms,
                            "samples_gbs": gbs,
                            "median_ms": _median([x for x, g in zip(ms, good) if g]),
                            "median_gbs": _median([x for x, g in zip(gbs, good) if g])}
            rec["per_direction"] = per
        rec["verified"] = verified
        rec["verify_detail"] = detail
        rec["status"] = "ok" if verified else "check_failed"
        if not verified:
            self.failed_checks += 1
            self.problems.append(f"{rec['name']} {rec.get('params')}: DATA CHECK FAILED: {detail}")
        self.records.append(rec)
        extra = ""
        if "per_direction" in rec:
            extra = " (" + ", ".join(f"{k} {v['median_gbs']:.2f}"
                                     for k, v in rec["per_direction"].items()) + ")"
        print(f"  {rec['name']:<44} {json.dumps(rec.get('params'))}: "
              f"{rec['median_gbs']:.2f} GB/s{extra} {'ok' if verified else 'CHECK FAILED'}",
              flush=True)
        return rec

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        print(f"  SKIPPED (time budget): {what}", flush=True)

    def section_failed(self, what: str, exc: BaseException) -> None:
        """A section raised: count and list it, print the traceback, and let the device finish
        whatever the section left queued, so that the next section starts clean."""
        self.section_errors += 1
        self.problems.append(f"{what}: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        try:
            self.cp.cuda.runtime.deviceSynchronize()
        except Exception:
            pass

    # ------------------------------------------------------------------ sections
    def probe_batch_signature(self) -> dict:
        """Two 4 KiB pages through cudaMemcpyBatchAsync, to see the binding's return form."""
        self.poison(self.d_b_arr[:8 * KiB])
        src = [self.h_a, self.h_a + 4 * KiB]
        dst = [self.d_b, self.d_b + 4 * KiB]
        self.batcher.copy(dst, src, 4 * KiB, self.s1)
        self.s1.synchronize()
        ok = bool(self.cp.array_equal(self.d_b_arr[:8 * KiB], self.h_a_arr[:8 * KiB]))
        info = {"returns": self.batcher.signature, "data_ok": ok,
                "cuda_bindings_version": self.ce.bindings_version()}
        print(f"cuda.bindings.runtime.cudaMemcpyBatchAsync returned {self.batcher.signature} "
              f"(cuda-bindings {info['cuda_bindings_version']}); probe data ok={ok}", flush=True)
        return info

    def section_contiguous(self) -> None:
        print("[contiguous copy-engine copies, cudaMemcpyAsync, gated]", flush=True)
        sizes = ([64 * KiB, 4 * MiB, 64 * MiB] if self.quick else
                 [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB,
                  256 * MiB, 512 * MiB])
        sizes = [s for s in sizes if s <= self.pool]
        ce = self.ce
        for size in sizes:
            reps = max(1, min(256, (64 * MiB) // size))

            def mk(dst: int, src: int, stream: Any, size: int = size, reps: int = reps) -> Any:
                def fn() -> None:
                    for r in range(reps):
                        ce.memcpy_contiguous(dst + r * size, src + r * size, size, stream)
                return fn

            for mode in ("h2d", "d2h", "bidir"):
                if self.time_left() < 0:
                    self.skip(f"contiguous {mode} {_fmt_bytes(size)}")
                    continue
                params = {"copy_bytes": size, "copies_per_sample": reps}
                base = {"section": "contiguous_ce", "mechanism": "cudaMemcpyAsync (copy engine)",
                        "timing": "cuda_events_gated", "params": params}
                if mode == "bidir":
                    self.poison(self.d_b_arr, self.h_b_arr)
                    work = [(self.s1, mk(self.d_b, self.h_a, self.s1)),
                            (self.s2, mk(self.h_b, self.d_a, self.s2))]
                    meas = self.measure(work, gated=True)
                    ok1, d1 = self.verify_range(self.h_a_arr, self.d_b_arr, reps * size)
                    ok2, d2 = self.verify_range(self.d_a_arr, self.h_b_arr, reps * size)
                    rec = dict(base, name="host_device_bidirectional_memcpy_ce",
                               src="host+device", dst="device+host",
                               what="h2d on stream 1 and d2h on stream 2 at once; aggregate = "
                                    "both directions' bytes over first start to last end")
                    self.add(rec, meas, [reps * size, reps * size], ok1 and ok2,
                             f"h2d: {d1}; d2h: {d2}", labels=["h2d", "d2h"])
                else:
                    src, src_arr, dst, dst_arr, sk, dk = self.buffers(mode)
                    self.poison(dst_arr)
                    meas = self.measure([(self.s1, mk(dst, src, self.s1))], gated=True)
                    ok, det = self.verify_range(src_arr, dst_arr, reps * size)
                    rec = dict(base, name=f"{sk}_to_{dk}_memcpy_ce", src=sk, dst=dk)
                    self.add(rec, meas, [reps * size], ok, det)

    def nvml_under_load(self) -> dict:
        """NVML PCIe link generation/width read while a long h2d+d2h copy runs."""
        if self.time_left() < 0:
            self.skip("nvml under load")
            return {}
        n = min(self.pool, 256 * MiB)
        for _ in range(8):
            self.ce.memcpy_contiguous(self.d_b, self.h_a, n, self.s1)
            self.ce.memcpy_contiguous(self.h_b, self.d_a, n, self.s2)
        time.sleep(0.005)
        snap = nvml_snapshot(self.dev, brief=True)
        self.s1.synchronize()
        self.s2.synchronize()
        return snap

    def section_paged_ce(self) -> None:
        print("[paged copy-engine copies: per-page cudaMemcpyAsync and cudaMemcpyBatchAsync]",
              flush=True)
        np = self.np
        pages = [16 * KiB, 1 * MiB] if self.quick else [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB,
                                                        1 * MiB, 4 * MiB]
        batch = (32 if self.quick else 96) * MiB
        ce = self.ce
        for page in pages:
            n = batch // page
            n_slots = self.pool // page
            for direction in ("h2d", "d2h"):
                src, src_arr, dst, dst_arr, sk, dk = self.buffers(direction)
                ss = self.rng.choice(n_slots, n, replace=False).astype(np.int32)
                ds = self.rng.choice(n_slots, n, replace=False).astype(np.int32)
                sp = ce.page_pointers(src, page, ss)
                dp = ce.page_pointers(dst, page, ds)
                for mech in ("perpage", "batch"):
                    if mech == "perpage":
                        mname = "cudaMemcpyAsync per page (copy engine)"
                    else:
                        mname = ("cudaMemcpyBatchAsync, one call for the batch, srcAccessOrder="
                                 "Stream (copy engine)")
                    for timing in ("gated", "issue"):
                        if self.time_left() < 0:
                            self.skip(f"paged ce {direction} {mech} {timing} {_fmt_bytes(page)}")
                            continue
                        cap = n
                        if timing == "gated":
                            cap = min(n, GATED_PERPAGE_MAX if mech == "perpage" else
                                      GATED_BATCH_MAX)
                        dpc, spc = dp[:cap], sp[:cap]
                        if mech == "perpage":
                            def fn(dp=dpc, sp=spc, page=page) -> None:
                                ce.memcpy_per_page(dp, sp, page, self.s1)
                        else:
                            def fn(dp=dpc, sp=spc, page=page) -> None:
                                self.batcher.copy(dp, sp, page, self.s1)
                        self.poison(dst_arr)
                        meas = self.measure([(self.s1, fn)], gated=(timing == "gated"))
                        ok, det = (None, "not run") if meas.get("gate_overflow") else \
                            self.verify_pages(src_arr, 0, dst_arr, 0, page, ss[:cap], ds[:cap])
                        params = {"page_bytes": page, "pages": cap,
                                  "slot_layout": "random (scattered)"}
                        if cap < n:
                            params["note"] = (f"gated: first {cap} pages of the {n}-page batch "
                                              "(command-queue limit while the gate holds)")
                        rec = {"name": f"{sk}_to_{dk}_{mech}_memcpy_ce", "section": "paged_ce",
                               "src": sk, "dst": dk, "mechanism": mname,
                               "timing": f"cuda_events_{timing}", "params": params}
                        self.add(rec, meas, [cap * page], ok, det)

    def _kernel_point(self, direction: str, page: int, n: int, ctas: int, inflight: int,
                      layout: str = "random", force: str | None = None,
                      src_off: int = 0, dst_off: int = 0, section: str = "kernel") -> None:
        np, cp = self.np, self.cp
        src, src_arr, dst, dst_arr, sk, dk = self.buffers(direction)
        n_src = (self.pool - src_off) // page
        n_dst = (self.pool - dst_off) // page
        if layout == "random":
            ss = self.rng.choice(n_src, n, replace=False).astype(np.int32)
            ds = self.rng.choice(n_dst, n, replace=False).astype(np.int32)
        else:
            ss = np.arange(n, dtype=np.int32)
            ds = np.arange(n, dtype=np.int32)
        ss_d, ds_d = cp.asarray(ss), cp.asarray(ds)
        self.poison(dst_arr)
        info: dict[str, Any] = {}

        def fn() -> None:
            info["launch"] = self.ck.copy_pages(src + src_off, dst + dst_off, page, ss_d, ds_d,
                                                ctas, inflight, self.s1, force=force)

        meas = self.measure([(self.s1, fn)], gated=True)
        ok, det = self.verify_pages(src_arr, src_off, dst_arr, dst_off, page, ss, ds)
        launch = info.get("launch")
        kname = launch.kernel if launch else "?"
        mech = "paged_ldgsts_sm" if kname.startswith("paged_copy_ldgsts") else "paged_unaligned_sm"
        params = {"page_bytes": page, "pages": n, "ctas": ctas, "threads_per_cta": 128,
                  "slot_layout": "random (scattered)" if layout == "random" else "contiguous"}
        if mech == "paged_ldgsts_sm":
            params["inflight_bytes_per_cta"] = inflight
            params["est_ctas_per_sm"] = self.ck.estimated_ctas_per_sm(inflight, self.dev)
        if src_off or dst_off:
            params["src_base_offset"] = src_off
            params["dst_base_offset"] = dst_off
        rec = {"name": f"{sk}_to_{dk}_{mech}", "section": section, "src": sk, "dst": dk,
               "mechanism": f"SM copy kernel {kname} (kernel loads/stores host memory directly)",
               "kernel": kname, "timing": "cuda_events_gated", "params": params}
        self.add(rec, meas, [n * page], ok, det)

    def section_kernel_cta_sweep(self) -> None:
        print("[LDGSTS kernel: CTA-count sweep, 1 MiB pages]", flush=True)
        page = MiB
        n = (128 if self.quick else 256) * MiB // page
        ctas_list = [1, 8, 32, 132] if self.quick else [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96,
                                                        132, 264]
        inflights = [32 * KiB, 64 * KiB] if self.quick else [16 * KiB, 32 * KiB, 64 * KiB,
                                                             128 * KiB]
        for direction in ("d2h", "h2d"):
            for inflight in inflights:
                for ctas in ctas_list:
                    if self.time_left() < 0:
                        self.skip(f"kernel {direction} {ctas} CTAs {_fmt_bytes(inflight)}")
                        continue
                    self._kernel_point(direction, page, n, ctas, inflight,
                                       section="kernel_cta_sweep")
        # device-to-device reference: the kernel itself is not the limit
        for ctas in ([132] if self.quick else [32, 132, 264]):
            if self.time_left() < 0:
                self.skip(f"kernel d2d {ctas}")
                continue
            self._kernel_point("d2d", page, n, ctas, 64 * KiB, section="kernel_d2d_reference")

    def section_kernel_page_sweep(self) -> None:
        print("[LDGSTS kernel: page-size sweep, 64 KiB in flight per CTA]", flush=True)
        pages = [16 * KiB, 1 * MiB] if self.quick else [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB,
                                                        1 * MiB, 4 * MiB]
        batch = (128 if self.quick else 256) * MiB
        ctas_list = [8] if self.quick else [8, 32]
        for direction in ("d2h", "h2d"):
            for ctas in ctas_list:
                for page in pages:
                    if self.time_left() < 0:
                        self.skip(f"page sweep {direction} {ctas} {_fmt_bytes(page)}")
                        continue
                    self._kernel_point(direction, page, batch // page, ctas, 64 * KiB,
                                       section="kernel_page_sweep")
            for ctas in ([8] if self.quick else [8, 16, 32, 132]):
                if self.time_left() < 0:
                    self.skip(f"contiguous-slot reference {direction} {ctas}")
                    continue
                self._kernel_point(direction, MiB, batch // MiB, ctas, 64 * KiB,
                                   layout="contiguous", section="kernel_contiguous_reference")

    def section_kernel_bidir(self) -> None:
        print("[LDGSTS kernel: both directions at once, two streams]", flush=True)
        np, cp = self.np, self.cp
        page = MiB
        n = (128 if self.quick else 256) * MiB // page
        inflight = 64 * KiB
        n_slots = self.pool // page
        for ctas in ([8] if self.quick else [4, 8, 16, 32, 66]):
            if self.time_left() < 0:
                self.skip(f"kernel bidir {ctas}")
                continue
            sl = {}
            for d in ("d2h", "h2d"):
                ss = self.rng.choice(n_slots, n, replace=False).astype(np.int32)
                ds = self.rng.choice(n_slots, n, replace=False).astype(np.int32)
                sl[d] = (ss, ds, cp.asarray(ss), cp.asarray(ds))
            self.poison(self.h_b_arr, self.d_b_arr)
            names: dict[str, str] = {}

            def mk(d: str, stream: Any, sl: dict = sl, names: dict = names,
                   ctas: int = ctas) -> Any:
                src, _, dst, _, _, _ = self.buffers(d)
                _, _, ssd, dsd = sl[d]

                def fn() -> None:
                    names[d] = self.ck.copy_pages(src, dst, page, ssd, dsd, ctas, inflight,
                                                  stream).kernel
                return fn

            meas = self.measure([(self.s1, mk("d2h", self.s1)), (self.s2, mk("h2d", self.s2))],
                                gated=True)
            ok1, d1 = self.verify_pages(self.d_a_arr, 0, self.h_b_arr, 0, page, sl["d2h"][0],
                                        sl["d2h"][1])
            ok2, d2 = self.verify_pages(self.h_a_arr, 0, self.d_b_arr, 0, page, sl["h2d"][0],
                                        sl["h2d"][1])
            rec = {"name": "host_device_bidirectional_paged_ldgsts_sm",
                   "section": "kernel_bidirectional", "src": "device+host", "dst": "host+device",
                   "mechanism": f"SM copy kernel {names.get('d2h')} on two streams",
                   "what": "d2h kernel on stream 1 and h2d kernel on stream 2 at once; aggregate "
                           "= both directions' bytes over first start to last end",
                   "timing": "cuda_events_gated",
                   "params": {"page_bytes": page, "pages_per_direction": n,
                              "ctas_per_direction": ctas, "inflight_bytes_per_cta": inflight,
                              "slot_layout": "random (scattered)"}}
            self.add(rec, meas, [n * page, n * page], ok1 and ok2, f"d2h: {d1}; h2d: {d2}",
                     labels=["d2h", "h2d"])

    def section_unaligned(self) -> None:
        print("[alignment-agnostic kernel]", flush=True)
        batch = (32 if self.quick else 64) * MiB
        cases = [(4100, 0, "u32")] if self.quick else [
            (4100, 0, "u32: page size not a multiple of 16"),
            (MiB, 4, "u32: source base offset by 4 bytes"),
            (65537, 0, "u8: odd page size"),
        ]
        for direction in ("d2h", "h2d"):
            for page, off, why in cases:
                for ctas in ([32] if self.quick else [32, 132]):
                    if self.time_left() < 0:
                        self.skip(f"unaligned {direction} {page} {ctas}")
                        continue
                    n = batch // page
                    self._kernel_point(direction, page, n, ctas, 64 * KiB, src_off=off,
                                       section="kernel_unaligned")
                    self.records[-1]["case"] = why

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict:
        recs = [r for r in self.records if r.get("median_gbs") is not None]
        s: dict[str, Any] = {}

        cont: dict[str, dict] = {}
        for r in recs:
            if r["section"] != "contiguous_ce":
                continue
            size = r["params"]["copy_bytes"]
            key = {"host_to_device_memcpy_ce": "h2d", "device_to_host_memcpy_ce": "d2h",
                   "host_device_bidirectional_memcpy_ce": "bidir_aggregate"}[r["name"]]
            cont.setdefault(key, {})[size] = r["median_gbs"]
            if key == "bidir_aggregate":
                for lab, v in r["per_direction"].items():
                    cont.setdefault(f"bidir_{lab}", {})[size] = v["median_gbs"]
        s["contiguous_ce_median_gbs_by_size"] = {k: {str(sz): v for sz, v in sorted(d.items())}
                                                 for k, d in cont.items()}
        s["contiguous_ce_plateau_gbs"] = {
            k: {"max_median": max(d.values()), "at_largest_size": d[max(d)],
                "largest_size": max(d)} for k, d in cont.items() if d}

        paged: dict[str, dict] = {}
        for r in recs:
            if r["section"] != "paged_ce":
                continue
            key = f"{r['name']}|{r['timing']}"
            paged.setdefault(key, {})[str(r["params"]["page_bytes"])] = r["median_gbs"]
        s["paged_ce_median_gbs_by_page"] = paged

        sweep: dict[str, dict] = {}
        for r in recs:
            if r["section"] != "kernel_cta_sweep":
                continue
            key = f"{r['name']}|inflight={r['params']['inflight_bytes_per_cta']}"
            sweep.setdefault(key, {})[r["params"]["ctas"]] = r["median_gbs"]
        ks: dict[str, Any] = {}
        by_dir: dict[str, float] = {}
        for key, d in sweep.items():
            plateau = max(d.values())
            name = key.split("|")[0]
            by_dir[name] = max(by_dir.get(name, 0.0), plateau)
            c95 = min((c for c, v in d.items() if v >= 0.95 * plateau), default=None)
            ks[key] = {"median_gbs_by_ctas": {str(c): v for c, v in sorted(d.items())},
                       "per_cta_gbs_at_1_cta": d.get(1), "plateau_gbs": plateau,
                       "ctas_to_95pct_of_this_curve_plateau": c95}
        for key, d in sweep.items():
            name = key.split("|")[0]
            ks[key]["ctas_to_95pct_of_direction_plateau"] = min(
                (c for c, v in d.items() if v >= 0.95 * by_dir[name]), default=None)
        s["kernel_cta_sweep"] = ks
        s["kernel_direction_plateau_gbs"] = by_dir

        other: dict[str, dict] = {}
        for r in recs:
            if r["section"] in ("kernel_page_sweep", "kernel_contiguous_reference",
                                "kernel_unaligned", "kernel_d2d_reference"):
                p = r["params"]
                key = f"{r['section']}|{r['name']}|ctas={p['ctas']}"
                other.setdefault(key, {})[str(p["page_bytes"]) + (
                    f"+off{p['src_base_offset']}" if p.get("src_base_offset") else "")] = \
                    r["median_gbs"]
        s["kernel_other_median_gbs"] = other
        bid = {}
        for r in recs:
            if r["section"] == "kernel_bidirectional":
                bid[str(r["params"]["ctas_per_direction"])] = {
                    "aggregate": r["median_gbs"],
                    **{k: v["median_gbs"] for k, v in r["per_direction"].items()}}
        s["kernel_bidirectional_median_gbs_by_ctas_per_direction"] = bid
        return s

    def print_table(self, s: dict) -> None:
        print("\n==== summary: medians, GB/s = 1e9 bytes/s ====")
        c = s.get("contiguous_ce_median_gbs_by_size", {})
        if c:
            cols = ["h2d", "d2h", "bidir_aggregate", "bidir_h2d", "bidir_d2h"]
            sizes = sorted({int(k) for d in c.values() for k in d})
            print("contiguous CE (gated)   " + " ".join(f"{x:>15}" for x in cols))
            for sz in sizes:
                vals = [c.get(k, {}).get(str(sz)) for k in cols]
                print(f"  {_fmt_bytes(sz):>8}              " + " ".join(
                    f"{v:15.2f}" if v is not None else f"{'-':>15}" for v in vals))
        p = s.get("paged_ce_median_gbs_by_page", {})
        if p:
            pages = sorted({int(k) for d in p.values() for k in d})
            print("paged CE " + " ".join(f"{_fmt_bytes(x):>7}" for x in pages))
            for key, d in sorted(p.items()):
                nm, tm = key.split("|")
                short = nm.replace("_memcpy_ce", "").replace("host_to_device", "h2d").replace(
                    "device_to_host", "d2h") + "/" + tm.replace("cuda_events_", "")
                print(f"  {short:<22}" + " ".join(
                    f"{d.get(str(x)):7.2f}" if d.get(str(x)) is not None else f"{'-':>7}"
                    for x in pages))
        k = s.get("kernel_cta_sweep", {})
        if k:
            ctas = sorted({int(c) for v in k.values() for c in v["median_gbs_by_ctas"]})
            print("LDGSTS kernel, 1 MiB pages, CTAs: " + " ".join(f"{x:>6}" for x in ctas)
                  + "  c95(curve) c95(dir)")
            for key, v in sorted(k.items()):
                nm, inf = key.split("|")
                short = ("d2h" if "device_to_host" in nm else "h2d") + " " + \
                    _fmt_bytes(int(inf.split("=")[1]))
                print(f"  {short:<31}  " + " ".join(
                    f"{v['median_gbs_by_ctas'].get(str(x)):6.2f}"
                    if v["median_gbs_by_ctas"].get(str(x)) is not None else f"{'-':>6}"
                    for x in ctas) + f"  {v['ctas_to_95pct_of_this_curve_plateau']!s:>10}"
                    f" {v['ctas_to_95pct_of_direction_plateau']!s:>8}")
        b = s.get("kernel_bidirectional_median_gbs_by_ctas_per_direction", {})
        for ct, v in b.items():
            print(f"kernel bidir {ct:>3} CTAs/dir: aggregate {v['aggregate']:.2f}, d2h "
                  f"{v.get('d2h', 0):.2f}, h2d {v.get('h2d', 0):.2f}")
        for key, d in sorted(s.get("kernel_other_median_gbs", {}).items()):
            sec, nm, ct = key.split("|")
            print(f"{sec.replace('kernel_', '')} {nm.split('_paged')[0]} {ct}: " + ", ".join(
                f"{_fmt_bytes(int(pg.split('+')[0]))}{'+' + pg.split('+')[1] if '+' in pg else ''}"
                f" {v:.2f}" for pg, v in d.items()))


# ---------------------------------------------------------------------- provenance

def nvml_snapshot(dev: int, brief: bool = False) -> dict:
    out: dict[str, Any] = {}
    try:
        import pynvml
    except Exception as exc:
        return {"error": f"pynvml import failed: {exc}"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"error": f"nvmlInit failed: {exc}"}

    def q(key: str, fn: Any, *a: Any) -> None:
        try:
            v = fn(*a)
            out[key] = v.decode() if isinstance(v, bytes) else v
        except Exception as exc:
            out[key] = f"error: {type(exc).__name__}: {exc}"

    try:
        h = None
        try:
            import cupy

            bus = cupy.cuda.runtime.deviceGetPCIBusId(dev)
            out["pci_bus_id"] = bus
            h = pynvml.nvmlDeviceGetHandleByPciBusId(bus.encode() if isinstance(bus, str) else bus)
        except Exception as exc:
            out["handle_note"] = f"PCI lookup failed ({exc}); using NVML index {dev}"
            h = pynvml.nvmlDeviceGetHandleByIndex(dev)
        q("pcie_curr_link_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
        q("pcie_curr_link_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)
        q("clock_sm_mhz", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        q("clock_mem_mhz", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        q("pcie_tx_kBps_20ms", pynvml.nvmlDeviceGetPcieThroughput, h, 0)
        q("pcie_rx_kBps_20ms", pynvml.nvmlDeviceGetPcieThroughput, h, 1)
        if not brief:
            q("nvml_version", pynvml.nvmlSystemGetNVMLVersion)
            q("driver_version", pynvml.nvmlSystemGetDriverVersion)
            q("cuda_driver_version", pynvml.nvmlSystemGetCudaDriverVersion)
            q("name", pynvml.nvmlDeviceGetName, h)
            q("pcie_max_link_gen", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
            q("pcie_gpu_max_link_gen", pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, h)
            q("pcie_max_link_width", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
            q("pcie_speed_mbps", pynvml.nvmlDeviceGetPcieSpeed, h)
            q("max_clock_sm_mhz", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
            q("max_clock_mem_mhz", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
            q("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode, h)
            q("temperature_c", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            q("power_mw", pynvml.nvmlDeviceGetPowerUsage, h)
            q("power_limit_mw", pynvml.nvmlDeviceGetPowerManagementLimit, h)
            try:
                c2c = {}
                for fid, nm in ((170, "c2c_link_count"), (171, "c2c_link_status_0"),
                                (172, "c2c_link_max_bw_MBps_0")):
                    fv = pynvml.nvmlDeviceGetFieldValues(h, [fid])[0]
                    ret = int(fv.nvmlReturn)
                    c2c[nm] = {"field_id": fid, "nvmlReturn": ret,
                               "value": int(fv.value.uiVal) if ret == 0 else None}
                out["c2c_fields"] = c2c
            except Exception as exc:
                out["c2c_fields"] = f"error: {type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def provenance(dev: int) -> dict:
    import cupy
    import numpy as np

    from hw.copy_engine import bindings_version

    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(dev)
    name = props.get("name", b"")
    name = name.decode() if isinstance(name, bytes) else str(name)
    attrs = {}
    for aid, nm in ((16, "multiProcessorCount"), (40, "asyncEngineCount"),
                    (88, "pageableMemoryAccess"), (100, "pageableMemoryAccessUsesHostPageTables"),
                    (91, "canUseHostPointerForRegisteredMem"), (99, "hostRegisterSupported"),
                    (41, "unifiedAddressing"), (19, "canMapHostMemory"),
                    (81, "maxSharedMemoryPerMultiprocessor"), (97, "maxSharedMemoryPerBlockOptin"),
                    (111, "reservedSharedMemoryPerBlock"), (38, "l2CacheSize"),
                    (13, "clockRate_kHz"), (36, "memoryClockRate_kHz")):
        try:
            attrs[f"{aid}_{nm}"] = int(rt.deviceGetAttribute(aid, dev))
        except Exception as exc:
            attrs[f"{aid}_{nm}"] = f"error: {exc}"
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    bus = None
    numa = None
    try:
        bus = rt.deviceGetPCIBusId(dev)
        with open(f"/sys/bus/pci/devices/{bus.lower()}/numa_node") as f:
            numa = int(f.read().strip())
    except Exception:
        pass
    try:
        from importlib.metadata import version as _v

        import pynvml  # noqa: F401

        nvml_py = _v("nvidia-ml-py")
    except Exception:
        nvml_py = None
    try:
        nvrtc = ".".join(str(x) for x in cupy.cuda.nvrtc.getVersion())
    except Exception:
        nvrtc = None
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "gpu_name": name,
        "gpu_index": dev,
        "pci_bus_id": bus,
        "gpu_numa_node": numa,
        "total_global_mem_bytes": int(props.get("totalGlobalMem", 0)),
        "cuda_runtime_version": int(rt.runtimeGetVersion()),
        "cuda_driver_version": int(rt.driverGetVersion()),
        "nvrtc_version": nvrtc,
        "cupy_version": cupy.__version__,
        "numpy_version": np.__version__,
        "cuda_bindings_version": bindings_version(),
        "nvidia_ml_py_version": nvml_py,
        "cuda_attributes": attrs,
        "nvml_start": nvml_snapshot(dev),
        "gpu_settings": "left as found: no clock, power, persistence or MIG change was made",
    }


def write_doc(doc: dict, bench: Bench | None, path: str, t0: float) -> None:
    """Write ``doc`` (with the bench's records, problems and skips so far) to ``path``
    atomically: a crash mid-run leaves the last complete file."""
    if bench is not None:
        doc["records"] = bench.records
        doc["problems"] = bench.problems
        doc["skipped_for_time"] = bench.skipped
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hw.bench_copy", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for <date>-copy-bench.json")
    ap.add_argument("--quick", action="store_true", help="smoke test: few points, < 1 minute")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=20260101)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new points after this many seconds (default 45 quick, "
                         "360 full)")
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 45.0 if args.quick else 360.0
    os.makedirs(args.out, exist_ok=True)

    t0 = time.perf_counter()
    prov = provenance(args.device)
    date = prov["date_utc"][:10]
    path = os.path.join(args.out, f"{date}-copy-bench.json")
    print(f"GPU {prov['gpu_name']} driver {prov['nvml_start'].get('driver_version')} "
          f"CUDA runtime {prov['cuda_runtime_version']} driver API {prov['cuda_driver_version']} "
          f"cupy {prov['cupy_version']} -> {path}", flush=True)
    doc: dict[str, Any] = {
        "schema": "kvsim-copy-bench/1",
        "command": "python3 -m hw.bench_copy " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": "quick" if args.quick else "full",
        "units": {"bandwidth": "GB/s = 1e9 bytes/s (payload bytes, one direction unless "
                               "'aggregate')", "time": "ms (CUDA event elapsed time)"},
        "provenance": prov,
        "method": (__doc__ or "").split("Every measurement", 1)[-1].strip(),
    }
    bench = None
    rc = 0

    def dump() -> None:
        write_doc(doc, bench, path, t0)

    try:
        bench = Bench(args)
        doc["config"] = {"pool_bytes_per_buffer": bench.pool, "warmup": bench.warmup,
                         "samples": bench.samples, "gate_timeout_ns": GATE_TIMEOUT_NS,
                         "gated_perpage_max_copies": GATED_PERPAGE_MAX,
                         "gated_batch_max_copies": GATED_BATCH_MAX,
                         "seed": args.seed, "budget_s": args.budget_s, "poison_byte": POISON}
        try:
            doc["batch_api_signature"] = bench.probe_batch_signature()
        except Exception as exc:
            bench.section_errors += 1
            bench.problems.append(f"batch signature probe: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        sections = [("contiguous", bench.section_contiguous),
                    ("nvml_under_load", None),
                    ("paged_ce", bench.section_paged_ce),
                    ("kernel_cta_sweep", bench.section_kernel_cta_sweep),
                    ("kernel_page_sweep", bench.section_kernel_page_sweep),
                    ("kernel_bidir", bench.section_kernel_bidir),
                    ("kernel_unaligned", bench.section_unaligned)]
        for nm, fn in sections:
            try:
                if fn is None:
                    doc["nvml_under_load"] = bench.nvml_under_load()
                    print(f"NVML while copying: {doc['nvml_under_load']}", flush=True)
                else:
                    fn()
            except Exception as exc:
                bench.section_failed(f"section {nm}", exc)
            print(f"-- {nm} done at {time.perf_counter() - t0:.1f} s", flush=True)
            dump()
        doc["nvml_end"] = nvml_snapshot(args.device, brief=True)
        for nm in ("paged_copy_ldgsts<4,2>", "paged_copy_ldgsts<4,16>", bench.ck.SIMPLE_U8):
            try:
                doc.setdefault("kernel_attributes", {})[nm] = bench.ck.kernel_attributes(nm)
            except Exception as exc:
                doc.setdefault("kernel_attributes", {})[nm] = f"error: {exc}"
        doc["summary"] = bench.summary()
        dump()
        bench.print_table(doc["summary"])
        if bench.failed_checks or bench.section_errors:
            rc = 1
        print(f"\n{len(bench.records)} records, {bench.failed_checks} failed checks, "
              f"{bench.section_errors} section errors, {len(bench.skipped)} skipped for time; "
              f"{time.perf_counter() - t0:.1f} s; wrote {path}", flush=True)
        for p in bench.problems:
            print(f"problem: {p}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        doc["fatal"] = f"{type(exc).__name__}: {exc}"
        rc = 2
    finally:
        dump()
        if bench is not None:
            bench.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
