import json
from pathlib import Path

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
KNEE = {"offload": None, "onboard": S(2.2, TRT + ": onboard rolls off with a soft knee, p = 2.2; offload is linear then hard-clamps")}
# H100 copy-engine small-copy behaviour (public figures), used for Hopper presets without our own measurement.
H100_PER_COPY = S(3.75, NOTES + ": per-call cudaMemcpyAsync about 3.5-4 us for small copies on H100 (torchcomms #2195)")
VLLM = NOTES + ": vLLM PR #42212, cuMemcpyBatchAsync on H100: 4-7 GB/s for 4-24 KiB pages, 40-52 GB/s from 28 KiB"
H100_CURVE = [[S(4096, VLLM), S(4.0, VLLM)], [S(24576, VLLM), S(7.0, VLLM)],
              [S(28672, VLLM), S(40.0, VLLM)], [S(1048576, VLLM), S(52.0, VLLM)]]
UNALIGNED_NOTE = "reports/measurements/h200: alignment-agnostic kernel vs fast kernel (H200), assumed elsewhere"

def write(name, data):
    Path(f"kvsim/hardware/presets/{name}.json").write_text(json.dumps(data, indent=1) + "\n")

write("h100-pcie", {
  "name": "h100-pcie",
  "description": "The seed's host: H100 PCIe on a PCIe Gen4 x16 link (detected 32.0 GB/s, non-coherent).",
  "gpu": "NVIDIA H100 PCIe",
  "link": {
    "kind": "pcie", "coherent": False,
    "detected_gbps": S(32.0, "seed (DESIGN.md section 5): H100 PCIe detection, non-coherent, 32.0 GB/s (Gen4 x16)"),
    "per_direction_gbps": {"offload": S(31.5, NOTES + ": PCIe Gen4 x16 raw, per direction"),
                           "onboard": S(31.5, NOTES + ": PCIe Gen4 x16 raw, per direction")},
    "bidirectional_factor": "H200_BIDIR"},
  "copy_engine": {
    "count": S(3, NOTES + ": asyncEngineCount 3 on H100/H200"),
    "plateau_gbps": {"offload": S(round(17.45 * GIB, 2), TRT_PCIE + ": H100 PCIe Gen4 copy engine offload 17.45 GiB/s"),
                     "onboard": S(round(23.88 * GIB, 2), TRT_PCIE + ": H100 PCIe Gen4 copy engine onboard 23.88 GiB/s")},
    "per_copy_device_us": H100_PER_COPY,
    "per_call_host_us": "H200_CALL_HOST",
    "batch_call_host_us": "H200_BATCH_HOST",
    "batch_descriptor_host_us": "H200_DESC_HOST",
    "batch_curve": {"offload": H100_CURVE, "onboard": H100_CURVE}},
  "kernel": {
    "sm_count": S(114, "NVIDIA H100 PCIe datasheet: 114 SMs"),
    "threads_per_cta": THREADS, "tile_bytes": TILE, "reference_inflight_bytes": REF_INFLIGHT,
    "per_cta_gbps": {"offload": S(13.5, TRT_PCIE + ": on PCIe a fixed 32 KiB in flight yields ~13.5 GB/s per CTA (B200 Gen5; assumed for H100)"),
                     "onboard": S(13.5, TRT_PCIE + ": ~13.5 GB/s per CTA on PCIe (assumed for onboard)")},
    "plateau_gbps": {"offload": S(round(8.56 * GIB, 2), TRT_PCIE + ": H100 PCIe kernel offload 8.56 GiB/s (Hopper SM->host store cap)"),
                     "onboard": S(round(23.89 * GIB, 2), TRT_PCIE + ": H100 PCIe kernel onboard 23.89 GiB/s")},
    "knee_p": KNEE,
    "launch_host_us": "H200_LAUNCH_HOST",
    "unaligned_efficiency": "H200_UNALIGNED"},
  "grid_policy": GRID,
  "device_copy_gbps": S(1000.0, "NVIDIA H100 PCIe datasheet: 2.0 TB/s HBM2e; a copy reads and writes, so half")})

