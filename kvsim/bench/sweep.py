"""Benchmark: sweep throughput (points per minute) on the example sweep, and backend agreement.

What it runs: ``scenarios/sweeps/example.yaml`` (30 points: 18 burst resizes, 12 probe runs)
from scratch into a fresh temporary directory, once per worker count on the local backend
(default 1 and 2 workers) and, with ``--dask``, once on a Dask ``LocalCluster`` with the largest
worker count. Timed: ``time.perf_counter`` around ``run_sweep`` without the report (expanding the
points, starting the pool or cluster, every point, writing the table). Reports wall seconds,
points per minute, the summed in-worker seconds of the points (``wall_s``) and whether every
table is identical to the first (ignoring ``wall_s``). To read the scaling, it also times a
pure-Python loop alone and in two processes at once (``cpu_check``): on a machine whose CPUs
share one core's throughput, two workers cannot beat one.

Run: ``python -m kvsim.bench.sweep [SWEEP.yaml] [--workers 1 2] [--dask] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from kvsim.sweep.runner import run_sweep
from kvsim.sweep.spec import load_sweep
from kvsim.sweep.table import comparable

DEFAULT_SWEEP = "scenarios/sweeps/example.yaml"


def _burn(_: int) -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    return time.perf_counter() - t0


def cpu_check() -> dict:
    """Seconds of one CPU-bound loop alone, and each of two run at once in two processes."""
    import multiprocessing

    alone = _burn(0)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pair = pool.map(_burn, [0, 1])
    return {"alone_s": alone, "two_at_once_s": pair,
            "parallel_speedup": 2 * alone / max(pair)}


def _one(path: str, backend: str, workers: int, progress) -> tuple[dict, object]:
    sweep = load_sweep(path)
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-sweep-") as tmp:
        t0 = time.perf_counter()
        outcome = run_sweep(sweep, Path(tmp) / "out", backend=backend, workers=workers,
                            report=False)
        wall = time.perf_counter() - t0
    result = {"backend": backend, "workers": workers, "points": outcome.points,
              "failed": outcome.failed, "wall_s": wall, "points_per_min": outcome.points / wall * 60,
              "point_seconds_sum": float(outcome.table["wall_s"].astype("float64").sum())}
    if progress:
        progress(f"{backend} x{workers}: {outcome.points} points in {wall:.1f} s = "
                 f"{result['points_per_min']:.0f} points/min")
    return result, outcome.table


def run(path: str = DEFAULT_SWEEP, workers: tuple[int, ...] = (1, 2), dask: bool = False,
        progress=None) -> dict:
    runs, tables = [], []
    for n in workers:
        r, t = _one(path, "local", n, progress)
        runs.append(r)
        tables.append(t)
    if dask:
        r, t = _one(path, "dask", max(workers), progress)
        runs.append(r)
        tables.append(t)
    first = comparable(tables[0])
    return {"benchmark": "sweep", "sweep": path, "cpus": os.cpu_count(), "cpu_check": cpu_check(),
            "python": platform.python_version(),
            "timing": "perf_counter around run_sweep (no report), one run each, fresh directory",
            "runs": runs,
            "tables_identical": all(comparable(t).equals(first) for t in tables[1:])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvsim.bench.sweep", description=__doc__)
    p.add_argument("sweep", nargs="?", default=DEFAULT_SWEEP)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dask", action="store_true", help="also run on a Dask LocalCluster")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = run(args.sweep, tuple(args.workers), args.dask,
                 progress=None if args.json else (lambda m: print(m, file=sys.stderr)))
    print(json.dumps(result, sort_keys=True, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
