"""Calibrating the CPU cost model to this project's own Python manager, on the machine it runs on.

What it times: single manager calls (``time.perf_counter`` around the call alone, garbage
collection paused, median of ``repeats`` fresh runs) in workloads that vary one count at a time:
burst resizes with and without eviction over page counts, probes over prefix lengths (the second
of two identical probes: probes repeat), commits over token counts.
What it fits: ``seconds = per_call + sum(unit_cost * count)`` by non-negative least squares over
the ``fit`` cases; the ``judge`` cases (other sizes) are predicted, not fitted, and their errors
are reported.

Each case is also timed as the first call of a thread that has just started (the hardware
executor starts one Python thread per workload thread, so a workload's first call runs there):
such a call pays for a fresh malloc arena and caches of another core. The median ratio of the
two times over the one-shot ``fit`` cases is the preset's ``first_call_factor``. The result is a CPU cost
preset (``kvsim/hardware/cpu/*.json`` format) whose sources name the measurement file.
"""

from __future__ import annotations

import gc
import platform
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.manager.plan import WorkCounts

UNITS = ("pages_allocated", "pages_migrated", "eviction_candidates", "blocks_hashed",
         "tree_nodes_created", "stats_page_records")
PAGE = (8192, 8192)  # the seed's 16 KiB pages


@dataclass
class Case:
    name: str
    role: str  # fit | judge
    seconds: float
    counts: dict[str, int]
    samples: list[float]
    thread_seconds: float = 0.0  # the same call as a fresh thread's first call
    thread_samples: list[float] = None  # type: ignore[assignment]
    one_shot: bool = True  # timed as the first call on its state (not after a warm-up call)


def _config(gpu_pages: int, host_pages: int) -> ManagerConfig:
    return ManagerConfig(
        layers=(LayerConfig(slot_bytes=PAGE), LayerConfig(slot_bytes=PAGE, window_tokens=4096)),
        levels=(LevelConfig("gpu", gpu_pages * 16384), LevelConfig("host", host_pages * 16384)),
        tokens_per_block=32)


def _filled(gpu_pages: int, fill: bool) -> KVCacheManager:
    mgr = KVCacheManager(_config(gpu_pages, 4 * gpu_pages + 8192))
    if fill:
        tokens = gpu_pages * 32 // 4  # two life cycles: tokens/32 blocks x 2 pages = half the GPU
        for i in range(2):
            c = mgr.create_kv_cache()
            assert c.resume() and c.resize(tokens)
            c.commit(np.arange(i * tokens, (i + 1) * tokens, dtype=np.uint32) + 7)
            c.close()
    return mgr


def _time(setup: Callable[[], Callable[[], object]], repeats: int,
          in_new_thread: bool = False) -> tuple[float, list[float], WorkCounts]:
    samples, counts = [], WorkCounts()
    def timed(call: Callable[[], object], out: dict) -> None:
        gc.disable()  # a collection inside the timed call is noise, not the manager's cost
        try:
            t0 = time.perf_counter()
            out["result"] = call()
            out["seconds"] = time.perf_counter() - t0
        finally:
            gc.enable()

    for _ in range(repeats):
        call = setup()
        gc.collect()
        warm_up = getattr(call, "warm_up", None)
        if warm_up is not None:  # after the collection, which would evict what it warmed
            warm_up()
        out: dict = {}
        if in_new_thread:
            worker = threading.Thread(target=timed, args=(call, out))
            worker.start()
            worker.join()
        else:
            timed(call, out)
        samples.append(out["seconds"])
        result = out["result"]
        counts = result if isinstance(result, WorkCounts) else counts
    return statistics.median(samples), samples, counts


def _resize_case(pages: int, evict: bool, gpu_pages: int | None = None):
    """A resize of ``pages`` on a GPU tier half full of evictable pages (``evict``; 8192 pages
    unless ``gpu_pages``) or empty (16384 pages)."""
    def setup():
        mgr = _filled(gpu_pages or (8192 if evict else 16384), evict)
        req = mgr.create_kv_cache()
        assert req.resume()
        blocks = pages // 2  # two life cycles, no stale blocks (history 0)

        def call():
            outcome = req.resize.with_plan(blocks * 32)
            assert outcome.value
            return outcome.plan.counts
        return call
    return setup


def _probe_case(tokens: int):
    # Probes are read-only and repeat (a workload probes the same prefixes over and over): the
    # timed probe is the second of two identical ones, back to back, as in a workload's steady
    # state. Resizes and commits change the state, so they are timed once on a fresh manager.
    def setup():
        mgr = _filled(8192, True)
        toks = np.arange(7, 7 + tokens, dtype=np.uint32)

        def call():
            return mgr.probe_reuse.with_plan(toks).plan.counts
        call.warm_up = lambda: mgr.probe_reuse(toks)  # type: ignore[attr-defined]
        return call
    return setup


