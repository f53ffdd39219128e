"""Write the hardware presets in kvsim/hardware/presets/ from their sources.

Every number is written with its source. The h200-sxm preset, and the few figures other presets
borrow from it, are fitted to the committed H200 measurement (kvsim.calibration.copy_fit).

Usage: python tools/make_presets.py [MEASUREMENT.json]
"""

import json
import sys
from pathlib import Path

from kvsim.calibration.copy_fit import FIT_RULES, fit, observations

PLAN_COPIES = "reports/measurements/h200/2026-12-02-plan-copies.json"
LINK_WAKE = "reports/measurements/h200/2026-12-02-link-wake.json"

MEASUREMENT = sys.argv[1] if len(sys.argv) > 1 else "reports/measurements/h200/2026-12-02-copy-bench.json"
MEAS = json.loads(Path(MEASUREMENT).read_text())
FIT = fit(observations(MEAS))
H200 = (f"{MEASUREMENT} (NVIDIA H200, driver {MEAS['provenance']['nvml_start']['driver_version']}, "
        f"{MEAS['provenance']['date_utc'][:10]})")
PD = FIT["per_direction"]


def fitted(value, rule_key, digits=4):
    return {"value": round(value, digits), "source": f"{H200}: {FIT_RULES[rule_key]}"}


BORROWED = {  # figures PCIe and Hopper presets borrow from the H200 measurement
    "H200_BIDIR": fitted(FIT["bidirectional_factor"], "link.bidirectional_factor"),
    "H200_KERNEL_BIDIR": fitted(FIT["kernel_bidirectional_factor"], "kernel.bidirectional_factor"),
    "H200_CALL_HOST": fitted(FIT["per_call_host_us"], "copy_engine.per_call_host_us"),
    "H200_BATCH_HOST": fitted(FIT["batch_call_host_us"], "copy_engine.batch_call_host_us, batch_descriptor_host_us"),
    "H200_DESC_HOST": fitted(FIT["batch_descriptor_host_us"], "copy_engine.batch_call_host_us, batch_descriptor_host_us"),
    "H200_LAUNCH_HOST": fitted(FIT["launch_host_us"], "kernel.launch_host_us"),
    # Filled in after the H200 preset is written (h200_copier): the copier's host costs.
    "H200_COPIER_BATCH_HOST": None,
    "H200_COPIER_PAGE_HOST": None,
}
C2C_KERNEL_BIDIR = {"value": 1.0, "source": "not measured on C2C: the link's bidirectional factor alone limits both directions"}


def fill(node):
    """Replace the H200_* placeholders; C2C presets keep no kernel-specific bidirectional loss."""
    if isinstance(node, dict):
        return {k: fill(v) for k, v in node.items()}
    if isinstance(node, list):
        return [fill(v) for v in node]
    if isinstance(node, str) and node in BORROWED:
        value = json.loads(json.dumps(BORROWED[node]))
        for leaf in (value.values() if "source" not in value else [value]):
            leaf["source"] += " (borrowed from the H200 measurement; no measurement of this GPU in the repo)"
        return value
    return node

def S(v, s): return {"value": v, "source": s}

GIB = 1.073741824  # GiB/s -> GB/s
TRT = "TensorRT-LLM kv_cache_manager_v2/batchedPageCopy.cu (seed PR #18541)"
TRT_PCIE = TRT + ", computeConfigs() comment: copy engine vs kernel measured on PCIe hosts"
NOTES = "shared/HARDWARE-NOTES.md"
GRID = {
    "per_cta_gbps": S(43.0, TRT + ": kPerCtaGBs"),
    "link_efficiency": S(0.80, TRT + ": kLinkEfficiency (measured 79%-86%)"),
    "host_sustained_gbps": S(355.0, TRT + ": kHostSustainedGBs (Grace, coherent links only)"),
    "grid_mult": {"offload": S(0.90, TRT + ": kOffloadGridMult"),
                  "onboard": S(1.45, TRT + ": kOnboardGridMult")},
}
TILE = S(4096, TRT + ": kThreads 128 x kIlp 2 x 16 B per stage")
THREADS = S(128, TRT + ": kThreads")
REF_INFLIGHT = {"offload": S(32768, TRT + ": kOffloadInFlightBytes (the offload knee)"),
                "onboard": S(65536, TRT + ": kOnboardInFlightBytes (the onboard knee)")}