write("gh200", {
  "name": "gh200",
  "description": "Grace Hopper GH200: NVLink-C2C, 10 links, coherent (ATS).",
  "gpu": "NVIDIA GH200 (H100 GPU)",
  "link": {
    "kind": "c2c", "coherent": True,
    "detected_gbps": S(447.0, "seed PR #18541: measured on GH200 (10 C2C links, 447 GB/s)"),
    "per_direction_gbps": {"offload": S(450.0, NOTES + ": NVLink-C2C 900 GB/s total, 450 per direction (NVIDIA blog)"),
                           "onboard": S(450.0, NOTES + ": NVLink-C2C 900 GB/s total, 450 per direction (NVIDIA blog)")},
    "bidirectional_factor": S(0.5, NOTES + ": GH200 both directions at once reached about half of peak (public studies)")},
  "copy_engine": {
    "count": S(3, NOTES + ": asyncEngineCount 3 on H100/H200 (GH200's GPU is an H100)"),
    "plateau_gbps": {"offload": S(297.0, NOTES + ": GH200 measured CE D2H about 297 GB/s (public studies)"),
                     "onboard": S(360.0, NOTES + ": GH200 measured CE H2D about 346-375 GB/s (public studies), midpoint")},
    "per_copy_device_us": H100_PER_COPY,
    "per_call_host_us": "H200_CALL_HOST",
    "batch_call_host_us": "H200_BATCH_HOST",
    "batch_descriptor_host_us": "H200_DESC_HOST",
    "batch_curve": {"offload": H100_CURVE, "onboard": H100_CURVE}},
  "kernel": {
    "sm_count": S(132, "NVIDIA GH200 datasheet: H100 GPU with 132 SMs"),
    "threads_per_cta": THREADS, "tile_bytes": TILE, "reference_inflight_bytes": REF_INFLIGHT,
    "per_cta_gbps": {"offload": S(43.0, TRT + ": kPerCtaGBs, profiled on GH200 at 1 MiB pages; directions differ in curve shape, not per-CTA throughput"),
                     "onboard": S(43.0, TRT + ": kPerCtaGBs (same per-CTA throughput both directions)")},
    "plateau_gbps": {"offload": S(355.0, TRT + ": GH200 peaks at 355 GB/s writing host memory"),
                     "onboard": S(351.0, TRT + ": GH200 peaks at 351 GB/s reading host memory")},
    "knee_p": KNEE,
    "launch_host_us": "H200_LAUNCH_HOST",
    "unaligned_efficiency": "H200_UNALIGNED"},
  "grid_policy": GRID,
  "device_copy_gbps": S(2000.0, "NVIDIA GH200 datasheet: 4 TB/s HBM3; a copy reads and writes, so half")})