def _commit_case(tokens: int):
    def setup():
        mgr = _filled(8192, False)
        c = mgr.create_kv_cache()
        assert c.resume() and c.resize(tokens)
        toks = np.arange(10**6, 10**6 + tokens, dtype=np.uint32)

        def call():
            return c.commit.with_plan(toks).plan.counts
        return call
    return setup


def measure(repeats: int = 5, progress: Callable[[str], None] | None = None) -> list[Case]:
    plan = []
    for pages in (500, 1000, 2000, 4000, 6000):
        role = "fit" if pages in (500, 2000, 6000) else "judge"
        plan.append((f"resize evicting {pages} pages", role, _resize_case(pages, True)))
        plan.append((f"resize allocating {pages} pages", role, _resize_case(pages, False)))
    for tokens in (512, 2048, 4096, 8192, 16384):
        role = "fit" if tokens in (512, 4096, 16384) else "judge"
        plan.append((f"probe of {tokens} tokens", role, _probe_case(tokens)))
        plan.append((f"commit of {tokens} tokens", role, _commit_case(tokens)))
    cases = []
    # What the process held before the measurement survives it: frozen, it is left out of the
    # collection before each timed call, which then costs what the cases made, not what the
    # caller holds (a test process holds ~10^6 objects: 50 ms a collection, 80 of them). Only
    # where the caller froze nothing: unfreezing after would thaw what the caller froze (the
    # tests freeze what they collected; a thawed worker walked it in every collection after).
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.collect()
        gc.freeze()
    try:
        for i, (name, role, setup) in enumerate(plan):
            seconds, samples, counts = _time(setup, repeats)
            t_seconds, t_samples, _ = _time(setup, repeats, in_new_thread=True)
            cases.append(Case(name, role, seconds, {u: getattr(counts, u) for u in UNITS},
                              samples, t_seconds, t_samples, one_shot=not name.startswith("probe")))
            if progress is not None:
                progress(f"{i + 1}/{len(plan)} {name}: {seconds * 1e3:.3f} ms")
    finally:
        if ours:
            gc.unfreeze()
    return cases


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by active-set elimination (small problems only)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def relative_nnls(rows, target, scale=None) -> np.ndarray:
    """:func:`nnls` of relative errors: each row divided by its measured value (``scale``,
    default ``target``), so that small values weigh as much as large ones."""
    w = 1.0 / np.asarray(scale if scale is not None else target, dtype=float)
    return nnls(np.asarray(rows, dtype=float) * w[:, None], np.asarray(target, dtype=float) * w)


def fit(cases: list[Case]) -> dict[str, float]:
    """Unit costs in microseconds (and ``per_call_us``) from the ``fit`` cases.

    Rows are weighted by 1/seconds, so the fit minimises relative error."""
    rows = [c for c in cases if c.role == "fit"]
    a = np.array([[1.0] + [c.counts[u] for u in UNITS] for c in rows])
    b = np.array([c.seconds * 1e6 for c in rows])
    w = 1.0 / b
    x = nnls(a * w[:, None], b * w)
    return {"per_call_us": float(x[0]), **{u: float(v) for u, v in zip(UNITS, x[1:])}}


def first_call_factor(cases: list[Case]) -> float:
    """Median over the one-shot ``fit`` cases (resizes, commits) of (the call as a fresh thread's
    first call) / (on the main thread). Probes are timed after a warm-up probe, so theirs would
    compare a warm call with a cold one."""
    return float(statistics.median(c.thread_seconds / c.seconds for c in cases
                                   if c.role == "fit" and c.one_shot and c.seconds > 0))


def predict_us(costs: dict[str, float], counts: dict[str, int]) -> float:
    return costs["per_call_us"] + sum(costs[u] * counts.get(u, 0) for u in UNITS)