def latency(per_cta_gbps, why):
    """Little's law: the round trip that gives per_cta_gbps at KVCM2's default depths."""
    return {d: S(round(b / (per_cta_gbps * 1e9) * 1e6, 4), why + f"; latency = {b} B in flight / {per_cta_gbps} GB/s")
            for d, b in (("offload", 32768), ("onboard", 65536))}


NO_CTA_CAP = {"offload": None, "onboard": None}
KNEE = {"offload": None, "onboard": S(2.2, TRT + ": onboard rolls off with a soft knee, p = 2.2; offload is linear then hard-clamps")}
# H100 copy-engine small-copy behaviour (public figures), used for Hopper presets without our own measurement.
H100_PER_COPY = {d: S(3.75, NOTES + ": per-call cudaMemcpyAsync about 3.5-4 us for small copies on H100 (torchcomms #2195)") for d in ("offload", "onboard")}
VLLM = NOTES + ": vLLM PR #42212, cuMemcpyBatchAsync on H100: 4-7 GB/s for 4-24 KiB pages, 40-52 GB/s from 28 KiB"
H100_CURVE = [[S(4096, VLLM), S(4.0, VLLM)], [S(24576, VLLM), S(7.0, VLLM)],
              [S(28672, VLLM), S(40.0, VLLM)], [S(1048576, VLLM), S(52.0, VLLM)]]
UNALIGNED_NOTE = "reports/measurements/h200: alignment-agnostic kernel vs fast kernel (H200), assumed elsewhere"

def write(name, data):
    if data["link"]["kind"] == "c2c":
        data["kernel"]["bidirectional_factor"] = C2C_KERNEL_BIDIR
    Path(f"kvsim/hardware/presets/{name}.json").write_text(json.dumps(fill(data), indent=1) + "\n")

def h200_unaligned():
    from kvsim.calibration.copy_fit import unaligned_efficiency
    from kvsim.hardware.spec import load_hardware

    # The fast-kernel rate the measured unaligned rate is divided by comes from the preset itself.
    path = Path("kvsim/hardware/presets/h200-sxm.json")
    eff = unaligned_efficiency(load_hardware(path), FIT["unaligned_fit_rows"])
    data = json.loads(path.read_text())
    data["kernel"]["unaligned_efficiency"] = {
        d: fitted(eff[d], "kernel.unaligned_efficiency") for d in ("offload", "onboard")}
    path.write_text(json.dumps(data, indent=1) + "\n")


MEAS_GEN = MEAS["provenance"]["nvml_start"]


def fitted_d2d():
    d2d = max(r["median_gbs"] for r in MEAS["records"] if r["section"] == "kernel_d2d_reference")
    return {"value": round(d2d, 2), "source": f"{H200}: device-to-device paged kernel copy, max median over CTA counts"}
