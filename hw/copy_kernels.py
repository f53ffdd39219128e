"""SM copy kernels for paged KV blocks (CuPy RawModule, compiled with NVRTC).

Two kernels move a batch of pages: page ``i`` goes from ``src_base + src_slot[i] * page_bytes`` to
``dst_base + dst_slot[i] * page_bytes``. Either side may be device memory or pinned, *mapped* host
memory (``cupy.cuda.runtime.hostAlloc(n, 2)``, cudaHostAllocMapped): with unified addressing the host
pointer is valid in kernels, so the kernel itself reads or writes host memory over the link.

(a) ``paged_copy_ldgsts<STAGES, UNROLL>``: 128 threads per CTA. The batch is a sequence of 16-byte
    chunks split into tiles of ``128 * UNROLL`` chunks; CTA ``b`` of ``N`` takes tiles ``b, b+N, ...``
    (grid-stride). Chunk -> page uses a branch-free multiply-high division, and all slot look-ups
    of a tile are issued together before the pipeline wait (an earlier version looked each slot up
    just before its own cp.async, which serialised one L1/L2 round trip per chunk and capped one
    CTA at about 16 GB/s whatever the bytes in flight; see reports/measurements/h200/README.md).
    Each thread loads its chunks with ``cp.async.cg.shared.global`` (16 B, LDGSTS)
    into dynamic shared memory, one commit group per tile, ``STAGES`` tiles deep; after
    ``cp.async.wait_group STAGES-1`` it stores the oldest tile with 16-byte stores and refills that
    stage. Shared memory per CTA = ``STAGES * 128 * 16 * UNROLL`` bytes = "bytes in flight per CTA"
    (in steady state between (STAGES-1)/STAGES of it and all of it is outstanding). Each thread reads
    back only the shared-memory slots it filled itself, so no barrier is needed.
    Needs page_bytes % 16 == 0 and both bases 16-byte aligned.
(b) ``paged_copy_simple<T, UNROLL>``: alignment-agnostic, element type ``unsigned int`` (4 B) when
    page size and bases are multiples of 4, else ``unsigned char``; grid-stride over elements,
    ``UNROLL`` independent loads per thread before the stores.

:func:`copy_pages` picks (a) or (b) from the alignment and launches. Nothing here imports CuPy at
import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hw.cuda_check import cupy_call

THREADS = 128
CHUNK = 16  # bytes per cp.async
NVRTC_OPTIONS = ("-std=c++17",)
DEFAULT_STAGES = 4

KERNEL_SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
    const u32 s = static_cast<u32>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// Chunk c -> byte offset of that chunk from the base: slot(page) * page_bytes + 16 * (c mod cpp),
// page = c / cpp. The division is branch-free: page = umulhi64(c, magic) with
// magic = ceil(2^64 / cpp) (exact for c, cpp < 2^32), or page = c when cpp == 1 (magic = 0).
// All UNROLL slot loads of a tile are issued before any of them is used.
template <int UNROLL>
__device__ __forceinline__ u32 tile_offsets(u32 tile, u32 total, u32 cpp, u64 magic,
                                            u64 page_bytes, const int* __restrict__ slots,
                                            u64 (&ofs)[UNROLL]) {
    const u32 c0 = tile * (128u * UNROLL) + threadIdx.x;
    u32 valid = 0u;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const u32 c = c0 + 128u * u;
        const bool ok = c < total;
        const u32 cc = ok ? c : 0u;
        const u32 page = magic ? (u32)__umul64hi((u64)cc, magic) : cc;
        const u32 off = cc - page * cpp;
        ofs[u] = (u64)(u32)__ldg(slots + page) * page_bytes + ((u64)off << 4);
        valid |= (ok ? 1u : 0u) << u;
    }
    return valid;
}

template <int UNROLL>
__device__ __forceinline__ void issue_tile(uint4* stage, u32 valid, const u64 (&ofs)[UNROLL],
                                           const char* __restrict__ src_base) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (valid & (1u << u)) cp_async_16(stage + 128u * u + threadIdx.x, src_base + ofs[u]);
    }
}

template <int STAGES, int UNROLL>
__global__ void __launch_bounds__(128)
paged_copy_ldgsts(const char* __restrict__ src_base, char* __restrict__ dst_base, u64 page_bytes,
                  const int* __restrict__ src_slots, const int* __restrict__ dst_slots,
                  u32 n_pages, u64 magic) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint4* smem = reinterpret_cast<uint4*>(smem_raw);
    constexpr u32 TILE = 128u * UNROLL;               // 16-byte chunks per tile (per stage)
    const u32 cpp = (u32)(page_bytes >> 4);           // chunks per page
    const u32 total = n_pages * cpp;                  // host keeps this below 2^32 - TILE
    const u32 ntiles = (total + TILE - 1u) / TILE;
    u64 sofs[UNROLL];
    u64 dofs[UNROLL];

    u32 t_issue = blockIdx.x;
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {                // prologue: fill every stage
        if (t_issue < ntiles) {
            const u32 v = tile_offsets<UNROLL>(t_issue, total, cpp, magic, page_bytes, src_slots,
                                               sofs);
            issue_tile<UNROLL>(smem + s * TILE, v, sofs, src_base);
        }
        cp_async_commit();                            // empty groups keep the count uniform
        t_issue += gridDim.x;
    }
    int stage = 0;
    for (u32 t = blockIdx.x; t < ntiles; t += gridDim.x) {
        // slot look-ups for this tile's stores and the next tile's loads, before the wait
        const u32 dv = tile_offsets<UNROLL>(t, total, cpp, magic, page_bytes, dst_slots, dofs);
        const bool next = t_issue < ntiles;
        u32 sv = 0u;
        if (next) sv = tile_offsets<UNROLL>(t_issue, total, cpp, magic, page_bytes, src_slots, sofs);
        cp_async_wait<STAGES - 1>();                  // oldest tile (this thread's part) landed
        uint4* st = smem + stage * TILE;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (dv & (1u << u))
                *reinterpret_cast<uint4*>(dst_base + dofs[u]) = st[128u * u + threadIdx.x];
        }
        if (next) issue_tile<UNROLL>(st, sv, sofs, src_base);
        cp_async_commit();
        t_issue += gridDim.x;
        stage = (stage + 1 == STAGES) ? 0 : stage + 1;
    }
    cp_async_wait<0>();
}

template <typename T, int UNROLL>
__global__ void __launch_bounds__(128)
paged_copy_simple(const char* __restrict__ src_base, char* __restrict__ dst_base, u64 page_bytes,
                  const int* __restrict__ src_slots, const int* __restrict__ dst_slots,
                  u32 n_pages) {
    const u64 epp = page_bytes / sizeof(T);            // elements per page
    const u64 total = (u64)n_pages * epp;
    const u64 step = (u64)gridDim.x * 128u * UNROLL;
    for (u64 base = (u64)blockIdx.x * 128u * UNROLL + threadIdx.x; base < total; base += step) {
        T v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u64 e = base + 128u * u;
            if (e < total) {
                const u64 page = e / epp;
                const u64 off = e - page * epp;
                v[u] = *reinterpret_cast<const T*>(src_base + (u64)(u32)src_slots[page] * page_bytes
                                                    + off * sizeof(T));
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const u64 e = base + 128u * u;
            if (e < total) {
                const u64 page = e / epp;
                const u64 off = e - page * epp;
                *reinterpret_cast<T*>(dst_base + (u64)(u32)dst_slots[page] * page_bytes
                                      + off * sizeof(T)) = v[u];
            }
        }
    }
}

// Timing gate: one thread spins until flag[0] != 0 (flag in mapped host memory) or timeout_ns of
// %globaltimer pass; on timeout it sets flag[1] = 1. Used to hold a stream while the host enqueues.
extern "C" __global__ void gate_spin(volatile int* flag, u64 timeout_ns) {
    u64 t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        // signed difference: %globaltimer may step backwards slightly when it is re-synchronised
        if ((long long)(t - t0) > (long long)timeout_ns) { flag[1] = 1; break; }
        __nanosleep(500);
    }
}
"""

