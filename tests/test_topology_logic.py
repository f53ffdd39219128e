"""Topology decision logic (hw/topology.py) on faked NVML/CUDA answers; no GPU needed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hw.topology import (
    ATTR_ASYNC_ENGINE_COUNT,
    ATTR_PAGEABLE_MEMORY_ACCESS,
    ATTR_SM_COUNT,
    ATTR_USES_HOST_PAGE_TABLES,
    DEFAULT_COHERENT_GBPS,
    DEFAULT_PCIE_GBPS,
    CudaUnavailableError,
    NvmlAnswers,
    RawAnswers,
    decide,
    gather,
    pcie_gbps,
    to_hardware_json,
)
from kvsim.hardware import load_hardware
from kvsim.model.copy_paths import grid_ctas

NS = 3  # NVML_ERROR_NOT_SUPPORTED


class NVMLError_LibraryNotFound(Exception):  # noqa: N801 - the name pynvml gives it
    pass


class NVMLError_FunctionNotFound(Exception):  # noqa: N801
    pass


def attrs(coherent: int = 0, sms: int = 132, engines: int = 3, pageable: int = 0) -> dict:
    return {ATTR_SM_COUNT: sms, ATTR_ASYNC_ENGINE_COUNT: engines,
            ATTR_PAGEABLE_MEMORY_ACCESS: pageable, ATTR_USES_HOST_PAGE_TABLES: coherent}


def raw(nvml, coherent: int = 0, **kw) -> RawAnswers:
    return RawAnswers(device=0, name="NVIDIA H200", attrs=attrs(coherent, **kw),
                      cuda_runtime_version=13020, cuda_driver_version=13000, nvml=nvml)


def c2c_links(statuses: list[int], mbps: list | None) -> dict:
    fields: dict = {170: (0, len(statuses))}
    for i, s in enumerate(statuses):
        fields[(171, i)] = (0, s)
        if mbps is not None:
            fields[(172, i)] = mbps[i] if isinstance(mbps[i], tuple) else (0, mbps[i])
    return fields


def test_pcie_rate_per_lane_doubles_per_generation():
    assert pcie_gbps(4, 16) == 32.0  # the seed's H100 PCIe detection
    assert pcie_gbps(5, 16) == 64.0  # KVCM2's Gen5 fallback
    assert pcie_gbps(3, 16) == 16.0
    assert pcie_gbps(5, 8) == 32.0


def test_every_c2c_field_not_supported_falls_back_to_pcie_gen5_x16():
    nvml = NvmlAnswers(driver_version="580.159.04", fields={170: (NS, None)},
                       pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml))
    assert t.coherent.value is False
    assert t.link_kind.value == "pcie"
    assert t.link_gbps.value == 64.0
    assert "PCIe Gen5 x16" in t.link_gbps.source
    assert t.c2c_link_count.value is None
    assert "NOT_SUPPORTED (3)" in t.c2c_link_count.source
    assert t.nvml_fields == {"170": "NOT_SUPPORTED (3)"}
    assert t.async_engine_count.value == 3 and t.sm_count.value == 132
    assert "AsyncEngineCount=40" in t.async_engine_count.source
    assert t.driver_version.value == "580.159.04"
    assert t.nvml_status.value == "ok"


def test_seed_h100_pcie_gen4_x16_is_32_gbps_not_the_fallback():
    nvml = NvmlAnswers(fields={170: (NS, None)}, pcie_max_gen=4, pcie_max_width=16)
    t = decide(raw(nvml))
    assert t.link_gbps.value == 32.0 and t.coherent.value is False


@pytest.mark.parametrize("bw", ["unsupported", "missing"])
def test_c2c_count_without_bandwidth_raises_coherent_and_falls_back(bw):
    mbps = [(NS, None), (NS, None)] if bw == "unsupported" else None
    nvml = NvmlAnswers(fields=c2c_links([1, 1], mbps), pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml, coherent=0))
    assert t.coherent.value is True
    assert "raised by" in t.coherent.source and "= 2" in t.coherent.source
    assert t.link_kind.value == "c2c"
    # the PCIe reading exists but is never applied to a coherent link
    assert t.pcie_gbps.value == 64.0
    assert t.link_gbps.value == DEFAULT_COHERENT_GBPS
    assert "fallback" in t.link_gbps.source and "coherent" in t.link_gbps.source
    assert t.c2c_active_links.value == 2


def test_coherent_attribute_alone_makes_the_link_coherent():
    nvml = NvmlAnswers(fields={170: (NS, None)}, pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml, coherent=1, pageable=1))
    assert t.coherent.value is True
    assert "PageableMemoryAccessUsesHostPageTables=100" in t.coherent.source
    assert t.link_gbps.value == DEFAULT_COHERENT_GBPS
    assert t.pageable_memory_access.value == 1


def test_c2c_count_never_clears_coherent():
    nvml = NvmlAnswers(fields={170: (0, 0)}, pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml, coherent=1))
    assert t.coherent.value is True and t.c2c_link_count.value == 0


def test_gh200_like_ten_active_links_sum_their_bandwidth():
    nvml = NvmlAnswers(fields=c2c_links([1] * 10, [44700] * 10), pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml, coherent=1, pageable=1))
    assert t.coherent.value is True and t.link_kind.value == "c2c"
    assert t.link_gbps.value == pytest.approx(447.0)
    assert "447000 MBps" in t.link_gbps.source and "10 of 10 active" in t.link_gbps.source
    assert t.c2c_active_links.value == 10


def test_only_active_links_count():
    nvml = NvmlAnswers(fields=c2c_links([1, 0, 1, 0], [45000] * 4), pcie_max_gen=5,
                       pcie_max_width=16)
    t = decide(raw(nvml, coherent=1))
    assert t.c2c_active_links.value == 2
    assert t.link_gbps.value == pytest.approx(90.0)
    assert t.nvml_fields["171[1]"] == "0"


def test_status_field_failing_for_a_link_does_not_count_it():
    fields = c2c_links([1, 1], [45000, 45000])
    fields[(171, 1)] = (NS, None)
    t = decide(raw(NvmlAnswers(fields=fields), coherent=1))
    assert t.c2c_active_links.value == 1 and t.link_gbps.value == pytest.approx(45.0)


@pytest.mark.parametrize("exc", [ImportError("No module named 'pynvml'"),
                                 NVMLError_LibraryNotFound("NVML Shared Library Not Found")])
def test_nvml_missing_entirely_falls_back_with_the_reason(exc):
    t = decide(raw(exc))
    assert t.link_gbps.value == DEFAULT_PCIE_GBPS and t.coherent.value is False
    assert type(exc).__name__ in t.link_gbps.source and "fallback" in t.link_gbps.source
    assert t.nvml_status.value.startswith("NVML unavailable")
    assert t.driver_version.value is None
    t = decide(raw(exc, coherent=1))
    assert t.coherent.value is True and t.link_gbps.value == DEFAULT_COHERENT_GBPS


def test_field_call_failing_as_a_whole_still_reads_pcie():
    exc = NVMLError_FunctionNotFound("Function Not Found")
    nvml = NvmlAnswers(fields={170: exc}, pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml))
    assert t.link_gbps.value == 64.0 and "NVMLError_FunctionNotFound" in t.c2c_link_count.source


def test_pcie_query_failing_uses_the_default_and_says_why():
    exc = NVMLError_FunctionNotFound("Function Not Found")
    nvml = NvmlAnswers(fields={170: (NS, None)}, pcie_max_gen=exc, pcie_max_width=16)
    t = decide(raw(nvml))
    assert t.link_gbps.value == DEFAULT_PCIE_GBPS
    assert "nvmlDeviceGetMaxPcieLinkGeneration() failed" in t.link_gbps.source


def test_attribute_failure_is_recorded_not_raised():
    r = raw(NvmlAnswers(fields={170: (NS, None)}, pcie_max_gen=5, pcie_max_width=16))
    r.attrs = {**r.attrs, ATTR_USES_HOST_PAGE_TABLES: RuntimeError("cudaErrorInvalidValue"),
               ATTR_SM_COUNT: RuntimeError("boom")}
    t = decide(r)
    assert t.coherent.value is False and "assumed non-coherent" in t.coherent.source
    assert t.sm_count.value is None and "failed" in t.sm_count.source
    json.dumps(t.to_dict())  # serialisable
    assert any("SMs" in line for line in t.summary_lines())


def test_hardware_json_from_detection_loads_and_names_its_source(tmp_path):
    nvml = NvmlAnswers(driver_version="580.159.04", fields={170: (NS, None)},
                       pcie_max_gen=5, pcie_max_width=16)
    t = decide(raw(nvml, sms=120, engines=2))
    out = tmp_path / "detected.json"
    data = to_hardware_json(t, "h200-sxm", path=out, date="2026-12-02")
    hw = load_hardware(out)
    assert hw.name == "h200-sxm-detected" and hw.gpu == "NVIDIA H200"
    assert hw.link.kind == "pcie" and hw.link.coherent is False and hw.link.detected_gbps == 64.0
    assert hw.kernel.sm_count == 120 and hw.copy_engine.count == 2
    assert "kvsim detect" in hw.sources["link.detected_gbps"]
    assert "PCIe Gen5 x16" in hw.sources["link.detected_gbps"]
    assert "kvsim detect" in hw.sources["kernel.sm_count"]
    # the rest is the base preset's, with the base preset's sources
    base = load_hardware("h200-sxm")
    assert hw.copy_engine.plateau_gbps == base.copy_engine.plateau_gbps
    assert grid_ctas(hw, "onboard") >= 2
    assert data["link"]["coherent"]["value"] is False


def test_hardware_json_for_a_coherent_detection():
    nvml = NvmlAnswers(fields=c2c_links([1] * 10, [44700] * 10))
    data = to_hardware_json(decide(raw(nvml, coherent=1)), "gh200")
    assert data["link"]["kind"]["value"] == "c2c" and data["link"]["detected_gbps"]["value"] == 447.0


def test_gather_without_cupy_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(CudaUnavailableError, match="CuPy"):
        gather(0)


def test_detect_command_without_cuda_exits_1_with_a_clear_message(monkeypatch, capsys):
    from kvsim.cli import main

    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["detect", "--json"]) == 1
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "CuPy" in err and "Traceback" not in err


def test_detect_command_in_a_fresh_process_without_cuda():
    code = ("import sys; sys.modules['cupy'] = None\n"
            "from kvsim.cli import main\n"
            "sys.exit(main(['detect']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert "kvsim detect: CUDA is not available" in out.stderr
    assert "Traceback" not in out.stderr


def test_topology_and_detect_modules_import_no_gpu_library():
    code = ("import sys, hw.topology, hw.pools, kvsim.model.copy_select, hw.executor_copies, "
            "kvsim.cli.detect\n"
            "print(','.join(m for m in ('cupy', 'pynvml', 'cuda', 'torch', 'simpy') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