write("h200-sxm", {
  "name": "h200-sxm",
  "description": "H200 SXM on an x86 host over PCIe Gen5 x16 (non-coherent), fitted to this repository's own H200 measurement. Kernel figures are for hw/copy_kernels.py's LDGSTS kernel.",
  "gpu": "NVIDIA H200",
  "link": {
    "kind": "pcie", "coherent": False,
    "detected_gbps": S(63.0, f"{H200}: NVML max PCIe link generation {MEAS_GEN['pcie_max_link_gen']} x width {MEAS_GEN['pcie_max_link_width']}; {NOTES}: Gen5 x16 = 63.0 GB/s per direction"),
    "per_direction_gbps": {"offload": fitted(PD["offload"]["ce_plateau_gbps"], "link.per_direction_gbps, copy_engine.plateau_gbps"),
                           "onboard": fitted(PD["onboard"]["ce_plateau_gbps"], "link.per_direction_gbps, copy_engine.plateau_gbps")},
    "bidirectional_factor": fitted(FIT["bidirectional_factor"], "link.bidirectional_factor")},
  "copy_engine": {
    "count": S(3, f"{H200}: CUDA attribute 40 asyncEngineCount = 3"),
    "plateau_gbps": {d: fitted(PD[d]["ce_plateau_gbps"], "link.per_direction_gbps, copy_engine.plateau_gbps") for d in ("offload", "onboard")},
    "per_copy_device_us": {d: fitted(PD[d]["per_copy_device_us"], "copy_engine.per_copy_device_us") for d in ("offload", "onboard")},
    "per_call_host_us": fitted(FIT["per_call_host_us"], "copy_engine.per_call_host_us"),
    "batch_call_host_us": fitted(FIT["batch_call_host_us"], "copy_engine.batch_call_host_us, batch_descriptor_host_us"),
    "batch_descriptor_host_us": fitted(FIT["batch_descriptor_host_us"], "copy_engine.batch_call_host_us, batch_descriptor_host_us"),
    "batch_curve": {d: [[fitted(pb, "copy_engine.batch_curve", 0), fitted(g, "copy_engine.batch_curve")] for pb, g in PD[d]["batch_curve"]]
                    for d in ("offload", "onboard")}},
  "kernel": {
    "sm_count": S(132, f"{H200}: CUDA attribute 16 multiProcessorCount = 132"),
    "threads_per_cta": S(128, "hw/copy_kernels.py: 128 threads per CTA"),
    "tile_bytes": S(16, "hw/copy_kernels.py: 16-byte chunks are numbered across pages, so no page wastes a tile"),
    "default_inflight_bytes": REF_INFLIGHT,
    "latency_us": {d: fitted(PD[d]["latency_us"], "kernel.latency_us, per_cta_max_gbps, knee_p") for d in ("offload", "onboard")},
    "per_cta_max_gbps": {d: (None if PD[d]["per_cta_max_gbps"] is None else fitted(PD[d]["per_cta_max_gbps"], "kernel.latency_us, per_cta_max_gbps, knee_p")) for d in ("offload", "onboard")},
    "plateau_gbps": {d: fitted(PD[d]["kernel_plateau_gbps"], "kernel.plateau_gbps") for d in ("offload", "onboard")},
    "knee_p": {d: (None if PD[d]["knee_p"] is None else fitted(PD[d]["knee_p"], "kernel.latency_us, per_cta_max_gbps, knee_p")) for d in ("offload", "onboard")},
    "bidirectional_factor": fitted(FIT["kernel_bidirectional_factor"], "kernel.bidirectional_factor"),
    "launch_host_us": fitted(FIT["launch_host_us"], "kernel.launch_host_us"),
    "unaligned_efficiency": {"offload": S(1.0, "placeholder replaced below"), "onboard": S(1.0, "placeholder replaced below")},
    "page_latency_us": {"offload": S(0.0, "placeholder replaced below"), "onboard": S(0.0, "placeholder replaced below")}},
  "grid_policy": GRID,
  "copier": {"batch_device_us": {"offload": S(0.0, "placeholder replaced below"), "onboard": S(0.0, "placeholder replaced below")},
             "submit_batch_host_us": S(0.0, "placeholder replaced below"),
             "submit_page_host_us": S(0.0, "placeholder replaced below"),
             "idle_wake_us": {"offload": S(0.0, "placeholder replaced below"), "onboard": S(0.0, "placeholder replaced below")},
             "idle_after_ms": S(0.0, "placeholder replaced below")},
  "device_copy_gbps": fitted_d2d()})
h200_unaligned()