SIMPLE_UNROLL = 16
SIMPLE_U32 = f"paged_copy_simple<unsigned int,{SIMPLE_UNROLL}>"
SIMPLE_U8 = f"paged_copy_simple<unsigned char,{SIMPLE_UNROLL}>"
GATE = "gate_spin"
# (STAGES, UNROLL) compiled up front: bytes in flight per CTA = STAGES * 2 KiB * UNROLL
_DEFAULT_LDGSTS = [(2, 1), (4, 1), (4, 2), (4, 4), (4, 8), (4, 16)]


def ldgsts_name(stages: int, unroll: int) -> str:
    return f"paged_copy_ldgsts<{stages},{unroll}>"


_DEFAULT_NAMES = [ldgsts_name(s, u) for s, u in _DEFAULT_LDGSTS] + [SIMPLE_U32, SIMPLE_U8]

_modules: dict[str, Any] = {}  # name expression -> RawModule holding it
_kernels: dict[str, Any] = {}
_smem_set: dict[str, int] = {}


def _module_for(name: str) -> Any:
    import cupy

    if name in _modules:
        return _modules[name]
    if name in _DEFAULT_NAMES or name == GATE:
        names = list(_DEFAULT_NAMES)
    else:
        names = [name]
    mod = cupy_call("RawModule(NVRTC compile of hw/copy_kernels.py)", cupy.RawModule,
                    code=KERNEL_SOURCE, options=NVRTC_OPTIONS, name_expressions=names)
    for n in names:
        _modules[n] = mod
    if name == GATE:
        _modules[GATE] = mod
    return mod


