"""How much of a copy submission runs without the GIL (the CPU preset's ``copy_submit_gil_free``).

GPU machine. What it moves: the copy batches of a scenario's plans (default
``scenarios/bugs/gil_deadlock.yaml``, its base run on the simulator, the same manager code the
hardware executor runs), every batch with pages, in plan order, on pools laid out as the hardware
executor lays out that scenario's levels. How: :class:`hw.executor_copies.PlanCopier` with the
copy selector, as the hardware executor submits them, one batch at a time on an idle stream
(synchronized after each), ``--repeats`` times over the list after one warm-up pass. How it is
timed: ``perf_counter`` around each batch's enqueue (``pools.copy_batch``, what
``BatchRecord.host_submit_s`` and the simulator's submission price time), and inside it around
every call that enters CUDA: the slot lists' upload (``cupy.asarray``), kernel launches
(CuPy's launch with its argument packing), ``cudaMemcpyAsync`` (CuPy) and
``cudaMemcpyBatchAsync`` (cuda-bindings, with its list conversion). Argument packing and
conversion hold the GIL, so the share is an upper bound. An upload also allocates from CuPy's
pool, which holds the GIL: the same allocation (``cupy.empty`` of the same shapes) is timed
after the batch and taken off.

Whether those calls release the GIL is measured, not assumed (``--no-check`` skips it): each is
repeated while a second thread spins in Python with the switch interval at ``--interval-ms``. A
call that releases the GIL lets the spinner in and waits about an interval to get it back; one
that holds it returns in microseconds. Two controls show the method separates them
(``time.sleep(1e-5)`` releases, a short Python loop does not). One recorded call of each kind
is run again for its check; the time of a kind found to hold the GIL is left out of the share.

Writes ``OUT.json``: the verdicts, per batch the enqueue time, the time in CUDA calls (less the
allocations) and the selector's predicted host time, and the pooled share
(sum of GIL-free time over sum of enqueue time), with the machine, GPU and driver.

    python3 tools/copy_submit_gil_share.py OUT.json [--scenario FILE] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def releases_gil(fn: Callable[[], Any], calls: int = 15, interval_s: float = 0.02) -> dict:
    """Whether ``fn`` releases the GIL: the median of ``calls`` timed calls while another thread
    spins in Python at switch interval ``interval_s``. Released: the spinner takes the GIL and
    keeps it until this thread's wait for it times out (about an interval), so the call takes
    at least that; held: the call runs as alone (a forced switch lands inside one only by chance,
    so the median is not moved). The verdict is a median above half the interval."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            for _ in range(100):
                pass

    old = sys.getswitchinterval()
    spinner = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(interval_s)
    try:
        spinner.start()
        time.sleep(2 * interval_s)  # the spinner is running or asking for the GIL
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    finally:
        stop.set()
        sys.setswitchinterval(old)
        spinner.join()
    median = statistics.median(times)
    return {"median_us": median * 1e6, "interval_us": interval_s * 1e6, "calls": calls,
            "releases": median > interval_s / 2}


def share(rows: list[dict], releasing: set[str] | None = None) -> dict:
    """Pooled over ``rows`` (per batch ``enqueue_us``, ``cuda_us`` by kind of call and the
    uploads' ``alloc_us``): the share of enqueue time spent in the CUDA calls of the
    ``releasing`` kinds (all if None), less the uploads' allocations, clipped to [0, 1] per
    row; ``share_upper`` keeps the allocations in."""
    def cuda(r: dict) -> float:
        return sum(us for k, us in r["cuda_us"].items() if releasing is None or k in releasing)

    def alloc(r: dict) -> float:
        return r["alloc_us"] if releasing is None or "upload" in releasing else 0.0

    enq = sum(r["enqueue_us"] for r in rows)
    free = sum(min(r["enqueue_us"], max(0.0, cuda(r) - alloc(r))) for r in rows)
    upper = sum(min(r["enqueue_us"], cuda(r)) for r in rows)
    return {"enqueue_us": enq, "gil_free_us": free, "share": free / enq if enq else None,
            "share_upper": upper / enq if enq else None, "batches": len(rows)}


