"""Committed raw measurements, packed small: columns instead of rows, xz instead of gzip.

A hardware run's results are mostly its calls: thousands of rows with the same keys. Packed,
``results.json.xz`` holds the results object with ``calls`` stored as ``calls_columns`` (one list
per key, in row order; a time column whose values are all whole multiples of 0.1 us, as the
committed runs keep them, as integers of that unit, listed in ``columns_e4``): lossless (every
value reads back as it was), about 40 % of the gzipped rows. A GIL benchmark file
(``*.jsonl.xz``, one run a line) stores each run's calls as ``calls_ns``: the thread, the start
after that thread's previous start and the duration, in integer nanoseconds, the resolution the
times were measured with (``time.perf_counter`` differences: every value is a whole number of
nanoseconds up to float noise below 1e-14 s, which packing drops).

:func:`read_json` and :func:`read_lines` read plain, gzipped and packed files alike, and return
the rows the code expects; :func:`pack_results` and :func:`pack_runs` write the packed forms
(``tools/pack_measurements.py`` packs the committed ones).
"""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path
from typing import Any

XZ = lzma.PRESET_EXTREME | 9


# The slim form of a call: what kvsim validate and the concurrency judge read of a run's calls
# (its times, lock times, CPU and copy figures; not its arguments or per-unit counts), and, from
# the hardware executor, the manager call's thread CPU time (``cpu_terms_us["thread_cpu"]``, in
# ms; None from the simulator).
SLIM_CALL_FIELDS = ("index", "thread", "phase", "api", "mode", "ok", "error", "start_ms",
                    "latency_ms", "lock_requested_ms", "lock_granted_ms", "lock_released_ms",
                    "lock_wait_ms", "cpu_ms", "submit_ms", "copies_done_ms", "offloaded_pages",
                    "onboarded_pages", "dropped_pages", "thread_cpu_ms")


def thread_cpu_ms(call: dict) -> float | None:
    """The hardware executor's thread CPU time of the call, in ms (a slim call keeps its own;
    None from the simulator)."""
    if "cpu_terms_us" not in call:
        return call.get("thread_cpu_ms")
    us = (call["cpu_terms_us"] or {}).get("thread_cpu")
    return None if us is None else us / 1e3


def slim_calls(calls: list[dict]) -> list[dict]:
    """Each call cut to :data:`SLIM_CALL_FIELDS`, milliseconds to 0.1 us (far below what a
    perf_counter pair resolves on these hosts)."""
    out = []
    for c in calls:
        row = {k: c.get(k) for k in SLIM_CALL_FIELDS}
        row["thread_cpu_ms"] = thread_cpu_ms(c)
        out.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    return out


def _text(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(raw).decode()
    if path.suffix == ".gz":
        return gzip.decompress(raw).decode()
    return raw.decode()


def _unpack(obj: Any) -> Any:
    if isinstance(obj, dict) and "calls_columns" in obj:
        cols = obj.pop("calls_columns")
        for key in obj.pop("columns_e4", []):  # stored as integers of 1e-4 of their unit
            cols[key] = [None if v is None else v / 1e4 for v in cols[key]]
        keys = list(cols)
        obj["calls"] = [dict(zip(keys, row)) for row in zip(*(cols[k] for k in keys))]
    if isinstance(obj, dict) and "calls_ns" in obj:
        c = obj.pop("calls_ns")
        last: dict[str, int] = {}
        calls = []
        for thread, delta, duration in zip(c["thread"], c["start_delta"], c["duration"]):
            start = last.get(thread, 0) + delta
            last[thread] = start
            calls.append([thread, start / 1e9, (start + duration) / 1e9])
        obj["calls"] = calls
    return obj


def read_json(path: str | Path) -> Any:
    """A JSON file, plain, ``.gz`` or ``.xz``, packed columns turned back into rows."""
    return _unpack(json.loads(_text(Path(path))))


def read_lines(path: str | Path) -> list[Any]:
    """A JSONL file (plain, ``.gz`` or ``.xz``), one object a line, unpacked."""
    return [_unpack(json.loads(line)) for line in _text(Path(path)).splitlines() if line.strip()]


def first_existing(directory: Path, name: str) -> Path | None:
    """``name`` in ``directory``, or its ``.gz`` or ``.xz`` form, whichever exists."""
    for candidate in (name, name + ".xz", name + ".gz"):
        if (directory / candidate).exists():
            return directory / candidate
    return None


def _e4(values: list) -> list | None:
    """``values`` as integers of 1e-4, if that is exact for every one (committed hardware runs
    keep times to 0.1 us), else None."""
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if not isinstance(v, float):
            return None
        n = round(v * 1e4)
        if n / 1e4 != v:
            return None
        out.append(n)
    return out


def pack_results(obj: dict) -> bytes:
    """A results object with its calls as columns (times as integers where that is exact),
    xz-compressed."""
    out = dict(obj)
    calls = out.pop("calls")
    keys = sorted({k for c in calls for k in c})
    cols = {k: [c.get(k) for c in calls] for k in keys}
    scaled = []
    for k in keys:
        if k.endswith("_ms") and (ints := _e4(cols[k])) is not None:
            cols[k] = ints
            scaled.append(k)
    out["calls_columns"] = cols
    out["columns_e4"] = scaled
    return lzma.compress(json.dumps(out, sort_keys=True, separators=(",", ":")).encode(),
                         preset=XZ)


def pack_runs(runs: list[dict]) -> bytes:
    """GIL benchmark runs (``calls`` as ``[thread, start_s, end_s]``) in nanoseconds: each call's
    start after its thread's previous one, and its duration."""
    lines = []
    for run in runs:
        out = dict(run)
        calls = out.pop("calls")
        last: dict[str, int] = {}
        deltas, durations = [], []
        for thread, start_s, end_s in calls:
            start, end = round(start_s * 1e9), round(end_s * 1e9)
            deltas.append(start - last.get(thread, 0))
            durations.append(end - start)
            last[thread] = start
        out["calls_ns"] = {"thread": [c[0] for c in calls], "start_delta": deltas,
                           "duration": durations}
        lines.append(json.dumps(out, sort_keys=True, separators=(",", ":")))
    return lzma.compress(("\n".join(lines) + "\n").encode(), preset=XZ)