def get_kernel(name: str) -> Any:
    """The compiled kernel for a name expression (compiled on first use, then cached)."""
    if name not in _kernels:
        mod = _module_for(name)
        _kernels[name] = cupy_call(f"RawModule.get_function({name})", mod.get_function, name)
    return _kernels[name]


def kernel_attributes(name: str) -> dict:
    """Registers, local (spill) bytes, static shared memory, ... as CuPy reports them."""
    return dict(get_kernel(name).attributes)


def stages_unroll(inflight_bytes: int, stages: int | None = None) -> tuple[int, int]:
    """Split bytes in flight per CTA into (STAGES, UNROLL) with STAGES * 2 KiB * UNROLL = bytes."""
    tile = THREADS * CHUNK  # 2 KiB per stage per unroll step
    if inflight_bytes <= 0 or inflight_bytes % tile:
        raise ValueError(f"inflight_bytes must be a positive multiple of {tile}, got {inflight_bytes}")
    n = inflight_bytes // tile
    if stages is None:
        stages = min(DEFAULT_STAGES, n)
    if n % stages:
        raise ValueError(f"inflight_bytes {inflight_bytes} not divisible into {stages} stages")
    return stages, n // stages


@dataclass(frozen=True)
class Launch:
    kernel: str          # name expression of the kernel that ran
    ctas: int
    threads: int
    smem_bytes: int      # dynamic shared memory per CTA
    launches: int        # > 1 only when the batch was split to keep 32-bit chunk indices


def pick_kernel(src_base: int, dst_base: int, page_bytes: int) -> str:
    """'ldgsts' when page size and both bases are 16-byte multiples, else 'u32' or 'u8'."""
    if page_bytes % 16 == 0 and src_base % 16 == 0 and dst_base % 16 == 0:
        return "ldgsts"
    if page_bytes % 4 == 0 and src_base % 4 == 0 and dst_base % 4 == 0:
        return "u32"
    return "u8"


def _as_slots(slots: Any, stream: Any) -> Any:
    import cupy
    import numpy as np

    if isinstance(slots, cupy.ndarray):
        if slots.dtype != cupy.int32:
            raise TypeError("slot arrays must be int32")
        return slots
    arr = np.ascontiguousarray(slots, dtype=np.int32)
    with stream:
        return cupy.asarray(arr)


