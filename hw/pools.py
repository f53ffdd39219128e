"""Real pools for the manager's slots: level 0 in device memory, level 1 in pinned mapped host memory.

:class:`HostDevicePools` allocates, for every cache level and pool group, one buffer per pool,
laid out exactly as the manager's slots: slot ``i`` of pool ``p`` lives at
``base_p + i * pool_slot_bytes[p]``. Level 0 is ``cudaMalloc`` memory (``cupy.cuda.Memory``); level
1 is ``cudaHostAlloc(n, cudaHostAllocMapped)`` memory, whose host pointer kernels use directly
(unified addressing). A disk level is not supported (refused).

Sizing is checked before anything is allocated: the device total against ``cudaMemGetInfo``'s free
bytes, the host total against ``/proc/meminfo`` MemAvailable. (On Firecracker machines whose memory
grows as it is used, MemAvailable can under-report at start; pass ``host_available_bytes``.)

:meth:`HostDevicePools.copy_batch` executes one manager :class:`~kvsim.manager.plan.CopyBatch` with
one of three paths, on a CUDA stream, asynchronously:

* ``kernel``   -- :func:`hw.copy_kernels.copy_pages` once per pool: the LDGSTS kernel when slot size
  and both bases are 16-byte multiples, else the alignment-agnostic kernel (4- or 1-byte elements);
* ``ce-batch`` -- one ``cudaMemcpyBatchAsync`` for every page of every pool (:mod:`hw.copy_engine`);
* ``ce-page``  -- one ``cudaMemcpyAsync`` per page per pool.

Intra-level batches (compaction, partial-reuse copies) work with every path (device-to-device or
host-to-host). :meth:`fill_signature` and :meth:`verify` implement the ``--verify`` mode: each byte
of a page is a hash of (block id, pool index, byte offset), so a page that is lost, moved to the
wrong slot, mixed with another pool or shifted inside its slot is caught.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.manager.config import StorageLayout
from kvsim.manager.plan import CopyBatch

DEVICE_LEVEL = 0
HOST_LEVEL = 1
COPY_PATHS = ("kernel", "ce-batch", "ce-page")
HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped
VERIFY_CHUNK_BYTES = 64 << 20  # temporary memory bound of fill/verify
# Used when no HardwareSpec is given: KVCM2's bytes in flight per CTA (seed PR #18541), and 8 CTAs,
# which reach 95 % of the kernel plateau on the H200 measured here in both directions at 16-64 KiB
# in flight (reports/measurements/h200/README.md, CTA sweep); intra-device copies get more.
FALLBACK_INFLIGHT_BYTES = {"offload": 32 * 1024, "onboard": 64 * 1024, "intra": 32 * 1024}
FALLBACK_CTAS = {"offload": 8, "onboard": 8, "intra": 32}


class InsufficientMemoryError(RuntimeError):
    """The pools would not fit in free memory; raised before anything is allocated."""


class IntegrityError(RuntimeError):
    """``--verify`` found a page whose bytes are not its block's signature."""


@dataclass(frozen=True)
class PoolSpec:
    level: int
    group: int
    pool: int
    slot_bytes: int
    num_slots: int

    @property
    def num_bytes(self) -> int:
        return self.slot_bytes * self.num_slots


def plan_pools(layout: StorageLayout,
               level_quotas: Sequence[int | Sequence[int] | None] | None = None) -> list[PoolSpec]:
    """One :class:`PoolSpec` per (level, pool group, pool). Pure.

    ``level_quotas[level]``: bytes (one int, split over pool groups as the manager splits it, or
    one int per group), or None for the layout's own slot count; None = the layout's quotas.
    """
    if layout.num_levels > 2:
        raise ValueError(f"the hardware pools hold a GPU and a host level; the layout has "
                         f"{layout.num_levels} levels ({', '.join(layout.level_names)})")
    if level_quotas is not None and len(level_quotas) != layout.num_levels:
        raise ValueError(f"level_quotas lists {len(level_quotas)} levels, the layout has "
                         f"{layout.num_levels}")
    specs = []
    for lv in range(layout.num_levels):
        q = None if level_quotas is None else level_quotas[lv]
        if q is None:
            slots = layout.level_slots[lv]
        else:
            slots = layout.split_quota(list(q) if isinstance(q, (list, tuple)) else q,
                                       layout.level_names[lv])
        for g, pg in enumerate(layout.pool_groups):
            for p, sb in enumerate(pg.pool_slot_bytes):
                specs.append(PoolSpec(lv, g, p, int(sb), int(slots[g])))
    return specs


