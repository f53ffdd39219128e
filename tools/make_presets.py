"""Write the hardware presets in kvsim/hardware/presets/ from their sources.

Every number is written with its source. The h200-sxm preset, and the few figures other presets
borrow from it, are fitted to the committed H200 measurement (kvsim.calibration.copy_fit).

Usage: python tools/make_presets.py [MEASUREMENT.json]
"""

import json
import sys
from pathlib import Path

from kvsim.calibration.copy_fit import FIT_RULES, fit, observations
from kvsim.calibration.hardware_json import GRID, NOTES, REF_INFLIGHT, TRT, S, measured_preset

PLAN_COPIES = "reports/measurements/h200/2026-12-02-plan-copies.json"
LINK_WAKE = "reports/measurements/h200/2026-12-02-link-wake.json"
PLAN_BATCHES = "reports/validation-h200/plan-batches/2026-12-03-plan-batches.json.xz"

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
    "H200_DESC_HOST": {d: fitted(FIT["batch_descriptor_host_us"], "copy_engine.batch_call_host_us, batch_descriptor_host_us")
                       for d in ("offload", "onboard")},
    "H200_LAUNCH_HOST": fitted(FIT["launch_host_us"], "kernel.launch_host_us"),
    # Filled in after the H200 preset is written (h200_copier): the copier's host costs.
    "H200_COPIER_BATCH_HOST": None,
    "H200_COPIER_PAGE_HOST": None,
    "H200_COPIER_CE_HOST": None,
    "H200_COPIER_AFTER_LAUNCH": None,
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

GIB = 1.073741824  # GiB/s -> GB/s
TRT_PCIE = TRT + ", computeConfigs() comment: copy engine vs kernel measured on PCIe hosts"
TILE = S(4096, TRT + ": kThreads 128 x kIlp 2 x 16 B per stage")
THREADS = S(128, TRT + ": kThreads")



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

H200_DATA = measured_preset(
    "h200-sxm",
    "H200 SXM on an x86 host over PCIe Gen5 x16 (non-coherent), fitted to this repository's own H200 measurement. Kernel figures are for hw/copy_kernels.py's LDGSTS kernel.",
    MEASUREMENT, PLAN_COPIES, LINK_WAKE, PLAN_BATCHES)
Path("kvsim/hardware/presets/h200-sxm.json").write_text(json.dumps(H200_DATA, indent=1) + "\n")
BORROWED["H200_COPIER_BATCH_HOST"] = H200_DATA["copier"]["submit_batch_host_us"]
BORROWED["H200_COPIER_PAGE_HOST"] = H200_DATA["copier"]["submit_page_host_us"]
BORROWED["H200_COPIER_CE_HOST"] = H200_DATA["copier"]["submit_copy_engine_host_us"]
BORROWED["H200_COPIER_AFTER_LAUNCH"] = H200_DATA["copier"]["submit_after_launch_host_us"]
NOT_MEASURED_PAGE_LATENCY = {d: S(0.0, "not measured on this GPU: no per-page term") for d in ("offload", "onboard")}
NOT_MEASURED_BATCH_DEVICE = {d: S(0.0, "not measured on this GPU: the copier's index upload is not modelled") for d in ("offload", "onboard")}
NOT_MEASURED_SMALL_COPY = {d: S(0.0, "not measured on this GPU: no small-copy term") for d in ("offload", "onboard")}
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
        "batch_small_copy_host_us_per_kib": NOT_MEASURED_SMALL_COPY,
        "batch_small_copy_max_bytes": S(0, "not measured on this GPU: no small-copy term"),
        "batch_lead_descriptors": S(0, "not measured on this GPU: the device starts after the whole call"),
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
                 "submit_copy_engine_host_us": "H200_COPIER_CE_HOST",
                 "submit_after_launch_host_us": "H200_COPIER_AFTER_LAUNCH",
                 "idle_wake_us": NOT_MEASURED_WAKE,
                 "idle_after_ms": S(0.0, "not measured on this GPU (idle_wake_us is 0)")},
      "device_copy_gbps": device_copy}


write("h100-pcie", borrowed_preset(
  "h100-pcie", "The seed's host: H100 PCIe on a PCIe Gen4 x16 link (detected 32.0 GB/s, non-coherent).",
  "NVIDIA H100 PCIe",
  link={
      "kind": "pcie", "coherent": False,
      "detected_gbps": S(32.0, "seed PR #18541: H100 PCIe detection, non-coherent, 32.0 GB/s (Gen4 x16)"),
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
