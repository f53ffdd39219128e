"""Recording what an executor ran as an op trace (:mod:`kvsim.traces.op_trace`), for replay.

:func:`to_trace_op` turns one executed :class:`~kvsim.runtime.steps.Call` and its record into a
:class:`TraceOp`; calls that the op-trace format cannot express (statistics reads, destructors
other than a cache's, planned drops) or whose tokens the workload did not expose are returned as
``None`` and counted by the caller.
"""

from __future__ import annotations

import numpy as np

from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call
from kvsim.traces.op_trace import TraceOp

API_TO_OP = {
    Api.CREATE_KV_CACHE: "create_kv_cache",
    Api.PROBE_REUSE: "probe_reuse",
    Api.GET_AND_RESET_ITERATION_STATS: "get_and_reset_iteration_stats",
    Api.RESUME: "resume",
    Api.SUSPEND: "suspend",
    Api.CLOSE: "close",
    Api.CACHE_DESTRUCTOR: "close",
    Api.RESIZE: "resize",
    Api.CAPACITY_SETTER: "resize",
    Api.COMMIT: "commit",
    Api.STOP_COMMITTING: "stop_committing",
    Api.COMMIT_PENDING_STATS: "commit_pending_stats",
}
NEEDS_TOKENS = {"commit", "probe_reuse"}


def to_trace_op(call: Call, thread: str, t: float, ok: bool, result: object,
                error: str, duration_s: float | None) -> TraceOp | None:
    op = API_TO_OP.get(call.api)
    if op is None:
        return None
    tokens = None
    if call.tokens is not None:
        tokens = tuple(int(x) for x in np.asarray(call.tokens).ravel())
    if op in NEEDS_TOKENS and tokens is None:
        return None
    cache = call.args.get("cache_id")
    if op != "probe_reuse" and op != "get_and_reset_iteration_stats" and cache is None:
        return None
    kwargs: dict = {}
    if op == "resize":
        if "capacity" not in call.args:
            return None
        kwargs["capacity"] = int(call.args["capacity"])
        if call.args.get("history_length") is not None:
            kwargs["history_length"] = int(call.args["history_length"])
    return TraceOp(t=max(0.0, float(t)), thread=thread, op=op,
                   cache=None if op in ("probe_reuse", "get_and_reset_iteration_stats") else str(cache),
                   tokens=tokens, ok=ok, result=result if isinstance(result, (bool, int)) else None,
                   error=error or None, duration_s=duration_s, **kwargs)
