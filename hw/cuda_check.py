"""One place that checks CUDA return codes and names the failing call.

Two kinds of API are used in ``hw/``:

* ``cuda.bindings`` (``from cuda.bindings import runtime``): every call returns a tuple whose first
  element is a ``cudaError_t`` (or ``CUresult`` for the driver module); :func:`check` raises when it
  is not success and returns the remaining values.
* CuPy (``cupy.cuda.runtime``, kernel launches, NVRTC): CuPy raises its own exceptions;
  :func:`cupy_call` re-raises them as :class:`CudaCallError` naming the call.

Nothing here imports CUDA modules at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class CudaCallError(RuntimeError):
    """A CUDA call failed; the message names the call and the error."""

    def __init__(self, call: str, code: int | None, name: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.name = name
        self.detail = detail
        msg = f"{call} failed: {name}"
        if code is not None:
            msg += f" ({code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


def _describe_bindings_error(err: Any) -> tuple[str, str]:
    """Name and description of a cuda.bindings error enum (runtime or driver)."""
    name = getattr(err, "name", None) or str(err)
    detail = ""
    try:
        from cuda.bindings import runtime as rt

        if isinstance(err, rt.cudaError_t):
            res = rt.cudaGetErrorString(err)
            if int(res[0]) == 0:
                detail = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
            return name, detail
    except Exception:  # pragma: no cover - best effort description only
        pass
    try:
        from cuda.bindings import driver as drv

        if isinstance(err, drv.CUresult):
            res = drv.cuGetErrorString(err)
            if int(res[0]) == 0:
                detail = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
    except Exception:  # pragma: no cover
        pass
    return name, detail


def check(result: Any, call: str) -> tuple:
    """Check a cuda.bindings result tuple ``(err, *values)``; return ``values`` (maybe empty).

    Raises :class:`CudaCallError` naming ``call`` when ``err`` is not success.
    """
    if not isinstance(result, tuple):
        result = (result,)
    if not result:
        raise CudaCallError(call, None, "empty result tuple")
    err = result[0]
    code = int(err)
    if code != 0:
        name, detail = _describe_bindings_error(err)
        raise CudaCallError(call, code, name, detail)
    return tuple(result[1:])


def cupy_call(call: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a CuPy CUDA call; re-raise any failure as :class:`CudaCallError` naming ``call``."""
    try:
        return fn(*args, **kwargs)
    except CudaCallError:
        raise
    except Exception as exc:  # CUDARuntimeError, CUDADriverError, NVRTCError, ...
        code = getattr(exc, "status", None)
        raise CudaCallError(call, code if isinstance(code, int) else None,
                            type(exc).__name__, str(exc)) from exc


def sync(stream: Any, call: str) -> None:
    """Synchronize a CuPy stream (surfaces asynchronous errors) and name what was being waited on."""
    cupy_call(f"{call} (stream synchronize)", stream.synchronize)
