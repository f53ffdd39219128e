"""Copy-engine (DMA) copy paths for paged KV blocks.

* :func:`memcpy_per_page`: one ``cudaMemcpyAsync`` (``cudaMemcpyDefault``, kind 4) per page through
  CuPy's runtime binding.
* :class:`BatchCopier`: ``cudaMemcpyBatchAsync`` through ``cuda.bindings.runtime``: one call for the
  whole batch, one ``cudaMemcpyAttributes`` entry (srcAccessOrder = Stream) applied from copy 0
  (``attrsIdxs = [0]``, ``numAttrs = 1``). The call returns ``(err, failIdx)`` on CUDA 12.x bindings
  and ``(err,)`` on 13.x; both are accepted and the form seen is kept in :attr:`BatchCopier.signature`.
  The legacy NULL stream is refused (the API rejects it); use a non-blocking stream.

Pointers are plain integers (unified addressing): device pointers, or pinned host pointers from
``cupy.cuda.runtime.hostAlloc``. Every return code goes through :mod:`hw.cuda_check`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hw.cuda_check import CudaCallError, check, cupy_call

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction inferred from the pointers
LEGACY_NULL_STREAM = 0


def stream_handle(stream: Any) -> int:
    """Raw ``cudaStream_t`` value of a CuPy stream, an int, or None (= legacy NULL stream, 0)."""
    if stream is None:
        return LEGACY_NULL_STREAM
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "ptr", None)
    if ptr is None:
        raise TypeError(f"not a stream: {stream!r}")
    return int(ptr)


def page_pointers(base: int, page_bytes: int, slots: Sequence[int]) -> list[int]:
    """Address of each slot's page: ``base + slot * page_bytes`` (Python ints, for the copy calls)."""
    base = int(base)
    page_bytes = int(page_bytes)
    return [base + int(s) * page_bytes for s in slots]


def memcpy_contiguous(dst: int, src: int, nbytes: int, stream: Any) -> None:
    """One ``cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream)``."""
    import cupy

    cupy_call("cudaMemcpyAsync", cupy.cuda.runtime.memcpyAsync, int(dst), int(src), int(nbytes),
              MEMCPY_DEFAULT, stream_handle(stream))


def memcpy_per_page(dst_ptrs: Sequence[int], src_ptrs: Sequence[int], page_bytes: int,
                    stream: Any) -> int:
    """One ``cudaMemcpyAsync`` per page, in order, on ``stream``. Returns the number of calls."""
    import cupy

    if len(dst_ptrs) != len(src_ptrs):
        raise ValueError("dst_ptrs and src_ptrs differ in length")
    memcpy = cupy.cuda.runtime.memcpyAsync
    h = stream_handle(stream)
    n = int(page_bytes)
    i = 0
    try:
        for i in range(len(dst_ptrs)):  # noqa: B007 - i is reported on failure
            memcpy(dst_ptrs[i], src_ptrs[i], n, MEMCPY_DEFAULT, h)
    except Exception as exc:
        raise CudaCallError(f"cudaMemcpyAsync (page {i} of {len(dst_ptrs)})", None,
                            type(exc).__name__, str(exc)) from exc
    return len(dst_ptrs)


class BatchCopier:
    """``cudaMemcpyBatchAsync`` with one attribute set (srcAccessOrder = Stream) for all copies."""

    def __init__(self, device: int | None = None, prefer_overlap_with_compute: bool = False) -> None:
        from cuda.bindings import runtime as rt

        self._rt = rt
        if device is not None:
            check(rt.cudaSetDevice(int(device)), f"cudaSetDevice({device}) [cuda.bindings]")
        attr = rt.cudaMemcpyAttributes()
        attr.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        if prefer_overlap_with_compute:
            attr.flags = int(rt.cudaMemcpyFlags.cudaMemcpyFlagPreferOverlapWithCompute)
        self._attrs = [attr]
        self._attrs_idxs = [0]
        self.signature: str | None = None  # "(err,)" or "(err, failIdx)" once a call was made
        self.last_fail_idx: int | None = None

    def copy(self, dst_ptrs: Sequence[int], src_ptrs: Sequence[int],
             sizes: int | Sequence[int], stream: Any) -> int:
        """Enqueue all copies with one call on ``stream`` (not the legacy NULL stream)."""
        n = len(dst_ptrs)
        if len(src_ptrs) != n:
            raise ValueError("dst_ptrs and src_ptrs differ in length")
        if n == 0:
            return 0
        h = stream_handle(stream)
        if h == LEGACY_NULL_STREAM:
            raise ValueError("cudaMemcpyBatchAsync must not use the legacy NULL stream; "
                             "create a non-blocking stream")
        size_list = [int(sizes)] * n if isinstance(sizes, int) else list(sizes)
        if len(size_list) != n:
            raise ValueError("sizes differ in length from the pointer lists")
        dsts = dst_ptrs if isinstance(dst_ptrs, list) else list(dst_ptrs)
        srcs = src_ptrs if isinstance(src_ptrs, list) else list(src_ptrs)
        res = self._rt.cudaMemcpyBatchAsync(dsts, srcs, size_list, n, self._attrs,
                                            self._attrs_idxs, 1, h)
        if not isinstance(res, tuple):
            res = (res,)
        self.signature = "(err, failIdx)" if len(res) >= 2 else "(err,)"
        if len(res) >= 2:
            self.last_fail_idx = int(res[1])
        where = f"cudaMemcpyBatchAsync(count={n})"
        if len(res) >= 2 and int(res[0]) != 0:
            where += f" failIdx={int(res[1])}"
        check(res[:1], where)
        return n


def bindings_version() -> str | None:
    try:
        import cuda.bindings as cb

        return str(getattr(cb, "__version__", None))
    except Exception:
        return None
