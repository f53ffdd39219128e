"""Op-trace replay: each line of an op trace (:mod:`kvsim.traces.op_trace`) becomes one call.

No setup. One workload thread per trace thread (same name); before each call the thread waits
``Until(t)``, then issues the call, so a trace recorded elsewhere replays with its timing and its
per-thread order. Cache ids are global to the trace: ``create_kv_cache`` binds the id to the new
cache (also passed to the manager as ``cache_id``), later ops look it up. A closed cache stays
bound, so what the manager says about using a closed cache is what the replay records.

A call that cannot run fails the way the manager's own errors do, so executors record it as a
failed call and go on: an op on an id no earlier ``create_kv_cache`` bound raises
:class:`UnknownCacheError`, and every error a call raises is re-raised (same type) with
``FILE:LINE: op`` in front of its message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from kvsim.errors import InvalidArgumentError
from kvsim.manager import KvCache, KVCacheManager, ManagerConfig, Outcome, Plan
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Step, Until, Workload
from kvsim.traces.op_trace import OpTrace, TraceOp, load_op_trace
from kvsim.validation import Bool, Str, schema

OP_TO_API = {
    "create_kv_cache": Api.CREATE_KV_CACHE,
    "resume": Api.RESUME,
    "suspend": Api.SUSPEND,
    "close": Api.CLOSE,
    "resize": Api.RESIZE,
    "commit": Api.COMMIT,
    "stop_committing": Api.STOP_COMMITTING,
    "commit_pending_stats": Api.COMMIT_PENDING_STATS,
    "probe_reuse": Api.PROBE_REUSE,
    "get_and_reset_iteration_stats": Api.GET_AND_RESET_ITERATION_STATS,
}


class UnknownCacheError(InvalidArgumentError):
    """An op trace names a cache that no earlier ``create_kv_cache`` created."""


@schema
@dataclass(frozen=True)
class OpTraceWorkload:
    trace: Str  # path of the JSONL op trace
    skip_bad_lines: Bool = False
    kind: Literal["op_trace"] = "op_trace"


class _Replay:
    def __init__(self, manager: KVCacheManager, trace: OpTrace) -> None:
        self.manager = manager
        self.trace = trace
        self.caches: dict[str, KvCache] = {}  # strong references: the manager's are weak

    def _where(self, op: TraceOp) -> str:
        return f"{self.trace.path}:{op.line}: {op.op}"

    def _cache(self, op: TraceOp) -> KvCache:
        cache = self.caches.get(op.cache)  # type: ignore[arg-type]
        if cache is None:
            raise UnknownCacheError(
                f"unknown cache {op.cache!r}: no create_kv_cache for it ran before this line")
        return cache

    def _action(self, op: TraceOp) -> Callable[[], Outcome]:
        m = self.manager
        name = op.op
        scope = {} if op.scope is None else {"reuse_scope": op.scope}
        if name == "create_kv_cache":
            def create() -> Outcome:
                outcome = m.create_kv_cache.with_plan(op.token_array(), cache_id=op.cache, **scope)
                if outcome.error is None:
                    self.caches[op.cache] = outcome.value  # type: ignore[index]
                return outcome
            return create
        if name == "probe_reuse":
            return lambda: m.probe_reuse.with_plan(op.token_array(), **scope)
        if name == "get_and_reset_iteration_stats":
            return m.get_and_reset_iteration_stats.with_plan
        if name == "resize":
            return lambda: self._cache(op).resize.with_plan(op.capacity, op.history_length)
        if name == "commit":
            return lambda: self._cache(op).commit.with_plan(op.token_array())
        method = name  # resume, suspend, close, stop_committing, commit_pending_stats
        return lambda: getattr(self._cache(op), method).with_plan()

    def call(self, op: TraceOp) -> Call:
        action = self._action(op)
        api = OP_TO_API[op.op]

        def invoke() -> Outcome:
            try:
                outcome = action()
            except UnknownCacheError as e:
                outcome = Outcome(None, Plan(api.plan_api, ok=False), e)
            if outcome.error is None:
                return outcome
            e = outcome.error
            try:
                wrapped = type(e)(f"{self._where(op)}: {e}")
            except TypeError:  # an error type with a different constructor
                return outcome
            return outcome._replace(error=wrapped)

        args: dict = {"line": op.line}
        if op.cache is not None:
            args["cache_id"] = op.cache
        if op.op in ("create_kv_cache", "commit", "probe_reuse"):
            args["tokens"] = op.num_tokens
        if op.op == "resize":
            args["capacity"] = op.capacity
            args["history_length"] = op.history_length
        if op.scope is not None:
            args["scope"] = op.scope
        return Call("trace", api, args, invoke)

    def thread(self, ops: list[TraceOp]) -> Iterator[Step]:
        for op in ops:
            yield Until(float(op.t))
            yield self.call(op)


def workload(config: ManagerConfig, spec: OpTraceWorkload, manager: KVCacheManager, seed: int,
             trace: OpTrace | None = None) -> Workload:
    """The trace as a workload (``trace``, if given, is used instead of loading ``spec.trace``).

    ``config`` and ``seed`` are unused (the trace fixes every call); they keep the signature of
    the other generators.
    """
    if trace is None:
        trace = load_op_trace(spec.trace, spec.skip_bad_lines)
    replay = _Replay(manager, trace)

    def threads() -> dict[str, Iterator[Step]]:
        return {name: replay.thread(ops) for name, ops in trace.threads.items()}

    return Workload(setup=(), make_threads=threads)