def memory_need(specs: Sequence[PoolSpec], base_offset: int = 0) -> dict[str, int]:
    """Bytes the pools take on the device (level 0) and in pinned host memory (level 1)."""
    need = {"device": 0, "host": 0}
    for s in specs:
        if s.num_slots:
            need["device" if s.level == DEVICE_LEVEL else "host"] += s.num_bytes + base_offset
    return need


def check_fits(need: Mapping[str, int], free_device: int, free_host: int) -> None:
    """Raise :class:`InsufficientMemoryError` naming each tier whose need exceeds its free bytes."""
    problems = []
    if need["device"] > free_device:
        problems.append(f"GPU level needs {need['device']} bytes, cudaMemGetInfo reports "
                        f"{free_device} free")
    if need["host"] > free_host:
        problems.append(f"host level needs {need['host']} bytes of pinned memory, /proc/meminfo "
                        f"MemAvailable is {free_host}")
    if problems:
        raise InsufficientMemoryError("pool quotas exceed free memory (nothing was allocated): "
                                      + "; ".join(problems))


def host_available_bytes(meminfo: str | None = None) -> int:
    """MemAvailable from ``/proc/meminfo`` (or the given text), in bytes."""
    if meminfo is None:
        with open("/proc/meminfo") as f:
            meminfo = f.read()
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            scale = {"kB": 1024, "mB": 1 << 20, "gB": 1 << 30}.get(parts[2], 1) if len(parts) > 2 else 1
            return int(parts[1]) * scale
    raise ValueError("no MemAvailable line in /proc/meminfo")


@dataclass(frozen=True)
class BatchExecution:
    """What :meth:`HostDevicePools.copy_batch` enqueued."""

    path: str
    direction: str
    num_pages: int
    num_bytes: int
    calls: int  # kernel launches, batch calls or per-page calls
    kernels: tuple[str, ...] = ()  # kernel name expressions (path 'kernel')
    ctas: int | None = None
    inflight_bytes: int | None = None


@dataclass(frozen=True)
class VerifyResult:
    pages: int
    bytes: int
    num_bad: int  # (page, pool) pairs with any wrong byte
    bad: tuple[tuple[int, int, int, int], ...]  # (slot, block id, pool, wrong bytes), first 32

    @property
    def ok(self) -> bool:
        return self.num_bad == 0

    def raise_if_bad(self, where: str = "verify") -> None:
        if self.num_bad:
            shown = ", ".join(f"slot {s} block {b} pool {p} ({n} bytes wrong)" for s, b, p, n in self.bad[:8])
            raise IntegrityError(f"{where}: {self.num_bad} (page, pool) pairs of {self.pages} pages "
                                 f"corrupted or lost, e.g. {shown}")


_SIGNATURE_SRC = r"""
unsigned long long page = i / slot_bytes;
unsigned long long off = i - page * slot_bytes;
unsigned long long z = (unsigned long long)blocks[page] * 0x9E3779B97F4A7C15ull
                       + ((unsigned long long)pool << 40) + off;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
out = (unsigned char)((z ^ (z >> 31)) >> 24);
"""


