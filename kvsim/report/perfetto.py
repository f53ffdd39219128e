"""A timed run as a Chrome/Perfetto trace (``trace.json``, the ``traceEvents`` JSON format), so a
simulated run and a measured run of one scenario open the same way in https://ui.perfetto.dev.

The trace is built from the results object alone (:func:`kvsim.scenario.results.timed_results`,
executors ``sim`` and ``hw``; the plan executor has no time and gets no trace). Tracks (tids are
unique over the whole trace, as Perfetto keys threads by tid alone, and count up from 3 in the
order below; metadata events name every process and track):

* process ``threads`` (pid 1): per workload thread, in sorted name order, a track named after the
  thread with one complete slice (``"ph": "X"``) per manager call (name: the API, args:
  ``index``, ``phase``, ``ok``, ``mode``, and ``error`` if it failed), then a track
  ``"<thread> / lock"`` with the call's lock wait (``lock wait (<mode>)``, requested to granted;
  left out when it lasted no time) and lock hold (``lock hold (<mode>)``, granted to released),
  args ``index`` and ``api``. A call starting where the thread's last one ended by the clock may
  round to 1 ns before it; it is moved to that end, so the track's slices never overlap.
* process ``copies`` (pid 2): per copy direction (``offload``, ``onboard``, then any other, such
  as ``intra``: within one tier) and copy stream (sorted), a track ``"<direction> / <stream>"``
  with one slice per copy batch, started to finished (name: ``"<api> <direction>"``, args
  ``bytes``, ``pages``, ``path``, ``ctas``, ``api``, ``thread``, ``queued_us``: submitted to
  started). Slices on one track must nest, so batches that overlap on a stream go to further
  lanes ``"<direction> / <stream> (2)"``, ...

Times: ``ts`` and ``dur`` are microseconds from the start of the run (simulated seconds for
``sim``, ``perf_counter`` seconds for ``hw``: the results' own clock), rounded to whole
nanoseconds. What never ended (a call, wait, hold or copy cut off by a deadlock) runs to the
run's end, ``results["sim"|"hw"]["end_time_s"]``, and says ``"unfinished": true`` in its args.

GIL holds: from the simulator, a third track per thread, ``"<thread> / GIL"``, with a slice
per hold (``GIL``, granted to released), read from the run's private ``_gil_holds`` (held in
memory, not written to results.json, so ``kvsim report`` on a results directory cannot add
them). The hardware executor cannot observe the real GIL: its traces have the track, empty, and
``otherData.gil_holds`` says which.

Size: at most ``max_events`` slices (:data:`MAX_EVENTS`, 200,000) are written, the earliest in
time (ties: by process, track); the metadata events naming processes and tracks do not count.
``otherData`` says how many were built, written and left out, and where the cut fell
(``cut_at_us``, null when nothing was left out). The same results give a byte-identical file:
compact JSON, keys sorted, events in a total order.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.scenario.results import finite

MAX_EVENTS = 200_000
THREADS_PID, COPIES_PID = 1, 2
FIRST_TID = 3  # above the pids: a tid equal to its pid is that process's main thread
DIRECTIONS = ("offload", "onboard")


def _ns(ms: float) -> int:
    return round(ms * 1e6)


def _slice(name: str, cat: str, pid: int, tid: int, start_ns: int, end_ns: int,
           args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_ns / 1e3,
            "dur": max(0, end_ns - start_ns) / 1e3, "args": args}


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def end_time_s(results: dict) -> float:
    """The run's end: the executor's ``end_time_s``, else the last end the results show."""
    for key in ("sim", "hw"):
        end = (results.get(key) or {}).get("end_time_s")
        if end is not None:
            return end
    ends = [c["start_ms"] / 1e3 + (c["latency_ms"] or 0.0) / 1e3 for c in results["calls"]]
    ends += [c[k] for c in results.get("copies", []) for k in ("submitted", "finished")
             if c.get(k) is not None]
    return max(ends, default=0.0)


def _thread_events(results: dict, end_ns: int) -> tuple[list[dict], list[dict]]:
    calls = results["calls"]
    threads = sorted({c["thread"] for c in calls} | set(results.get("thread_starts") or {}))
    meta, out = [], []
    tid_of = {}
    for i, thread in enumerate(threads):
        tid_of[thread] = FIRST_TID + 3 * i
        for tid, label in ((tid_of[thread], thread), (tid_of[thread] + 1, f"{thread} / lock"),
                           (tid_of[thread] + 2, f"{thread} / GIL")):
            meta += [_meta("thread_name", THREADS_PID, tid, {"name": label}),
                     _meta("thread_sort_index", THREADS_PID, tid, {"sort_index": tid})]
    last_end = dict.fromkeys(tid_of.values(), 0)
    for c in calls:
        tid = tid_of[c["thread"]]
        # One thread's calls follow each other; a call starting where the last one ended may
        # round to 1 ns before it, and slices on a track must not overlap.
        start = max(_ns(c["start_ms"]), min(last_end[tid], _ns(c["start_ms"]) + 1))
        unfinished = c["latency_ms"] is None
        end = end_ns if unfinished else max(start, _ns(c["start_ms"] + c["latency_ms"]))
        last_end[tid] = end
        args = {"index": c["index"], "phase": c["phase"], "ok": c["ok"], "mode": c["mode"]}
        if c.get("error"):
            args["error"] = c["error"]
        if unfinished:
            args["unfinished"] = True
        out.append(_slice(c["api"], "call", THREADS_PID, tid, start, end, args))
        if c.get("lock_requested_ms") is None:
            continue
        requested = _ns(c["lock_requested_ms"])
        granted = None if c["lock_granted_ms"] is None else _ns(c["lock_granted_ms"])
        lock_args = {"index": c["index"], "api": c["api"]}
        if granted is None or granted > requested:
            out.append(_slice(f"lock wait ({c['mode']})", "lock", THREADS_PID, tid + 1, requested,
                              end_ns if granted is None else granted,
                              lock_args | ({"unfinished": True} if granted is None else {})))
        if granted is not None:
            released = None if c["lock_released_ms"] is None else _ns(c["lock_released_ms"])
            out.append(_slice(f"lock hold ({c['mode']})", "lock", THREADS_PID, tid + 1, granted,
                              end_ns if released is None else released,
                              lock_args | ({"unfinished": True} if released is None else {})))
    for thread, start_ms, end_ms in results.get("_gil_holds", ()):
        if thread in tid_of and end_ms > start_ms:
            out.append(_slice("GIL", "gil", THREADS_PID, tid_of[thread] + 2, _ns(start_ms),
                              _ns(end_ms), {}))
    return meta, out


def _copy_events(results: dict, end_ns: int, first_tid: int) -> tuple[list[dict], list[dict]]:
    groups: dict[tuple[int, str, str], list[tuple[int, int, int, dict]]] = {}
    for n, c in enumerate(results.get("copies", [])):
        submitted = _ns(c["submitted"] * 1e3)
        start = submitted if c.get("started") is None else _ns(c["started"] * 1e3)
        end = end_ns if c.get("finished") is None else _ns(c["finished"] * 1e3)
        order = DIRECTIONS.index(c["kind"]) if c["kind"] in DIRECTIONS else len(DIRECTIONS)
        groups.setdefault((order, c["kind"], c["stream"]), []).append(
            (start, max(start, end), n, c | {"_queued_ns": start - submitted}))
    tracks: list[tuple[tuple[int, str, str, int], list]] = []
    for key in sorted(groups):
        lanes: list[list] = []  # each lane: [last end, its copies]
        for start, end, _, c in sorted(groups[key]):
            lane = next((la for la in lanes if la[0] <= start), None)
            if lane is None:
                lane = [end, []]
                lanes.append(lane)
            lane[0] = end
            lane[1].append((start, end, c))
        tracks += [((*key, i), lane[1]) for i, lane in enumerate(lanes)]
    meta, out = [], []
    for tid, ((_, kind, stream, lane), copies) in enumerate(tracks, start=first_tid):
        label = f"{kind} / {stream}" + (f" ({lane + 1})" if lane else "")
        meta += [_meta("thread_name", COPIES_PID, tid, {"name": label}),
                 _meta("thread_sort_index", COPIES_PID, tid, {"sort_index": tid})]
        for start, end, c in copies:
            args = {"bytes": c["num_bytes"], "pages": c["pages"], "path": c["path"],
                    "ctas": c["ctas"], "api": c["api"], "thread": c["thread"],
                    "queued_us": c["_queued_ns"] / 1e3}
            if c.get("finished") is None:
                args["unfinished"] = True
            out.append(_slice(f"{c['api']} {kind}", "copy", COPIES_PID, tid, start, end, args))
    return meta, out


def trace_events(results: dict, max_events: int = MAX_EVENTS) -> dict:
    """The trace of a timed run's results (``{"traceEvents": [...], "otherData": {...}}``)."""
    end_ns = _ns(end_time_s(results) * 1e3)
    thread_meta, thread_slices = _thread_events(results, end_ns)
    thread_tids = {e["tid"] for e in thread_meta}
    copy_meta, copy_slices = _copy_events(results, end_ns, FIRST_TID + len(thread_tids))
    scenario = results.get("scenario", {}).get("name", "")
    variant = (results.get("variant") or {}).get("name")
    label = f"{results.get('executor')}: {scenario}" + (f" / {variant}" if variant else "")
    meta = []
    for pid, name, tracks in ((THREADS_PID, "threads", thread_meta),
                              (COPIES_PID, "copies", copy_meta)):
        meta += [_meta("process_name", pid, pid, {"name": name}),
                 _meta("process_sort_index", pid, pid, {"sort_index": pid}),
                 _meta("process_labels", pid, pid, {"labels": label}), *tracks]
    # A total order: time, then track, then the longer (enclosing) slice, then build order.
    keyed = sorted((e["ts"], e["pid"], e["tid"], -e["dur"], n, e)
                   for n, e in enumerate(thread_slices + copy_slices))
    kept = [k[-1] for k in keyed[:max_events]]
    left_out = keyed[max_events:]
    lock = results.get("lock") or {}
    other = {
        "generator": "kvsim.report.perfetto",
        "scenario": scenario,
        "variant": variant,
        "executor": results.get("executor"),
        "hardware": results.get("hardware"),
        "clock": "us from the start of the run ("
                 + ("simulated time" if results.get("executor") == "sim" else "perf_counter")
                 + ")",
        "end_time_us": end_ns / 1e3,
        "max_events": max_events,
        "slices_total": len(keyed),
        "slices_written": len(kept),
        "slices_left_out": len(left_out),
        "cut_at_us": left_out[0][0] if left_out else None,
        "gil_acquisitions": lock.get("gil_acquisitions"),
        "gil_holds": ("exported: one slice per hold on each thread's GIL track"
                      if results.get("_gil_holds") else
                      "none recorded (the hardware executor cannot observe the real GIL, or a "
                      "results.json read back without them)"),
    }
    return {"traceEvents": meta + kept, "otherData": other}


def trace_json(results: dict, max_events: int = MAX_EVENTS) -> str:
    """The trace as compact JSON, keys sorted: the same results give the same bytes."""
    return json.dumps(finite(trace_events(results, max_events)), sort_keys=True,
                      separators=(",", ":"), allow_nan=False) + "\n"


def write_trace(results: dict, path: Path, max_events: int = MAX_EVENTS) -> None:
    """Write the trace of ``results`` to ``path`` (``trace.json``)."""
    Path(path).write_text(trace_json(results, max_events))