def h200_copier():
    """The kernel's per-page latency and the copier's costs, fitted to the plan-copies run."""
    from kvsim.calibration import plan_copy_fit
    from kvsim.hardware.spec import load_hardware

    path = Path("kvsim/hardware/presets/h200-sxm.json")
    meas = json.loads(Path(PLAN_COPIES).read_text())
    pf = plan_copy_fit.fit(load_hardware(path), meas)
    prov = meas["provenance"]
    src = f"{PLAN_COPIES} ({prov['gpu']}, driver {prov['driver']}, {meas['date_utc'][:10]}): kvsim.calibration.plan_copy_fit"
    dev = "; grid search, kernel rows (4/16 KiB pools x1/x2, 1024-16384 pages, 2-32 CTAs)"
    host = "; non-negative least squares on the selector rows' submission time less the launches"
    data = json.loads(path.read_text())
    data["kernel"]["page_latency_us"] = {d: S(round(pf["page_latency_us"][d], 4), src + dev) for d in ("offload", "onboard")}
    data["copier"] = {
        "batch_device_us": {d: S(round(pf["batch_device_us"][d], 2), src + dev) for d in ("offload", "onboard")},
        "submit_batch_host_us": S(round(pf["submit_batch_host_us"], 3), src + host),
        "submit_page_host_us": S(round(pf["submit_page_host_us"], 6), src + host),
        **h200_idle_wake()}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def h200_idle_wake():
    """The first batch after an idle spell: the median extra device time per direction, and the
    idle length from which it appears (the idle sweep's midpoint between none and some)."""
    import statistics

    meas = json.loads(Path(LINK_WAKE).read_text())
    src = f"{LINK_WAKE} (NVIDIA H200, {meas['date_utc'][:10]})"
    wake = {d: statistics.median((r["after_idle_s"] - r["warm_s"]) * 1e6 for r in meas["records"]
                                 if r["direction"] == d) for d in ("offload", "onboard")}
    sweep = meas["idle_sweep"]
    base = statistics.median(x["device_s"] for x in sweep if x["idle_s"] <= 0.001)
    slow = [x["idle_s"] for x in sweep if x["device_s"] - base > 0.5 * wake["offload"] * 1e-6]
    fast = [x["idle_s"] for x in sweep if x["idle_s"] < min(slow)]
    after_ms = (max(fast) + min(slow)) / 2 * 1e3
    return {"idle_wake_us": {d: S(round(wake[d], 1), src + f": median over its 12 {d} batches of "
                                  f"(after {meas['idle_s']} s idle) - (back to back)") for d in wake},
            "idle_after_ms": S(round(after_ms, 1), src + f": idle sweep: no extra time after "
                               f"{max(fast) * 1e3:g} ms idle, extra from {min(slow) * 1e3:g} ms; midpoint")}


H200_COPIER = h200_copier()
BORROWED["H200_COPIER_BATCH_HOST"] = H200_COPIER["copier"]["submit_batch_host_us"]
BORROWED["H200_COPIER_PAGE_HOST"] = H200_COPIER["copier"]["submit_page_host_us"]
NOT_MEASURED_PAGE_LATENCY = {d: S(0.0, "not measured on this GPU: no per-page term") for d in ("offload", "onboard")}
NOT_MEASURED_BATCH_DEVICE = {d: S(0.0, "not measured on this GPU: the copier's index upload is not modelled") for d in ("offload", "onboard")}
NOT_MEASURED_WAKE = {d: S(0.0, "not measured on this GPU: no idle wake-up time") for d in ("offload", "onboard")}

H200_KERNEL = json.loads(Path("kvsim/hardware/presets/h200-sxm.json").read_text())["kernel"]
BORROWED["H200_UNALIGNED"] = H200_KERNEL["unaligned_efficiency"]


def borrowed_preset(name, description, gpu, link, ce_count, ce_plateau, sm_count, kernel_latency,
                    kernel_plateau, device_copy):
    """A preset for a GPU measured nowhere in this repo: its own link, engine count, SM count and
    plateaus; Hopper copy-engine behaviour (public H100 figures), KVCM2's kernel geometry, and the
    host-side costs borrowed from the H200 measurement."""
    return {
      "name": name, "description": description, "gpu": gpu, "link": link,
      "copy_engine": {
        "count": ce_count,
        "plateau_gbps": ce_plateau,
        "per_copy_device_us": H100_PER_COPY,
        "per_call_host_us": "H200_CALL_HOST",
        "batch_call_host_us": "H200_BATCH_HOST",
        "batch_descriptor_host_us": "H200_DESC_HOST",
        "batch_curve": {"offload": H100_CURVE, "onboard": H100_CURVE}},
      "kernel": {
        "sm_count": sm_count,
        "threads_per_cta": THREADS, "tile_bytes": TILE, "default_inflight_bytes": REF_INFLIGHT,
        "latency_us": kernel_latency, "per_cta_max_gbps": NO_CTA_CAP,
        "plateau_gbps": kernel_plateau,
        "knee_p": KNEE,
        "bidirectional_factor": "H200_KERNEL_BIDIR",
        "launch_host_us": "H200_LAUNCH_HOST",
        "unaligned_efficiency": "H200_UNALIGNED",
        "page_latency_us": NOT_MEASURED_PAGE_LATENCY},
      "grid_policy": GRID,
      "copier": {"batch_device_us": NOT_MEASURED_BATCH_DEVICE,
                 "submit_batch_host_us": "H200_COPIER_BATCH_HOST",
                 "submit_page_host_us": "H200_COPIER_PAGE_HOST",
                 "idle_wake_us": NOT_MEASURED_WAKE,
                 "idle_after_ms": S(0.0, "not measured on this GPU (idle_wake_us is 0)")},
      "device_copy_gbps": device_copy}


