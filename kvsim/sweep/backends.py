"""Where the points run: a local process pool, or Dask distributed.

Both call :func:`kvsim.sweep.points.run_point` on plain task dicts in worker processes and hand
each row to ``on_row`` in the calling thread as it arrives (in completion order; the table is
sorted afterwards). A point whose worker dies, or that the backend loses, is recorded with the
error (``worker failed: ...``) and retried by the next run.

* ``local``: :class:`concurrent.futures.ProcessPoolExecutor` with ``workers`` processes, started
  by a fork server that has imported the simulator once (``spawn`` where there is none).
* ``dask``: a :class:`distributed.LocalCluster` (``workers`` processes, one thread each) when no
  scheduler address is given, else ``distributed.Client(address)`` on an existing cluster, whose
  workers must have kvsim installed and see the scenario files at the same paths.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from kvsim.sweep.points import failed_row, run_point

BACKENDS = ("local", "dask")
OnRow = Callable[[dict], None]


def default_workers() -> int:
    return os.cpu_count() or 1


def _mp_context():
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["kvsim.sweep.points", "kvsim.scenario.run"])
        return ctx
    return multiprocessing.get_context("spawn")


def run_local(tasks: list[dict], workers: int, on_row: OnRow) -> None:
    if not tasks:
        return
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(tasks))),
                               mp_context=_mp_context())
    try:
        pending = {pool.submit(run_point, t): t for t in tasks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                task = pending.pop(fut)
                try:
                    row = fut.result()
                except Exception as e:  # the worker died (BrokenProcessPool, ...)
                    row = failed_row(task, e)
                on_row(row)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def run_dask(tasks: list[dict], workers: int, on_row: OnRow, scheduler: str | None = None) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("--backend dask needs Dask distributed: pip install 'kvsim[sweep]'") from e
    if not tasks:
        return
    cluster = None
    if scheduler:
        client = Client(scheduler)
    else:
        cluster = LocalCluster(n_workers=max(1, min(workers, len(tasks))), threads_per_worker=1,
                               processes=True, dashboard_address=":0",
                               silence_logs=logging.ERROR)
        client = Client(cluster)
    try:
        futures = client.map(run_point, tasks, pure=False)
        by_key = {f.key: t for f, t in zip(futures, tasks)}
        for fut in as_completed(futures):
            try:
                row = fut.result()
            except Exception as e:  # a worker died, or the cluster lost the task
                row = failed_row(by_key[fut.key], e)
            on_row(row)
            fut.release()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_tasks(tasks: list[dict], on_row: OnRow, backend: str = "local", workers: int | None = None,
              scheduler: str | None = None) -> None:
    workers = workers or default_workers()
    if backend == "local":
        if scheduler:
            raise ValueError("--scheduler is for --backend dask")
        run_local(tasks, workers, on_row)
    elif backend == "dask":
        run_dask(tasks, workers, on_row, scheduler)
    else:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
