"""A hardware JSON (the simulator's ``hardware:``) fitted to measurements of one PCIe GPU host.

Inputs, all made on the GPU machine:

* the copy bench (``python3 -m hw.bench_copy``): link and copy-engine plateaus, per-copy costs,
  the batched-copy curve, the kernel's Little's-law terms, host submission costs, the unaligned
  kernel's efficiency, device-to-device rate (:mod:`kvsim.calibration.copy_fit`); its provenance
  gives the GPU name, driver, PCIe generation and width, SM and copy-engine counts;
* optionally the plan-shaped batches (``python3 -m hw.bench_plan_copies``): the kernel's per-page
  latency and the hardware copier's costs (:mod:`kvsim.calibration.plan_copy_fit`);
* optionally the plan-shaped batches of issue 23 (``python3 -m hw.bench_plan_batches``, the
  ``.json`` or the committed ``.json.xz``): the copy model refitted on their pre-registered fit
  set (:mod:`kvsim.calibration.plan_batch_fit`), replacing the figures that module names;
* optionally the idle-wake run (``python3 -m hw.bench_link_wake``): the extra time of a first
  copy after an idle spell.

Every figure names the file it came from and how; what a missing input would have given is
written as 0 with "not measured". KVCM2's grid-policy constants come from the seed.
Only PCIe hosts: a coherent (C2C) host needs figures the copy bench does not take.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from kvsim.calibration.copy_fit import FIT_RULES, fit, observations, unaligned_efficiency
from kvsim.hardware.spec import hardware_from_dict

TRT = "TensorRT-LLM kv_cache_manager_v2/batchedPageCopy.cu (seed PR #18541)"
NOTES = "docs/hardware-notes.md"
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}  # raw, per direction (docs/hardware-notes.md)
DIRS = ("offload", "onboard")


def S(value, source: str) -> dict:  # noqa: N802 - the presets' {"value", "source"} pair
    return {"value": value, "source": source}


GRID = {
    "per_cta_gbps": S(43.0, TRT + ": kPerCtaGBs"),
    "link_efficiency": S(0.80, TRT + ": kLinkEfficiency (measured 79%-86%)"),
    "host_sustained_gbps": S(355.0, TRT + ": kHostSustainedGBs (Grace, coherent links only)"),
    "grid_mult": {"offload": S(0.90, TRT + ": kOffloadGridMult"),
                  "onboard": S(1.45, TRT + ": kOnboardGridMult")},
}
REF_INFLIGHT = {"offload": S(32768, TRT + ": kOffloadInFlightBytes (the offload knee)"),
                "onboard": S(65536, TRT + ": kOnboardInFlightBytes (the onboard knee)")}


def measured_preset(name: str, description: str, copy_bench: str,
                    plan_copies: str | None = None, link_wake: str | None = None,
                    plan_batches: str | None = None) -> dict:
    """The hardware JSON (a dict, ready for ``json.dumps``) for the host the files measured."""
    meas = json.loads(Path(copy_bench).read_text())
    prov = meas["provenance"]
    gen = prov["nvml_start"]
    c2c = gen.get("c2c_fields", {}).get("c2c_link_count", {}).get("value")
    if c2c:
        raise ValueError(f"{copy_bench}: the GPU reports {c2c} C2C links; only PCIe hosts are fitted")
    gpu = prov["gpu_name"]
    label = f"{copy_bench} ({gpu}, driver {gen['driver_version']}, {prov['date_utc'][:10]})"
    fitted_all = fit(observations(meas))
    pd = fitted_all["per_direction"]

    def fitted(value, rule_key, digits=4):
        return {"value": round(value, digits), "source": f"{label}: {FIT_RULES[rule_key]}"}

    r_link = "link.per_direction_gbps, copy_engine.plateau_gbps"
    r_batch = "copy_engine.batch_call_host_us, batch_descriptor_host_us"
    r_kern = "kernel.latency_us, per_cta_max_gbps, knee_p"
    r_curve = "copy_engine.batch_curve"

    lanes, pcie_gen = gen["pcie_max_link_width"], gen["pcie_max_link_gen"]
    attrs = prov["cuda_attributes"]
    sms = attrs["16_multiProcessorCount"]
    d2d = max(r["median_gbs"] for r in meas["records"] if r["section"] == "kernel_d2d_reference")
    placeholder = S(0.0, "placeholder replaced below")
    data = {
        "name": name,
        "description": description,
        "gpu": gpu,
        "link": {
            "kind": "pcie", "coherent": False,
            "detected_gbps": S(PCIE_X16_GBPS[pcie_gen] * lanes / 16,
                               f"{label}: NVML max PCIe link generation {pcie_gen} x width {lanes}; "
                               f"{NOTES}: Gen{pcie_gen} x16 = {PCIE_X16_GBPS[pcie_gen]} GB/s per direction"),
            "per_direction_gbps": {d: fitted(pd[d]["ce_plateau_gbps"], r_link)
                                   for d in DIRS},
            "bidirectional_factor": fitted(fitted_all["bidirectional_factor"], "link.bidirectional_factor")},
        "copy_engine": {
            "count": S(attrs["40_asyncEngineCount"],
                       f"{label}: CUDA attribute 40 asyncEngineCount = {attrs['40_asyncEngineCount']}"),
            "plateau_gbps": {d: fitted(pd[d]["ce_plateau_gbps"], r_link)
                             for d in DIRS},
            "per_copy_device_us": {d: fitted(pd[d]["per_copy_device_us"], "copy_engine.per_copy_device_us")
                                   for d in DIRS},
            "per_call_host_us": fitted(fitted_all["per_call_host_us"], "copy_engine.per_call_host_us"),
            "batch_call_host_us": fitted(fitted_all["batch_call_host_us"],
                                         r_batch),
            "batch_descriptor_host_us": {d: fitted(fitted_all["batch_descriptor_host_us"], r_batch)
                                         for d in DIRS},
            "batch_small_copy_host_us_per_kib": {
                d: S(0.0, "not measured (no plan-batches run given): no small-copy term") for d in DIRS},
            "batch_small_copy_max_bytes": S(0, "not measured (no plan-batches run given)"),
            "batch_lead_descriptors": S(0, "not measured (no plan-batches run given): the device "
                                           "starts after the whole call"),
            "batch_curve": {d: [[fitted(pb, r_curve, 0), fitted(g, r_curve)]
                                for pb, g in pd[d]["batch_curve"]] for d in DIRS}},
        "kernel": {
            "sm_count": S(attrs["16_multiProcessorCount"],
                          f"{label}: CUDA attribute 16 multiProcessorCount = {sms}"),
            "threads_per_cta": S(128, "hw/copy_kernels.py: 128 threads per CTA"),
            "tile_bytes": S(16, "hw/copy_kernels.py: 16-byte chunks are numbered across pages, so no "
                                "page wastes a tile"),
            "default_inflight_bytes": REF_INFLIGHT,
            "latency_us": {d: fitted(pd[d]["latency_us"], r_kern) for d in DIRS},
            "per_cta_max_gbps": {d: (None if pd[d]["per_cta_max_gbps"] is None else
                                     fitted(pd[d]["per_cta_max_gbps"], r_kern))
                                 for d in DIRS},
            "plateau_gbps": {d: fitted(pd[d]["kernel_plateau_gbps"], "kernel.plateau_gbps") for d in DIRS},
            "knee_p": {d: (None if pd[d]["knee_p"] is None else
                           fitted(pd[d]["knee_p"], r_kern)) for d in DIRS},
            "bidirectional_factor": fitted(fitted_all["kernel_bidirectional_factor"],
                                           "kernel.bidirectional_factor"),
            "launch_host_us": fitted(fitted_all["launch_host_us"], "kernel.launch_host_us"),
            "unaligned_efficiency": {d: placeholder for d in DIRS},
            "page_latency_us": {d: S(0.0, "not measured (no plan-copies run given): no per-page term")
                                for d in DIRS}},
        "grid_policy": GRID,
        "copier": {
            "batch_device_us": {d: S(0.0, "not measured (no plan-copies run given)") for d in DIRS},
            "submit_batch_host_us": S(0.0, "not measured (no plan-copies run given)"),
            "submit_page_host_us": S(0.0, "not measured (no plan-copies run given)"),
            "submit_copy_engine_host_us": S(0.0, "not measured (no plan-batches run given)"),
            "submit_after_launch_host_us": {d: S(0.0, "not measured (no plan-batches run given): the "
                                                      "kernel starts after the whole submission")
                                            for d in DIRS},
            "idle_wake_us": {d: S(0.0, "not measured (no idle-wake run given)") for d in DIRS},
            "idle_after_ms": S(0.0, "not measured (no idle-wake run given)")},
        "device_copy_gbps": {"value": round(d2d, 2),
                             "source": f"{label}: device-to-device paged kernel copy, max median "
                                       "over CTA counts"},
    }
    # The fast-kernel rate the measured unaligned rate is divided by comes from the preset itself.
    eff = unaligned_efficiency(hardware_from_dict(data, f"{name} (being fitted)"),
                               fitted_all["unaligned_fit_rows"])
    unaligned = {}
    for d in DIRS:
        other = next((o for o in DIRS if o != d and o in eff), None)
        if d in eff:
            unaligned[d] = fitted(eff[d], "kernel.unaligned_efficiency")
        elif other is not None:  # a short run may measure one direction only
            unaligned[d] = {"value": round(eff[other], 4),
                            "source": f"{label}: not measured for {d}; the {other} figure "
                                      f"({FIT_RULES['kernel.unaligned_efficiency']})"}
        else:
            unaligned[d] = S(1.0, f"{label}: not measured (no unaligned-kernel rows): no penalty")
    data["kernel"]["unaligned_efficiency"] = unaligned
    if plan_copies:
        _add_plan_copies(data, plan_copies)
    if link_wake:
        data["copier"].update(_idle_wake(link_wake, gpu))
    if plan_batches:
        _add_plan_batches(data, plan_batches)
    return data


def _add_plan_batches(data: dict, path: str) -> None:
    """Replace the figures :func:`kvsim.calibration.plan_batch_fit.refit` fits, each with its
    source: the file, its GPU and driver, and the module's rule for that figure."""
    from kvsim.calibration import plan_batch_fit
    from kvsim.calibration.packed import read_json

    meas = read_json(path)
    _, report = plan_batch_fit.refit(hardware_from_dict(data, f"{data['name']} (being fitted)"), meas,
                                     roles=None)
    prov = meas["provenance"]
    label = (f"{path} ({prov['gpu_name']}, driver {prov['nvml_start']['driver_version']}, "
             f"{prov['date_utc'][:10]}): kvsim.calibration.plan_batch_fit, every batch of the file "
             f"(PROTOCOL-2.md)")
    rule_of = {}
    for rule_key, rule in plan_batch_fit.FIT_RULES.items():
        section = None
        for name in rule_key.split(", "):
            if "." in name:
                section, name = name.split(".", 1)
            rule_of[(section, name)] = rule
    for section, figs in report["figures"].items():
        for name, value in figs.items():
            src = f"{label}: {rule_of[(section, name)]}"
            digits = 6 if name == "submit_page_host_us" else 4
            if isinstance(value, dict):
                data[section][name] = {d: S(round(v, digits), src) for d, v in value.items()}
            else:
                data[section][name] = S(round(value, digits) if isinstance(value, float) else value, src)


