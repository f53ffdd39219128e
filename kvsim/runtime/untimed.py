"""Calls without a clock: every run's set-up, and the plan executor.

* :func:`run_setup` -- a workload's set-up calls, on the manager, before any clock starts;
  what failed comes back as records (the timed executors report them as ``setup_failures``).
* :func:`plan_run` -- the plan executor: every call of the set-up and of the threads (merged by
  their nominal times, :func:`merge_by_time`) through the manager in order, recording per call
  the plan it produced and the tier occupancy after it, and checking the invariants after each.
  It attaches no time and models no lock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from kvsim.manager import KVCacheManager, Outcome
from kvsim.manager.invariants import find_violations
from kvsim.runtime.steps import Call, GpuTimes, GpuWork, Now, Sleep, Until, Workload


def error_text(outcome: Outcome) -> str:
    """A call's error as results show it (``"TypeName: message"``), or ``""``."""
    e = outcome.error
    return "" if e is None else f"{type(e).__name__}: {e}"


def run_setup(calls: Iterable[Call],
              on_call: Callable[[Call, Outcome], None] | None = None) -> list[dict]:
    """Invoke each set-up call; returns the failed ones (api, args, error). ``on_call`` sees
    every call and its outcome (a trace recorder)."""
    failed = []
    for call in calls:
        outcome = call.invoke()
        if on_call is not None:
            on_call(call, outcome)
        if outcome.error is not None or outcome.value is False:
            failed.append({"api": call.api.label, "args": call.args,
                           "error": error_text(outcome) or "False"})
    return failed


def merge_by_time(threads: dict) -> Iterator[tuple[str, Call]]:
    """The threads' calls in the order of their nominal times (``Until``/``Sleep``/``GpuWork``
    seconds; calls take no time here), ties by thread name: a plan-only replay of concurrent
    threads. A thread's ``Now`` gets its nominal time; its ``GpuWork`` ends ``seconds`` later,
    its copies counted as landed at once."""
    clocks = {name: 0.0 for name in threads}
    reply: dict[str, object] = {}
    heap = [(0.0, name) for name in sorted(threads)]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        it = threads[name]
        while True:
            value = reply.pop(name, None)
            try:
                step = it.send(value) if value is not None else next(it)
            except StopIteration:
                break
            if isinstance(step, Now):
                reply[name] = clocks[name]
                continue
            if isinstance(step, Call):
                yield name, step
            elif isinstance(step, Sleep):
                clocks[name] += step.seconds
            elif isinstance(step, Until):
                clocks[name] = max(clocks[name], step.time)
            elif isinstance(step, GpuWork):
                start = clocks[name]
                clocks[name] += step.seconds
                reply[name] = GpuTimes(start, start, clocks[name])
            heapq.heappush(heap, (clocks[name], name))
            break


def occupancy(manager: KVCacheManager) -> list[dict[str, int]]:
    """Per level: total, free and evictable pages over its pool groups."""
    out = []
    for level in range(manager.layout.num_levels):
        rows = manager.get_storage_statistics(level)
        out.append({k: sum(r[k] for r in rows) for k in ("total", "free", "evictable")})
    return out


@dataclass
class PlanRun:
    records: list[dict] = field(default_factory=list)
    violations: list[dict] = field(default_factory=list)


def plan_run(manager: KVCacheManager, workload: Workload) -> PlanRun:
    """The plan executor (see the module docstring)."""
    run = PlanRun()

    def one(call: Call, thread: str) -> None:
        outcome = call.invoke()
        plan, result = outcome.plan, outcome.value
        run.records.append({
            "index": len(run.records), "thread": thread, "phase": call.phase,
            "api": call.api.label, "args": call.args, "ok": outcome.ok,
            "result": result if isinstance(result, bool) else None,
            "offloaded_pages": plan.offloaded_pages, "offloaded_bytes": plan.offloaded_bytes,
            "onboarded_pages": plan.onboarded_pages, "onboarded_bytes": plan.onboarded_bytes,
            "dropped_pages": plan.counts.pages_dropped, "copy_batches": len(plan.copies),
            "counts": plan.counts.to_dict(), "occupancy": occupancy(manager),
            "error": error_text(outcome),
        })
        for problem in find_violations(manager):
            run.violations.append({"kind": "invariant", "index": len(run.records) - 1,
                                   "api": call.api.label, "problem": problem})

    for call in workload.setup:
        one(call, "setup")
    for name, call in merge_by_time(workload.make_threads()):
        one(call, name)
    return run
