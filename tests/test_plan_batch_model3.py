"""Issue 23, copy model 3 (reports/validation-h200/plan-batches/PROTOCOL-3.md): the copy model's
host speed knob (``with_host_speed``, ``CopySelector(host_speed=...)``), the kernel's hyperbolic
knee, the bench's host probe in the dry-run estimate, and the fit and judge of one run whose
batches carry host probes. No GPU."""

from __future__ import annotations

import dataclasses

import pytest

from hw.bench_plan_batches import PROBE_POINTS, plan_table, points
from kvsim.calibration import plan_batch_fit as pbf
from kvsim.calibration import plan_batches as pb
from kvsim.hardware import load_hardware
from kvsim.model.copy_paths import HOST_TERMS, PATHS, host_speeds, kernel_rate_gbps, with_host_speed
from kvsim.model.copy_select import CopySelector

HW = load_hardware("h200-sxm")
KIB = 1024


def _value(hw, section, field):
    v = getattr(getattr(hw, section), field)
    return (v.offload, v.onboard) if hasattr(v, "offload") else (v,)


def test_host_speed_scales_each_paths_host_figures_and_nothing_else():
    assert with_host_speed(HW, 1.0) is HW
    fast = with_host_speed(HW, 0.5)
    for terms in HOST_TERMS.values():
        for section, field in terms:
            assert _value(fast, section, field) == pytest.approx(
                tuple(0.5 * x for x in _value(HW, section, field)))
    # device figures untouched
    assert fast.kernel.plateau_gbps == HW.kernel.plateau_gbps
    assert fast.copy_engine.per_copy_device_us == HW.copy_engine.per_copy_device_us
    assert fast.copier.batch_device_us == HW.copier.batch_device_us
    # one path only
    k = with_host_speed(HW, {"kernel": 2.0})
    assert k.copy_engine == HW.copy_engine
    assert k.kernel.launch_host_us == 2 * HW.kernel.launch_host_us
    assert k.copier.submit_copy_engine_host_us == HW.copier.submit_copy_engine_host_us
    assert k.copier.submit_page_host_us == 2 * HW.copier.submit_page_host_us


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1", {"dma": 1.0},
                                 {"kernel": 0.0}])
def test_host_speed_rejects_what_is_not_a_positive_factor(bad):
    with pytest.raises(ValueError):
        host_speeds(bad)
    with pytest.raises(ValueError):
        CopySelector(HW, host_speed=bad)


def test_selector_prices_host_time_at_the_host_speed():
    base, slow = CopySelector(HW), CopySelector(HW, host_speed=2.0)
    for path in PATHS:
        a = base.price(path, "offload", (8 * KIB, 8 * KIB), 256, True, 8 if path == "kernel" else None)
        b = slow.price(path, "offload", (8 * KIB, 8 * KIB), 256, True, 8 if path == "kernel" else None)
        assert b.host_seconds == pytest.approx(2 * a.host_seconds)
        if path != "ce-page":  # a per-page batch's device is paced by the slower of call and copy
            assert b.seconds == pytest.approx(a.seconds)
        assert b.end_to_end_seconds > a.end_to_end_seconds
    # a faster host uncovers device time: the kernel's device time decides more of the batch
    fast = CopySelector(HW, host_speed=0.25)
    e = fast.price("kernel", "offload", (8 * KIB, 8 * KIB), 64, True, 1)
    assert e.end_to_end_seconds - e.host_seconds > 0


def test_hyperbolic_knee_rises_slower_and_reaches_the_plateau():
    hyp = dataclasses.replace(HW, kernel=dataclasses.replace(HW.kernel, knee_form="hyperbolic"))
    assert HW.kernel.knee_form == "exp"  # presets without the key
    rates = [kernel_rate_gbps(hyp, "offload", n, page_bytes=8 * KIB) for n in (1, 2, 4, 8, 16, 64, 1024)]
    assert rates == sorted(rates)
    xmax = hyp.kernel.plateau_gbps.offload
    assert rates[-1] == pytest.approx(xmax, rel=1e-3) and rates[-1] < xmax
    for n in (4, 8):  # below the exponential form at the knee
        assert kernel_rate_gbps(hyp, "offload", n, page_bytes=8 * KIB) < \
            kernel_rate_gbps(HW, "offload", n, page_bytes=8 * KIB)


