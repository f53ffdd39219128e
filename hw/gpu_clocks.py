"""GPU state around a measured phase: keep every SM busy first; read the SM clock, the PCIe link
generation and the GPU's name and driver (NVML).

An idle GPU runs at low clocks and takes some time to raise them; a copy kernel whose CTAs are
latency-bound then runs well below the rate the copy bench measured on a warm GPU. A serving GPU
is rarely idle, so hardware runs can ask for ``hw.warm_gpu_ms`` of this spin right before their
threads start. The kernel reads ``%globaltimer`` (nanoseconds) and spins until the deadline; it
moves no data.
"""

from __future__ import annotations

import time

_SPIN_SRC = r"""
extern "C" __global__ void kvsim_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
_kernel = None


def keep_busy(ms: float, stream=None) -> float:
    """Spin 4 CTAs per SM for ``ms`` milliseconds on ``stream``; returns the host seconds waited."""
    import cupy

    from hw.cuda_check import cupy_call, sync

    global _kernel
    if ms <= 0:
        return 0.0
    if _kernel is None:
        _kernel = cupy.RawKernel(_SPIN_SRC, "kvsim_spin")
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    t0 = time.perf_counter()
    with stream:
        cupy_call(f"launch kvsim_spin grid={4 * sms} for {ms} ms", _kernel,
                  (4 * sms,), (128,), (cupy.uint64(int(ms * 1e6)),))
    sync(stream, "keep_busy")
    return time.perf_counter() - t0


def _nvml(device: int, read):
    """``read(pynvml, handle)`` inside an NVML session; raises what NVML raises."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(device))
    finally:
        pynvml.nvmlShutdown()


def sm_clock_mhz(device: int = 0) -> int | None:
    """The SM clock now, or None where NVML cannot say."""
    try:
        return int(_nvml(device, lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
    except Exception:  # noqa: BLE001 - a missing or refusing NVML only loses this figure
        return None


def pcie_link_gen(device: int = 0) -> int | None:
    """The PCIe link generation now, or None where NVML cannot say."""
    try:
        return int(_nvml(device, lambda nv, h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)))
    except Exception:  # noqa: BLE001 - provenance only
        return None


def gpu_identity(device: int = 0) -> dict:
    """``{"gpu": name, "driver": version}`` for a measurement's provenance (``gpu`` says why
    where NVML cannot answer)."""
    try:
        return _nvml(device, lambda nv, h: {"gpu": nv.nvmlDeviceGetName(h),
                                            "driver": nv.nvmlSystemGetDriverVersion()})
    except Exception as e:  # noqa: BLE001 - provenance only
        return {"gpu": f"unknown ({e})", "driver": None}