def _add_plan_copies(data: dict, path: str) -> None:
    from kvsim.calibration import plan_copy_fit

    meas = json.loads(Path(path).read_text())
    pf = plan_copy_fit.fit(hardware_from_dict(data, f"{data['name']} (being fitted)"), meas)
    prov = meas["provenance"]
    src = (f"{path} ({prov['gpu']}, driver {prov['driver']}, {meas['date_utc'][:10]}): "
           "kvsim.calibration.plan_copy_fit")
    dev = "; grid search, kernel rows (4/16 KiB pools x1/x2, 1024-16384 pages, 2-32 CTAs)"
    host = "; non-negative least squares on the selector rows' submission time less the launches"
    data["kernel"]["page_latency_us"] = {d: S(round(pf["page_latency_us"][d], 4), src + dev) for d in DIRS}
    data["copier"].update({
        "batch_device_us": {d: S(round(pf["batch_device_us"][d], 2), src + dev) for d in DIRS},
        "submit_batch_host_us": S(round(pf["submit_batch_host_us"], 3), src + host),
        "submit_page_host_us": S(round(pf["submit_page_host_us"], 6), src + host)})


def _idle_wake(path: str, bench_gpu: str) -> dict:
    """The first batch after an idle spell: the median extra device time per direction, and the
    idle length from which it appears (the idle sweep's midpoint between none and some). A run
    without provenance is taken to be of the copy bench's GPU."""
    meas = json.loads(Path(path).read_text())
    gpu = meas.get("provenance", {}).get("gpu", bench_gpu)
    src = f"{path} ({gpu}, {meas['date_utc'][:10]})"
    wake = {d: statistics.median((r["after_idle_s"] - r["warm_s"]) * 1e6 for r in meas["records"]
                                 if r["direction"] == d) for d in DIRS}
    sweep = meas["idle_sweep"]
    base = statistics.median(x["device_s"] for x in sweep if x["idle_s"] <= 0.001)
    slow = [x["idle_s"] for x in sweep if x["device_s"] - base > 0.5 * wake["offload"] * 1e-6]
    if not slow:
        return {"idle_wake_us": {d: S(0.0, src + ": no idle spell in the sweep slowed a copy") for d in DIRS},
                "idle_after_ms": S(0.0, src + ": no idle spell in the sweep slowed a copy")}
    fast = [x["idle_s"] for x in sweep if x["idle_s"] < min(slow)] or [0.0]
    after_ms = (max(fast) + min(slow)) / 2 * 1e3
    n = {d: sum(1 for r in meas["records"] if r["direction"] == d) for d in DIRS}
    return {"idle_wake_us": {d: S(round(wake[d], 1), src + f": median over its {n[d]} {d} batches of "
                                  f"(after {meas['idle_s']} s idle) - (back to back)") for d in DIRS},
            "idle_after_ms": S(round(after_ms, 1), src + f": idle sweep: no extra time after "
                               f"{max(fast) * 1e3:g} ms idle, extra from {min(slow) * 1e3:g} ms; midpoint")}