def test_dry_run_estimate_counts_the_probes():
    batches = [b for b in pb.layout_sweep() if b["pages"] == 256][:4]
    _, without = plan_table(HW, batches, False, 1, 5, small=21, mid=7)
    _, with_probe = plan_table(HW, batches, False, 1, 5, small=21, mid=7, probe=True)
    assert with_probe > without
    assert [p for p, _ in PROBE_POINTS] == list(PATHS)


# ---------------------------------------------------------------------------- fit and judge

TRUTH_HOST = 1.3  # the synthetic run's reference host: 1.3 x the preset's host figures


def _truth():
    hw = dataclasses.replace(HW, kernel=dataclasses.replace(HW.kernel, knee_form="hyperbolic"))
    return with_host_speed(hw, TRUTH_HOST)


def _synthetic_run():
    """Sweep batches measured by a known model at a known host speed per batch; the probes say
    that speed (probe ms = speed x a per-path constant)."""
    truth = _truth()
    batches = [b for b in pb.layout_sweep() if b["pages"] in (64, 256, 1024, 4096)
               and (b["role"] == "fit" or (b["order"] == "sorted" and b["layout"] in ("1x16KiB", "4x4KiB")))]
    speeds = [0.7, 1.0, 1.0, 1.4, 1.1, 0.9]
    records, probes = [], []
    for i, b in enumerate(batches):
        s = speeds[i % len(speeds)]
        sel = CopySelector(truth, host_speed=s)
        for path, ctas in points(HW, b):
            if path == "select":
                continue
            est = sel.price(path, b["direction"], b["pool_slot_bytes"], b["pages"], True, ctas)
            base = {"params": {"batch_id": b["id"]}, "path": path, "ctas": ctas, "status": "ok"}
            records.append({**base, "timing": "cuda_events_issue", "median_ms": est.end_to_end_seconds * 1e3,
                            "host_enqueue_ms": [est.host_seconds * 1e3] * 3})
            records.append({**base, "timing": "cuda_events_gated", "median_ms": est.seconds * 1e3})
        for where in ("pass 0", "after"):
            probes.append({"batch": b["id"], "at": where,
                           "ms": {"ce-page": 0.2 * s, "ce-batch": 0.3 * s, "kernel:8": 0.4 * s}})
    return {"schema": "kvsim-plan-batches/1", "batches": batches, "records": records,
            "host_probes": probes}, dict(zip([b["id"] for b in batches],
                                             [speeds[i % len(speeds)] for i in range(len(batches))]))


@pytest.fixture(scope="module")
def run():
    return _synthetic_run()


def test_probe_speeds_are_relative_to_the_fit_batches(run):
    meas, speed = run
    got, ref = pbf.probe_speeds(meas)
    fit_speeds = sorted(speed[b["id"]] for b in meas["batches"] if b["role"] == "fit")
    median_fit = fit_speeds[len(fit_speeds) // 2] if len(fit_speeds) % 2 else \
        (fit_speeds[len(fit_speeds) // 2 - 1] + fit_speeds[len(fit_speeds) // 2]) / 2
    assert ref["reference_ms"]["kernel"] == pytest.approx(0.4 * median_fit)
    for bid, s in speed.items():
        for path in PATHS:
            assert got[bid][path] == pytest.approx(s / median_fit)
    with pytest.raises(ValueError, match="host_probes"):
        pbf.probe_speeds({**meas, "host_probes": []})


def test_judge3_recovers_a_model_that_holds_exactly(run):
    meas, _ = run
    j = pb.judge3(meas)
    assert j["model"]["judge"]["count"] > 0 and j["model"]["fit"]["count"] > 0
    # every judged batch is outside the fit set, priced at its own host speed
    assert {r["role"] for r in j["rows"]} == {"fit", "judge"}
    assert j["model"]["judge"]["median_ape_pct"] < 1.0
    assert j["model"]["judge"]["p90_ape_pct"] < 3.0
    assert j["verdict"]["model_median"] is True
    # without the probes' speeds (every batch at 1.0) the same model is further off
    flat = {**meas, "host_probes": [{**p, "ms": {"ce-page": 1.0, "ce-batch": 1.0, "kernel:8": 1.0}}
                                    for p in meas["host_probes"]]}
    assert pb.judge3(flat)["model"]["judge"]["median_ape_pct"] > j["model"]["judge"]["median_ape_pct"]
    assert j["fit"]["figures"]["kernel"]["knee_p"]
    assert j["selector"]["batches"] == len(meas["batches"])
