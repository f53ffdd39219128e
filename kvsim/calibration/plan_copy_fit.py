"""Fitting the copier terms of a hardware JSON to ``python3 -m hw.bench_plan_copies`` output.

Fitted, per direction, on the kernel rows (the kernel forced to N CTAs; CUDA-event device time):
``kernel.page_latency_us`` (the per-page term of each CTA window) and ``copier.batch_device_us``
(device time before the batch's first launch runs), by grid search minimising the mean absolute
percentage error of :func:`kvsim.model.copy_paths.estimate` summed over the batch's pools, every
other kernel figure taken from the hardware spec given. Fitted on the selector rows (host
``perf_counter`` around ``PlanCopier.submit`` with the path selector): ``copier.submit_batch_host_us``
and ``copier.submit_page_host_us``, by non-negative least squares on the submission time less
``launches * kernel.launch_host_us``.

The measurement leaves out the validation scenario's batch shape (8 KiB pools, 6380 pages), so
that scenario judges these figures.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np

from kvsim.calibration.cpu_fit import nnls
from kvsim.hardware.spec import DIRECTIONS, HardwareSpec, PerDirection
from kvsim.model.copy_paths import CopyRequest, estimate

PAGE_LATENCY_GRID_US = np.round(np.arange(0.0, 1.0001, 0.01), 4)
BATCH_DEVICE_GRID_US = np.arange(0.0, 250.0001, 2.5)


def predict_device_s(hw: HardwareSpec, row: dict) -> float:
    """The model's device time of one measured batch: its pools one after another."""
    return sum(estimate(hw, CopyRequest("kernel", row["direction"], int(sb), int(row["pages"]),
                                        row["ctas"], row["inflight_bytes"], via_copier=i == 0)).seconds
               for i, sb in enumerate(row["pool_slot_bytes"]))


def _with(hw: HardwareSpec, direction: str, page_latency_us: float, batch_device_us: float) -> HardwareSpec:
    pl = dict(hw.kernel.page_latency_us.__dict__)
    bd = dict(hw.copier.batch_device_us.__dict__)
    pl[direction], bd[direction] = float(page_latency_us), float(batch_device_us)
    return replace(hw, kernel=replace(hw.kernel, page_latency_us=PerDirection(**pl)),
                   copier=replace(hw.copier, batch_device_us=PerDirection(**bd)))


def fit(hw: HardwareSpec, measurement: dict) -> dict:
    """Fitted figures and the per-row fit errors (``rows``)."""
    kernel_rows = [r for r in measurement["records"] if r.get("ctas") is not None]
    out: dict = {"page_latency_us": {}, "batch_device_us": {}, "device_fit": {}}
    fitted = hw
    for direction in DIRECTIONS:
        rows = [r for r in kernel_rows if r["direction"] == direction]
        if not rows:
            raise ValueError(f"no kernel rows for {direction} in the plan-copies measurement")
        best = None
        for pl in PAGE_LATENCY_GRID_US:
            # The fixed term enters additively: for each page latency the best fixed term is
            # scanned on precomputed variable times.
            base = _with(fitted, direction, pl, 0.0)
            var = np.array([predict_device_s(base, r) for r in rows])
            meas = np.array([r["device_s"] for r in rows])
            for bd in BATCH_DEVICE_GRID_US:
                err = float(np.mean(np.abs((var + bd * 1e-6) / meas - 1.0)))
                if best is None or err < best[0]:
                    best = (err, float(pl), float(bd))
        _, pl, bd = best
        fitted = _with(fitted, direction, pl, bd)
        out["page_latency_us"][direction] = pl
        out["batch_device_us"][direction] = bd
        apes = [abs(predict_device_s(fitted, r) / r["device_s"] - 1) * 100 for r in rows]
        out["device_fit"][direction] = {"rows": len(rows), "median_ape_pct": statistics.median(apes),
                                        "worst_ape_pct": max(apes)}
    select = [r for r in measurement["records"] if r.get("ctas") is None]
    a = np.array([[1.0, float(r["pages"])] for r in select])
    b = np.array([r["select_submit_s"] * 1e6 - r["launches"] * hw.kernel.launch_host_us for r in select])
    x = nnls(a, b)
    out["submit_batch_host_us"], out["submit_page_host_us"] = float(x[0]), float(x[1])
    pred = a @ x + np.array([r["launches"] * hw.kernel.launch_host_us for r in select])
    apes = np.abs(pred / np.array([r["select_submit_s"] * 1e6 for r in select]) - 1) * 100
    out["host_fit"] = {"rows": len(select), "median_ape_pct": float(np.median(apes)),
                       "worst_ape_pct": float(apes.max())}
    return out