write("h100-pcie", borrowed_preset(
  "h100-pcie", "The seed's host: H100 PCIe on a PCIe Gen4 x16 link (detected 32.0 GB/s, non-coherent).",
  "NVIDIA H100 PCIe",
  link={
      "kind": "pcie", "coherent": False,
      "detected_gbps": S(32.0, "seed (DESIGN.md section 5): H100 PCIe detection, non-coherent, 32.0 GB/s (Gen4 x16)"),
      "per_direction_gbps": {"offload": S(31.5, NOTES + ": PCIe Gen4 x16 raw, per direction"),
                             "onboard": S(31.5, NOTES + ": PCIe Gen4 x16 raw, per direction")},
      "bidirectional_factor": "H200_BIDIR"},
  ce_count=S(3, NOTES + ": asyncEngineCount 3 on H100/H200"),
  ce_plateau={"offload": S(round(17.45 * GIB, 2), TRT_PCIE + ": H100 PCIe Gen4 copy engine offload 17.45 GiB/s"),
              "onboard": S(round(23.88 * GIB, 2), TRT_PCIE + ": H100 PCIe Gen4 copy engine onboard 23.88 GiB/s")},
  sm_count=S(114, "NVIDIA H100 PCIe datasheet: 114 SMs"),
  kernel_latency=latency(13.5, TRT_PCIE + ": on PCIe a fixed 32 KiB in flight yields ~13.5 GB/s per CTA (B200 Gen5; assumed for H100 and for onboard)"),
  kernel_plateau={"offload": S(round(8.56 * GIB, 2), TRT_PCIE + ": H100 PCIe kernel offload 8.56 GiB/s (Hopper SM->host store cap)"),
                  "onboard": S(round(23.89 * GIB, 2), TRT_PCIE + ": H100 PCIe kernel onboard 23.89 GiB/s")},
  device_copy=S(1000.0, "NVIDIA H100 PCIe datasheet: 2.0 TB/s HBM2e; a copy reads and writes, so half")))

write("gh200", borrowed_preset(
  "gh200", "Grace Hopper GH200: NVLink-C2C, 10 links, coherent (ATS).",
  "NVIDIA GH200 (H100 GPU)",
  link={
      "kind": "c2c", "coherent": True,
      "detected_gbps": S(447.0, "seed PR #18541: measured on GH200 (10 C2C links, 447 GB/s)"),
      "per_direction_gbps": {"offload": S(450.0, NOTES + ": NVLink-C2C 900 GB/s total, 450 per direction (NVIDIA blog)"),
                             "onboard": S(450.0, NOTES + ": NVLink-C2C 900 GB/s total, 450 per direction (NVIDIA blog)")},
      "bidirectional_factor": S(0.5, NOTES + ": GH200 both directions at once reached about half of peak (public studies)")},
  ce_count=S(3, NOTES + ": asyncEngineCount 3 on H100/H200 (GH200's GPU is an H100)"),
  ce_plateau={"offload": S(297.0, NOTES + ": GH200 measured CE D2H about 297 GB/s (public studies)"),
              "onboard": S(360.0, NOTES + ": GH200 measured CE H2D about 346-375 GB/s (public studies), midpoint")},
  sm_count=S(132, "NVIDIA GH200 datasheet: H100 GPU with 132 SMs"),
  kernel_latency=latency(43.0, TRT + ": kPerCtaGBs 43, profiled on GH200 at 1 MiB pages; directions differ in curve shape, not per-CTA throughput"),
  kernel_plateau={"offload": S(355.0, TRT + ": GH200 peaks at 355 GB/s writing host memory"),
                  "onboard": S(351.0, TRT + ": GH200 peaks at 351 GB/s reading host memory")},
  device_copy=S(2000.0, "NVIDIA GH200 datasheet: 4 TB/s HBM3; a copy reads and writes, so half")))