class _Timer:
    """Sums the time spent in wrapped calls by kind, and counts them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.by_kind: dict[str, int] = {}
        self.sample: dict[str, Callable[[], Any]] = {}  # one call of each kind, to run again

    def wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sample.setdefault(kind, lambda: fn(*args, **kwargs))
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t0
                self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--scenario", default="scenarios/bugs/gil_deadlock.yaml")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--no-check", action="store_true", help="skip the GIL-release checks")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats: at least 1, got {args.repeats}")

    import cupy
    import numpy as np

    import hw.copy_kernels as copy_kernels
    from hw.executor_copies import PlanCopier
    from hw.pools import HostDevicePools
    from kvsim.calibration.plan_batches import capture_plans
    from kvsim.hardware import load_hardware
    from kvsim.manager.manager import KVCacheManager
    from kvsim.model.copy_select import CopySelector
    from kvsim.scenario.load import load_scenario_file

    scenario = load_scenario_file(ROOT / args.scenario).base
    captured, _info = capture_plans([args.scenario], variants=False)
    batches = [c.batch for c in captured if c.batch.num_pages > 0]
    if not batches:
        raise SystemExit(f"{args.scenario}: its plans have no copy batch with pages")
    hardware = load_hardware(scenario.hardware)
    layout = KVCacheManager(scenario.manager).layout
    pools = HostDevicePools(layout, [lv.quota_bytes for lv in scenario.manager.levels],
                            hardware=hardware)
    stream = cupy.cuda.Stream(non_blocking=True)
    copier = PlanCopier(pools, selector=CopySelector(hardware), stream=stream)

    timer = _Timer()
    real_asarray = cupy.asarray
    timed_asarray = timer.wrap("upload", real_asarray)
    uploads: list[tuple[tuple[int, ...], Any]] = []

    class _Cupy:
        """``cupy`` for the pools, with its uploads timed (and their shapes kept)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(cupy, name)

        @staticmethod
        def asarray(a: Any, *args: Any, **kwargs: Any) -> Any:
            uploads.append((np.shape(a), np.asarray(a).dtype))
            return timed_asarray(a, *args, **kwargs)

    real_cupy_call = copy_kernels.cupy_call
    timed_launch = timer.wrap("launch", real_cupy_call)

    def cupy_call(what: str, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        if what.startswith("launch"):
            return timed_launch(what, fn, *a, **kw)
        return real_cupy_call(what, fn, *a, **kw)

    pools._cp = _Cupy()
    copy_kernels.cupy_call = cupy_call
    runtime = cupy.cuda.runtime  # the copy-engine path's per-page calls look it up each batch
    runtime.memcpyAsync = timer.wrap("cudaMemcpyAsync", runtime.memcpyAsync)

    class _Bindings:
        """``cuda.bindings.runtime`` for the batch copier, its batched copy timed."""

        def __init__(self, rt: Any) -> None:
            self._rt = rt
            self.cudaMemcpyBatchAsync = timer.wrap("cudaMemcpyBatchAsync", rt.cudaMemcpyBatchAsync)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._rt, name)

    def alloc_us(shapes: list[tuple[tuple[int, ...], Any]]) -> float:
        """What the uploads' allocations cost (they hold the GIL): the same ``cupy.empty`` calls,
        timed on their own after the batch, median of 5."""
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for shape, dtype in shapes:
                cupy.empty(shape, dtype)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    def one_pass() -> list[dict]:
        rows = []
        for b in batches:
            before = dict(timer.seconds)
            uploads.clear()
            (rec,) = copier.submit([b])
            cuda_us = {k: (s - before.get(k, 0.0)) * 1e6 for k, s in timer.seconds.items()
                       if s > before.get(k, 0.0)}
            copier.wait()
            rows.append({"kind": b.kind, "pages": b.num_pages, "path": rec.path, "ctas": rec.ctas,
                         "enqueue_us": rec.host_submit_s * 1e6, "cuda_us": cuda_us,
                         "alloc_us": alloc_us(list(uploads)),
                         "predicted_host_us": (None if rec.predicted_host_s is None
                                               else rec.predicted_host_s * 1e6)})
        return rows

    one_pass()  # warm-up: kernels compiled, pools touched, the batch copier made
    if pools._batcher is not None:
        pools._batcher._rt = _Bindings(pools._batcher._rt)
    rows = [r | {"repeat": k} for k in range(args.repeats) for r in one_pass()]
    pooled = share(rows)

    checks: dict[str, Any] = {}
    if not args.no_check:
        interval = args.interval_ms * 1e-3
        checks = {
            "control_sleep_10us": releases_gil(lambda: time.sleep(1e-5), interval_s=interval),
            "control_python_loop": releases_gil(lambda: sum(range(200)), interval_s=interval),
        } | {kind: releases_gil(again, interval_s=interval) for kind, again in timer.sample.items()}
        stream.synchronize()
        told_apart = (checks["control_sleep_10us"]["releases"]
                      and not checks["control_python_loop"]["releases"])
        checks["method"] = "ok: the controls were told apart" if told_apart else \
            "failed: the controls were not told apart"
        held = {k for k in timer.sample if not checks[k]["releases"]}
        if held:  # their time is not GIL-free
            pooled = share(rows, set(timer.sample) - held) | {"not_releasing": sorted(held)}
    dev = cupy.cuda.runtime.getDeviceProperties(0)
    out = {
        "what": __doc__.split("\n")[0],
        "scenario": args.scenario,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"node": platform.node(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "gpu": dev["name"].decode(),
                    "driver": cupy.cuda.runtime.driverGetVersion(),
                    "cupy": cupy.__version__},
        "repeats": args.repeats, "calls_by_kind": timer.by_kind,
        "gil_release": checks, "pooled": pooled,
        "median_enqueue_us": statistics.median(r["enqueue_us"] for r in rows),
        "median_predicted_host_us": statistics.median(
            r["predicted_host_us"] for r in rows if r["predicted_host_us"] is not None),
        "batches": rows,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("pooled", "median_enqueue_us",
                                          "median_predicted_host_us", "calls_by_kind")}
                     | {"checks": {k: (v if isinstance(v, str) else v["releases"])
                                   for k, v in checks.items()}}, indent=1))
    return 0


def _upload(asarray: Callable[..., Any], src: Any, stream: Any) -> Any:
    with stream:
        return asarray(src)


if __name__ == "__main__":
    sys.exit(main())