class HostDevicePools:
    """Device and pinned host buffers laid out as the manager's slots (see the module docstring).

    ``layout``: the manager's :class:`StorageLayout`; ``level_quotas``: see :func:`plan_pools`.
    ``hardware``: a :class:`~kvsim.hardware.spec.HardwareSpec` for the kernel's default CTA count
    (``grid_ctas``) and bytes in flight; without it, :data:`FALLBACK_CTAS` and
    :data:`FALLBACK_INFLIGHT_BYTES`. ``base_offset`` shifts every pool's base by that many bytes
    (tests use it to force the alignment-agnostic kernel). Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, layout: StorageLayout,
                 level_quotas: Sequence[int | Sequence[int] | None] | None = None,
                 *, device: int = 0, hardware: Any = None, base_offset: int = 0,
                 host_available: int | None = None) -> None:
        import cupy

        from hw.cuda_check import cupy_call

        if base_offset < 0:
            raise ValueError(f"base_offset must be >= 0, got {base_offset}")
        self.layout = layout
        self.device = int(device)
        self.hardware = hardware
        self.base_offset = int(base_offset)
        self.specs = plan_pools(layout, level_quotas)
        self._cp = cupy
        cupy_call(f"cudaSetDevice({self.device})", cupy.cuda.Device(self.device).use)
        need = memory_need(self.specs, self.base_offset)
        free_dev = int(cupy_call("cudaMemGetInfo", cupy.cuda.runtime.memGetInfo)[0])
        free_host = host_available_bytes() if host_available is None else int(host_available)
        check_fits(need, free_dev, free_host)

        self._dev_mem: list[Any] = []
        self._host_ptrs: list[int] = []
        self._base: dict[tuple[int, int, int], int] = {}
        self._spec: dict[tuple[int, int, int], PoolSpec] = {}
        self._batcher: Any = None
        self._sig_kernel: Any = None
        try:
            for s in self.specs:
                key = (s.level, s.group, s.pool)
                self._spec[key] = s
                if not s.num_slots:
                    self._base[key] = 0
                    continue
                n = s.num_bytes + self.base_offset
                if s.level == DEVICE_LEVEL:
                    mem = cupy_call(f"cudaMalloc({n}) for level 0 group {s.group} pool {s.pool}",
                                    cupy.cuda.Memory, n)
                    self._dev_mem.append(mem)
                    ptr = int(mem.ptr)
                else:
                    ptr = int(cupy_call(f"cudaHostAlloc({n}, cudaHostAllocMapped) for level "
                                        f"{s.level} group {s.group} pool {s.pool}",
                                        cupy.cuda.runtime.hostAlloc, n, HOST_ALLOC_MAPPED))
                    self._host_ptrs.append(ptr)
                self._base[key] = ptr + self.base_offset
        except BaseException:
            self.close()
            raise

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the device, then free every buffer (idempotent)."""
        cp = self._cp
        try:
            cp.cuda.runtime.deviceSynchronize()
        except Exception:
            pass
        while self._host_ptrs:
            try:
                cp.cuda.runtime.freeHost(self._host_ptrs.pop())
            except Exception:
                pass
        self._dev_mem.clear()
        self._base.clear()

    def __enter__(self) -> HostDevicePools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses -------------------------------------------------------------------------------
    def spec(self, level: int, group: int, pool: int) -> PoolSpec:
        try:
            return self._spec[(level, group, pool)]
        except KeyError:
            raise ValueError(f"no pool at level {level}, pool group {group}, pool {pool}") from None

    def base(self, level: int, group: int, pool: int) -> int:
        """Address of slot 0 of one pool (a device pointer, or a mapped host pointer)."""
        self.spec(level, group, pool)
        if (level, group, pool) not in self._base:
            raise RuntimeError("the pools are closed")
        return self._base[(level, group, pool)]

    def num_pools(self, group: int) -> int:
        return len(self.layout.pool_groups[group].pool_slot_bytes)

    def aligned(self, level: int, group: int) -> bool:
        """True when every pool of the group at ``level`` suits the 16-byte LDGSTS kernel."""
        return all(self.base(level, group, p) % 16 == 0 and self.spec(level, group, p).slot_bytes % 16 == 0
                   for p in range(self.num_pools(group)))

    def view(self, level: int, group: int, pool: int) -> Any:
        """A ``(num_slots, slot_bytes)`` uint8 CuPy array over one pool (host pools too)."""
        cp = self._cp
        s = self.spec(level, group, pool)
        if not s.num_slots:
            return cp.empty((0, s.slot_bytes), dtype=cp.uint8)
        mem = cp.cuda.UnownedMemory(self.base(level, group, pool), s.num_bytes, self,
                                    device_id=self.device)
        arr = cp.ndarray((s.num_bytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))
        return arr.reshape(s.num_slots, s.slot_bytes)

    # -- copies ----------------------------------------------------------------------------------
    def _check_batch(self, batch: CopyBatch) -> tuple[np.ndarray, np.ndarray]:
        src = np.ascontiguousarray(batch.src_slots, dtype=np.int32)
        dst = np.ascontiguousarray(batch.dst_slots, dtype=np.int32)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(f"CopyBatch src_slots {src.shape} and dst_slots {dst.shape} differ")
        g = batch.pool_group
        layout_bytes = self.layout.pool_groups[g].pool_slot_bytes
        if tuple(batch.pool_slot_bytes) != tuple(layout_bytes):
            raise ValueError(f"CopyBatch pool_slot_bytes {batch.pool_slot_bytes} differ from the "
                             f"layout's {layout_bytes} for pool group {g}")
        for lv, slots in ((batch.src_level, src), (batch.dst_level, dst)):
            n = self.spec(lv, g, 0).num_slots
            if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= n):
                raise ValueError(f"CopyBatch slots out of range for level {lv} pool group {g}: "
                                 f"[{int(slots.min())}, {int(slots.max())}] vs {n} slots")
        return src, dst

    def default_ctas(self, direction: str) -> int:
        if self.hardware is not None and direction != "intra":
            from kvsim.model.copy_paths import grid_ctas

            return grid_ctas(self.hardware, direction)
        return FALLBACK_CTAS[direction]

    def default_inflight(self, direction: str) -> int:
        if self.hardware is not None and direction != "intra":
            return int(self.hardware.kernel.default_inflight_bytes[direction])
        return FALLBACK_INFLIGHT_BYTES[direction]

    def copy_batch(self, batch: CopyBatch, path: str, stream: Any, ctas: int | None = None,
                   inflight_bytes: int | None = None) -> BatchExecution:
        """Enqueue ``batch`` on ``stream`` with ``path``; returns what was enqueued (asynchronous).

        ``ctas``/``inflight_bytes`` apply to the kernel path (defaults: :meth:`default_ctas`,
        :meth:`default_inflight`). ``ce-batch`` needs a non-default stream.
        """
        from hw import copy_engine, copy_kernels

        if path not in COPY_PATHS:
            raise ValueError(f"path must be one of {', '.join(COPY_PATHS)}, got {path!r}")
        src, dst = self._check_batch(batch)
        direction = batch.kind  # offload, onboard or intra
        g = batch.pool_group
        npools = self.num_pools(g)
        if src.size == 0:
            return BatchExecution(path, direction, 0, 0, 0)
        pairs = [(self.base(batch.src_level, g, p), self.base(batch.dst_level, g, p),
                  self.spec(batch.src_level, g, p).slot_bytes) for p in range(npools)]
        if path == "kernel":
            cp = self._cp
            n_ctas = int(ctas or self.default_ctas(direction))
            inflight = int(inflight_bytes or self.default_inflight(direction))
            with stream:
                d_src = cp.asarray(src)
                d_dst = cp.asarray(dst)
            names, calls = [], 0
            for sb, db, nbytes in pairs:
                launch = copy_kernels.copy_pages(sb, db, nbytes, d_src, d_dst, n_ctas, inflight, stream)
                names.append(launch.kernel)
                calls += launch.launches
            return BatchExecution(path, direction, int(src.size), batch.num_bytes, calls,
                                  tuple(names), n_ctas, inflight)
        if path == "ce-batch":
            if self._batcher is None:
                self._batcher = copy_engine.BatchCopier(device=self.device)
            dsts: list[int] = []
            srcs: list[int] = []
            sizes: list[int] = []
            for sb, db, nbytes in pairs:
                srcs += copy_engine.page_pointers(sb, nbytes, src.tolist())
                dsts += copy_engine.page_pointers(db, nbytes, dst.tolist())
                sizes += [nbytes] * int(src.size)
            self._batcher.copy(dsts, srcs, sizes, stream)
            return BatchExecution(path, direction, int(src.size), batch.num_bytes, 1)
        calls = 0
        for sb, db, nbytes in pairs:
            calls += copy_engine.memcpy_per_page(copy_engine.page_pointers(db, nbytes, dst.tolist()),
                                                 copy_engine.page_pointers(sb, nbytes, src.tolist()),
                                                 nbytes, stream)
        return BatchExecution(path, direction, int(src.size), batch.num_bytes, calls)

    # -- --verify --------------------------------------------------------------------------------
    def _signature(self, blocks: Any, slot_bytes: int, pool: int) -> Any:
        """``(len(blocks), slot_bytes)`` uint8 signature bytes, computed on the device."""
        cp = self._cp
        if self._sig_kernel is None:
            self._sig_kernel = cp.ElementwiseKernel(
                "raw int64 blocks, uint64 slot_bytes, uint64 pool", "uint8 out", _SIGNATURE_SRC,
                "kvsim_page_signature")
        out = cp.empty((int(blocks.size), slot_bytes), dtype=cp.uint8)
        if out.size:
            self._sig_kernel(blocks, np.uint64(slot_bytes), np.uint64(pool), out)
        return out

    def _chunks(self, level: int, group: int, slots: Any, block_ids: Any):
        slots = np.asarray(slots, dtype=np.int64).ravel()
        blocks = np.asarray(block_ids, dtype=np.int64).ravel()
        if slots.shape != blocks.shape:
            raise ValueError(f"slots ({slots.size}) and block_ids ({blocks.size}) differ in length")
        n = self.spec(level, group, 0).num_slots
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= n):
            raise ValueError(f"slots out of range for level {level} pool group {group} ({n} slots)")
        cp = self._cp
        for p in range(self.num_pools(group)):
            sb = self.spec(level, group, p).slot_bytes
            rows = max(1, VERIFY_CHUNK_BYTES // sb)
            view = self.view(level, group, p)
            for k in range(0, slots.size, rows):
                yield p, view, slots[k:k + rows], cp.asarray(slots[k:k + rows]), \
                    blocks[k:k + rows], self._signature(cp.asarray(blocks[k:k + rows]), sb, p)

    def fill_signature(self, level: int, group: int, slots: Any, block_ids: Any) -> None:
        """Write each slot's page as the signature of its block id (every pool). Synchronous."""
        cp = self._cp
        for _p, view, _s, d_slots, _b, sig in self._chunks(level, group, slots, block_ids):
            view[d_slots] = sig
        cp.cuda.runtime.deviceSynchronize()

    def verify(self, level: int, group: int, slots: Any, block_ids: Any) -> VerifyResult:
        """Check that each slot holds its block's signature in every pool. Synchronous."""
        bad: list[tuple[int, int, int, int]] = []
        pages = int(np.asarray(slots).size)
        nbytes = num_bad = 0
        for p, view, h_slots, d_slots, h_blocks, sig in self._chunks(level, group, slots, block_ids):
            wrong = (view[d_slots] != sig).sum(axis=1).get()
            nbytes += sig.size
            rows = np.flatnonzero(wrong)
            num_bad += int(rows.size)
            for i in rows[: max(0, 32 - len(bad))]:
                bad.append((int(h_slots[i]), int(h_blocks[i]), p, int(wrong[i])))
        return VerifyResult(pages, nbytes, num_bad, tuple(bad))