write("gb200", {
  "name": "gb200",
  "description": "Grace Blackwell GB200: two B200 GPUs per Grace on NVLink-C2C, coherent; one GPU's share.",
  "gpu": "NVIDIA B200 (GB200)",
  "link": {
    "kind": "c2c", "coherent": True,
    "detected_gbps": S(223.6, TRT + ": kFallbackCoherentGBs 223.6, the narrower (2 GPUs per Grace) C2C config"),
    "per_direction_gbps": {"offload": S(223.6, TRT + ": kFallbackCoherentGBs (2 GPUs per Grace C2C)"),
                           "onboard": S(223.6, TRT + ": kFallbackCoherentGBs (2 GPUs per Grace C2C)")},
    "bidirectional_factor": S(0.5, NOTES + ": GH200 C2C both directions at once about half of peak (assumed for GB200)")},
  "copy_engine": {
    "count": S(4, "assumption: Blackwell asyncEngineCount; no measurement in this repo (calibrate to replace)"),
    "plateau_gbps": {"offload": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link (achieved fraction measured 79%-86%)"),
                     "onboard": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link")},
    "per_copy_device_us": H100_PER_COPY,
    "per_call_host_us": "H200_CALL_HOST",
    "batch_call_host_us": "H200_BATCH_HOST",
    "batch_descriptor_host_us": "H200_DESC_HOST",
    "batch_curve": {"offload": H100_CURVE, "onboard": H100_CURVE}},
  "kernel": {
    "sm_count": S(148, "NVIDIA B200 datasheet: 148 SMs"),
    "threads_per_cta": THREADS, "tile_bytes": TILE, "reference_inflight_bytes": REF_INFLIGHT,
    "per_cta_gbps": {"offload": S(43.0, TRT + ": kPerCtaGBs (tuned on GH200, GB200 and B200; platform-independent knees)"),
                     "onboard": S(43.0, TRT + ": kPerCtaGBs")},
    "plateau_gbps": {"offload": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link, below kHostSustainedGBs"),
                     "onboard": S(round(0.80 * 223.6, 2), TRT + ": kLinkEfficiency 0.80 x link, below kHostSustainedGBs")},
    "knee_p": KNEE,
    "launch_host_us": "H200_LAUNCH_HOST",
    "unaligned_efficiency": "H200_UNALIGNED"},
  "grid_policy": GRID,
  "device_copy_gbps": S(4000.0, "NVIDIA B200 datasheet: 8 TB/s HBM3e; a copy reads and writes, so half")})

write("b200", {
  "name": "b200",
  "description": "B200 on an x86 host over PCIe Gen5 x16 (non-coherent).",
  "gpu": "NVIDIA B200",
  "link": {
    "kind": "pcie", "coherent": False,
    "detected_gbps": S(63.0, NOTES + ": PCIe Gen5 x16 raw per direction (detection reports generation x width)"),
    "per_direction_gbps": {"offload": S(63.0, NOTES + ": PCIe Gen5 x16 raw, per direction"),
                           "onboard": S(63.0, NOTES + ": PCIe Gen5 x16 raw, per direction")},
    "bidirectional_factor": "H200_BIDIR"},
  "copy_engine": {
    "count": S(4, "assumption: Blackwell asyncEngineCount; no measurement in this repo (calibrate to replace)"),
    "plateau_gbps": {"offload": S(round(43.17 * GIB, 2), TRT_PCIE + ": B200 PCIe Gen5 copy engine offload 43.17 GiB/s"),
                     "onboard": S(round(42.58 * GIB, 2), TRT_PCIE + ": B200 PCIe Gen5 copy engine onboard 42.58 GiB/s")},
    "per_copy_device_us": H100_PER_COPY,
    "per_call_host_us": "H200_CALL_HOST",
    "batch_call_host_us": "H200_BATCH_HOST",
    "batch_descriptor_host_us": "H200_DESC_HOST",
    "batch_curve": {"offload": H100_CURVE, "onboard": H100_CURVE}},
  "kernel": {
    "sm_count": S(148, "NVIDIA B200 datasheet: 148 SMs"),
    "threads_per_cta": THREADS, "tile_bytes": TILE, "reference_inflight_bytes": REF_INFLIGHT,
    "per_cta_gbps": {"offload": S(13.5, TRT_PCIE + ": on Blackwell PCIe a fixed 32 KiB in flight yields ~13.5 GB/s per CTA"),
                     "onboard": S(13.5, TRT_PCIE + ": ~13.5 GB/s per CTA (assumed for onboard)")},
    "plateau_gbps": {"offload": S(round(25.13 * GIB, 2), TRT_PCIE + ": B200 PCIe kernel offload 25.13 GiB/s at the policy grid"),
                     "onboard": S(round(39.99 * GIB, 2), TRT_PCIE + ": B200 PCIe kernel onboard 39.99 GiB/s at the policy grid")},
    "knee_p": KNEE,
    "launch_host_us": "H200_LAUNCH_HOST",
    "unaligned_efficiency": "H200_UNALIGNED"},
  "grid_policy": GRID,
  "device_copy_gbps": S(4000.0, "NVIDIA B200 datasheet: 8 TB/s HBM3e; a copy reads and writes, so half")})