write("gb200", borrowed_preset(
  "gb200", "Grace Blackwell GB200: two B200 GPUs per Grace on NVLink-C2C, coherent; one GPU's share.",
  "NVIDIA B200 (GB200)",
  link={
      "kind": "c2c", "coherent": True,
      "detected_gbps": S(223.6, TRT + ": kFallbackCoherentGBs 223.6, the narrower (2 GPUs per Grace) C2C config"),
      "per_direction_gbps": {"offload": S(223.6, TRT + ": kFallbackCoherentGBs (2 GPUs per Grace C2C)"),
                             "onboard": S(223.6, TRT + ": kFallbackCoherentGBs (2 GPUs per Grace C2C)")},
      "bidirectional_factor": S(0.5, NOTES + ": GH200 C2C both directions at once about half of peak (assumed for GB200)")},
  ce_count=S(4, "assumption: Blackwell asyncEngineCount; no measurement in this repo (calibrate to replace)"),
  ce_plateau={"offload": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link (achieved fraction measured 79%-86%)"),
              "onboard": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link")},
  sm_count=S(148, "NVIDIA B200 datasheet: 148 SMs"),
  kernel_latency=latency(43.0, TRT + ": kPerCtaGBs 43 (tuned on GH200, GB200 and B200; platform-independent knees)"),
  kernel_plateau={"offload": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link, below kHostSustainedGBs"),
                  "onboard": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link, below kHostSustainedGBs")},
  device_copy=S(4000.0, "NVIDIA B200 datasheet: 8 TB/s HBM3e; a copy reads and writes, so half")))

write("b200", borrowed_preset(
  "b200", "B200 on an x86 host over PCIe Gen5 x16 (non-coherent).",
  "NVIDIA B200",
  link={
      "kind": "pcie", "coherent": False,
      "detected_gbps": S(63.0, NOTES + ": PCIe Gen5 x16 raw per direction (detection reports generation x width)"),
      "per_direction_gbps": {"offload": S(63.0, NOTES + ": PCIe Gen5 x16 raw, per direction"),
                             "onboard": S(63.0, NOTES + ": PCIe Gen5 x16 raw, per direction")},
      "bidirectional_factor": "H200_BIDIR"},
  ce_count=S(4, "assumption: Blackwell asyncEngineCount; no measurement in this repo (calibrate to replace)"),
  ce_plateau={"offload": S(round(43.17 * GIB, 2), TRT_PCIE + ": B200 PCIe Gen5 copy engine offload 43.17 GiB/s"),
              "onboard": S(round(42.58 * GIB, 2), TRT_PCIE + ": B200 PCIe Gen5 copy engine onboard 42.58 GiB/s")},
  sm_count=S(148, "NVIDIA B200 datasheet: 148 SMs"),
  kernel_latency=latency(13.5, TRT_PCIE + ": on Blackwell PCIe a fixed 32 KiB in flight yields ~13.5 GB/s per CTA (assumed for onboard)"),
  kernel_plateau={"offload": S(round(25.13 * GIB, 2), TRT_PCIE + ": B200 PCIe kernel offload 25.13 GiB/s at the policy grid"),
                  "onboard": S(round(39.99 * GIB, 2), TRT_PCIE + ": B200 PCIe kernel onboard 39.99 GiB/s at the policy grid")},
  device_copy=S(4000.0, "NVIDIA B200 datasheet: 8 TB/s HBM3e; a copy reads and writes, so half")))