def preset(costs: dict[str, float], source_file: str, name: str,
           call_overhead_us: float | None = None, thread_factor: float | None = None,
           gil: dict | None = None, thread_start_us: float | None = None,
           churn: tuple[dict[str, float], float] | None = None) -> dict:
    """The CPU preset; ``call_overhead_us`` (from :mod:`kvsim.calibration.host_overhead`) is the
    executor's per-call host work outside the manager, lock included; ``gil`` the estimate of
    :func:`kvsim.calibration.gil_handover.estimate`, ``thread_start_us`` the cost of
    ``Thread.start()`` (:func:`kvsim.calibration.gil_handover.thread_start_cost`) and ``churn``
    :func:`kvsim.calibration.api_costs.fit`'s (fixed cost per method, cost per eviction round)."""
    machine = machine_label(platform.node() or "this host",
                            platform.processor() or platform.machine(), platform.python_version())
    src = (f"{source_file}: kvsim.calibration.cpu_fit {machine}; non-negative least squares over "
           "the 'fit' cases")
    python_call = ({"value": 0.0, "source": "not measured (included in per_call_us)"}
                   if call_overhead_us is None else
                   {"value": round(call_overhead_us, 3),
                    "source": f"{source_file}: kvsim.calibration.host_overhead {machine}; hardware "
                              "executor latency less manager time, median over cheap calls "
                              "(lock acquire and release included)"})
    out = {
        "name": name,
        "description": "This project's Python manager (kvsim.manager), fitted on the machine named in the "
                       "sources. The manager runs in Python, so its CPU time holds the GIL.",
        "includes_copy_submission": False,
        "holds_gil": True,
        "per_call_us": {"value": round(costs["per_call_us"], 4), "source": src},
        "python_call_us": python_call,
        **({} if thread_factor is None else {"first_call_factor": {
            "value": round(thread_factor, 4),
            "source": f"{source_file}: kvsim.calibration.cpu_fit {machine}; median over the 'fit' "
                      "cases of (the call as a fresh thread's first call) / (on the main thread)"}}),
        **({} if gil is None else gil_fields(gil, source_file, machine)),
        **({} if thread_start_us is None else {"thread_start_us": {
            "value": round(thread_start_us, 2),
            "source": f"{source_file}: kvsim.calibration.gil_handover.thread_start_cost {machine}; "
                      "median Thread.start() of a thread with nothing to do"}}),
        "callback_us": {"value": 0.0, "source": "not calibrated; no workload here uses callbacks"},
        "unit_us": {u: {"value": round(costs[u], 5), "source": src} for u in UNITS},
    }
    if churn is not None:
        intercepts, round_us = churn
        churn_src = (f"{source_file}: kvsim.calibration.api_costs {machine}; median over the "
                     "churn loop's calls of their time less the unit costs of their counts")
        out["api_call_us"] = {"value": {k: round(v, 3) for k, v in sorted(intercepts.items())},
                              "source": churn_src}
        out["unit_us"]["eviction_rounds"] = {
            "value": round(round_us, 5),
            "source": churn_src + "; per round of the evicting resizes, over the others' intercept"}
    return out


def machine_label(node: str, processor: str, python: str) -> str:
    """How a preset's sources name the machine a figure was measured on."""
    return f"on {node} ({processor}, Python {python})"


def gil_fields(gil: dict, source_file: str, machine: str) -> dict:
    """The measured GIL hand-over (:class:`kvsim.sim.gil.Handover`) from ``gil``: an estimate of
    :func:`kvsim.calibration.gil_handover.estimate` with, under "fit", what
    :func:`kvsim.calibration.gil_fit.fit` made of it, and under "host_speed" the host speed
    factor of the same runs (:func:`kvsim.calibration.host_speed.factor`). Without holds to
    estimate from, nothing (the simulator then keeps CPython's switch-interval rule)."""
    if not gil.get("hold_quantiles_ms"):
        return {}
    where = f"{source_file}: kvsim.calibration.gil_handover {machine}"
    fitted = gil.get("fit")
    scale = fitted["hold_scale"] if fitted else 1.0
    fit_note = (f"; x {scale:.4g}, fitted by kvsim.calibration.gil_fit to the benchmark's probe "
                f"latencies (loss {fitted['loss']:.4f})" if fitted else "; not fitted")
    out = {
        "gil_hold_ms": {
            "value": {"probs": gil["hold_probs"],
                      "quantiles_ms": [round(q * scale, 4) for q in gil["hold_quantiles_ms"]]},
            "source": f"{where}; Kaplan-Meier estimate over {gil['holds']} holds "
                      f"({gil['worker_takeovers']} ended by a takeover) scaled to one waiter"
                      f"{fit_note}"},
        "gil_hold_waiter_exponent": {
            "value": fitted["waiter_exponent"] if fitted else gil["waiter_exponent"],
            "source": (f"{source_file}: kvsim.calibration.gil_fit {machine}; fitted with the hold "
                       f"scale (the estimate, by profile maximum likelihood over the same holds: "
                       f"{gil['waiter_exponent']:+.2f})" if fitted else
                       f"{where}; profile maximum likelihood over the same holds")},
        "gil_recent_taker_share": {
            "value": fitted["recent_taker_share"] if fitted else 0.0,
            "source": (f"{source_file}: kvsim.calibration.gil_fit {machine}; fitted with the "
                       "hold scale" if fitted else "not fitted: a waiter picked at random")},
    }
    rate, seen = gil.get("starter_takeover_per_s"), gil.get("starter_takeovers", 0)
    if seen and rate:
        lo, hi = gil["starter_takeover_interval_per_s"]
        at = "the estimated waiter exponent"
        if fitted and fitted.get("starter_takeover_per_s"):
            # Same takeovers over the exposure at the fitted exponent: the interval scales alike.
            ratio = fitted["starter_takeover_per_s"] / rate
            rate, lo, hi = fitted["starter_takeover_per_s"], lo * ratio, hi * ratio
            at = "the fitted waiter exponent"
        out["gil_starter_takeover_per_s"] = {
            "value": round(rate, 2),
            "source": f"{where}; {seen} starter takeovers in the benchmark's runs, at {at}, "
                      f"90 % interval [{lo:.1f}, {hi:.1f}] per s"}
    if gil.get("host_speed"):
        from kvsim.calibration.host_speed import preset_field

        out["host_speed_factor"] = preset_field(gil["host_speed"], f"{source_file} {machine}")
    return out
