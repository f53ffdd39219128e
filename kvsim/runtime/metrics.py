"""Summaries of a run (a :class:`~kvsim.runtime.records.RunResult`, from either executor):
latency distributions, lock waits and holds, link and copies.

Times in the summaries are milliseconds (``_ms``) or seconds (``_s``) as named; byte counts are
bytes; link rates are GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import numpy as np

from kvsim.runtime.records import CallRecord, RunResult


def distribution_ms(values_s: list[float]) -> dict[str, float | int]:
    """count, p50, p90, p99 and max of durations given in seconds, in milliseconds."""
    if not values_s:
        return {"count": 0}
    a = np.asarray(values_s) * 1e3
    return {
        "count": int(a.size),
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
        "mean_ms": float(a.mean()),
    }


def per_api(calls: list[CallRecord]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for api in sorted({c.api for c in calls}):
        mine = [c for c in calls if c.api == api]
        row = {"count": len(mine), "ok": sum(c.ok for c in mine),
               "failed": sum(not c.ok for c in mine)}
        row["latency"] = distribution_ms([c.latency for c in mine if c.latency is not None])
        row["lock_wait"] = distribution_ms([c.lock_wait for c in mine if c.lock_granted is not None])
        out[api] = row
    return out


def lock_summary(run: RunResult) -> dict:
    threads: dict[str, dict[str, float]] = {}
    for acq in run.lock_log:
        row = threads.setdefault(acq.thread, {"acquisitions": 0, "wait_s": 0.0, "hold_s": 0.0,
                                              "max_wait_s": 0.0})
        row["acquisitions"] += 1
        if acq.granted is not None:
            wait = acq.granted - acq.requested
            row["wait_s"] += wait
            row["max_wait_s"] = max(row["max_wait_s"], wait)
            if acq.released is not None:
                row["hold_s"] += acq.released - acq.granted
    writers = [a for a in run.lock_log if a.mode == "exclusive" and not a.nested]
    longest = max(writers, key=lambda a: (a.granted if a.granted is not None else run.end_time)
                  - a.requested, default=None)
    starvation = None
    if longest is not None:
        granted = longest.granted if longest.granted is not None else run.end_time
        wait = granted - longest.requested
        hold = (longest.released - longest.granted
                if longest.granted is not None and longest.released is not None else 0.0)
        # The part of the wait caused by readers that entered after the writer asked: from when
        # the readers present at its request had all left until it got the lock.
        drained = longest.drained_at if longest.drained_at is not None else granted
        overtaken = max(0.0, granted - drained) if longest.readers_passed else 0.0
        starvation = {
            "thread": longest.thread,
            "api": longest.api,
            "longest_writer_wait_ms": wait * 1e3,
            "writer_hold_ms": hold * 1e3,
            "readers_entered_while_waiting": longest.readers_passed,
            "wait_caused_by_overtaking_readers_ms": overtaken * 1e3,
            "granted": longest.granted is not None,
            "starved": overtaken > 0.0,
        }
    return {
        "modelled": True,
        "policy": run.lock_policy,
        "threads": threads,
        "hazards": [vars(h) for h in run.lock_hazards],
        "starvation": starvation,
        "gil_acquisitions": run.gil.acquisitions,
        "gil_wait_s": dict(sorted(run.gil.wait_s.items())),
    }


def link_summary(run: RunResult) -> dict:
    stats = run.link
    busy = {d: 0.0 for d in ("offload", "onboard")}
    for seg in stats.segments:
        if seg.offload_bps:
            busy["offload"] += seg.end - seg.start
        if seg.onboard_bps:
            busy["onboard"] += seg.end - seg.start
    return {
        "bytes": {d: int(v) for d, v in stats.bytes.items()},
        "transfers": dict(stats.transfers),
        "busy_s": busy,
        "mean_busy_gbps": {d: (stats.bytes[d] / busy[d] / 1e9 if busy[d] else 0.0) for d in busy},
        "segments": [[s.start, s.end, s.offload_bps / 1e9, s.onboard_bps / 1e9]
                     for s in stats.segments],
    }


def copies_summary(run: RunResult) -> list[dict]:
    return [
        {**vars(r), "seconds": (r.finished - r.started) if r.finished is not None else None,
         "gbps": (r.num_bytes / (r.finished - r.started) / 1e9)
         if r.finished is not None and r.finished > r.started else None}
        for r in run.copies
    ]


def probes_during_holds(run: RunResult) -> dict:
    """Probe latency split by whether the probe overlapped an exclusive hold of another thread."""
    holds = sorted((a.granted, a.released) for a in run.lock_log
                   if a.mode == "exclusive" and not a.nested and a.granted is not None
                   and a.released is not None)
    starts = np.array([g for g, _ in holds])
    # Longest hold end among holds starting at or before each index: an interval overlaps
    # [start, end) iff some hold began before `end` and ended after `start`.
    reach = np.maximum.accumulate(np.array([r for _, r in holds])) if holds else np.array([])
    during, outside = [], []
    for c in run.calls:
        if c.api != "KVCacheManager.probe_reuse" or c.end is None:
            continue
        i = int(np.searchsorted(starts, c.end, side="left")) - 1
        hit = i >= 0 and reach[i] > c.start
        (during if hit else outside).append(c.latency)
    return {"during_exclusive_hold": distribution_ms(during),
            "outside_exclusive_hold": distribution_ms(outside)}