def copy_pages(src_base: int, dst_base: int, page_bytes: int, src_slots: Any, dst_slots: Any,
               ctas: int, inflight_bytes: int = 64 * 1024, stream: Any = None,
               *, force: str | None = None, stages: int | None = None) -> Launch:
    """Copy page ``i`` from ``src_base + src_slots[i]*page_bytes`` to ``dst_base + dst_slots[i]*page_bytes``.

    ``src_slots``/``dst_slots``: int32 CuPy arrays (NumPy arrays are uploaded first, on ``stream``).
    ``ctas``: grid size; ``inflight_bytes``: shared memory (bytes in flight) per CTA for the LDGSTS
    kernel. ``force``: 'ldgsts', 'u32' or 'u8' to override the choice (must still be legal).
    Asynchronous on ``stream`` (a ``cupy.cuda.Stream``; None = current stream).
    """
    import cupy
    import numpy as np

    if stream is None:
        stream = cupy.cuda.get_current_stream()
    page_bytes = int(page_bytes)
    src_base = int(src_base)
    dst_base = int(dst_base)
    if page_bytes <= 0:
        raise ValueError("page_bytes must be positive")
    if ctas < 1:
        raise ValueError("ctas must be >= 1")
    src = _as_slots(src_slots, stream)
    dst = _as_slots(dst_slots, stream)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError("src_slots and dst_slots must be 1-D and of equal length")
    n_pages = int(src.shape[0])
    choice = pick_kernel(src_base, dst_base, page_bytes)
    if force is not None:
        legal = {"ldgsts": ("ldgsts",), "u32": ("ldgsts", "u32"), "u8": ("ldgsts", "u32", "u8")}
        if choice not in legal[force]:
            raise ValueError(f"kernel {force!r} needs alignment this copy does not have ({choice})")
        choice = force
    if n_pages == 0:
        return Launch("none", ctas, THREADS, 0, 0)

    if choice == "ldgsts":
        st, un = stages_unroll(inflight_bytes, stages)
        name = ldgsts_name(st, un)
        smem = int(inflight_bytes)
        cpp = page_bytes // 16
        magic = 0 if cpp == 1 else -(-(1 << 64) // cpp)  # ceil(2^64 / cpp), < 2^64 for cpp >= 2
        tile = THREADS * un
        max_chunks = (1 << 32) - 1 - tile
        pages_per_launch = max(1, max_chunks // cpp)
        if cpp > max_chunks:
            raise ValueError("page too large for 32-bit chunk indexing")
        extra: tuple = (np.uint64(magic),)
    else:
        name = SIMPLE_U32 if choice == "u32" else SIMPLE_U8
        smem = 0
        pages_per_launch = (1 << 32) - 1
        extra = ()
    kern = get_kernel(name)
    if smem > 48 * 1024 and _smem_set.get(name, 0) < smem:
        def _set() -> None:
            kern.max_dynamic_shared_size_bytes = smem
        cupy_call(f"cudaFuncSetAttribute(MaxDynamicSharedMemorySize={smem}) for {name}", _set)
        _smem_set[name] = smem

    launches = 0
    with stream:
        for first in range(0, n_pages, pages_per_launch):
            last = min(n_pages, first + pages_per_launch)
            args = (np.uint64(src_base), np.uint64(dst_base), np.uint64(page_bytes),
                    src[first:last], dst[first:last], np.uint32(last - first)) + extra
            cupy_call(f"launch {name} grid={ctas} block={THREADS} smem={smem}",
                      kern, (int(ctas),), (THREADS,), args, shared_mem=smem)
            launches += 1
    return Launch(name, int(ctas), THREADS, smem, launches)


def launch_gate(flag_ptr: int, timeout_ns: int, stream: Any) -> None:
    """Enqueue the 1-thread gate kernel on ``stream`` (see ``gate_spin`` in the source)."""
    import numpy as np

    kern = get_kernel(GATE)
    with stream:
        cupy_call("launch gate_spin", kern, (1,), (1,), (np.uint64(flag_ptr), np.uint64(timeout_ns)))


def estimated_ctas_per_sm(smem_bytes: int, device: int = 0) -> int:
    """Resident 128-thread CTAs per SM allowed by threads and shared memory (registers ignored)."""
    import cupy

    rt = cupy.cuda.runtime
    smem_sm = rt.deviceGetAttribute(81, device)        # MaxSharedMemoryPerMultiprocessor
    reserved = rt.deviceGetAttribute(111, device)      # ReservedSharedMemoryPerBlock
    threads_sm = rt.deviceGetAttribute(39, device)     # MaxThreadsPerMultiProcessor
    blocks_sm = rt.deviceGetAttribute(106, device)     # MaxBlocksPerMultiprocessor
    by_smem = smem_sm // (smem_bytes + reserved) if smem_bytes + reserved > 0 else blocks_sm
    return int(min(blocks_sm, threads_sm // THREADS, by_smem))
