"""GPU: topology detection on the real device, and ``kvsim detect`` there.

On the H200 of this project (x86 host, PCIe Gen5 x16): non-coherent, 64.0 GB/s from PCIe, every C2C
field NOT_SUPPORTED, asyncEngineCount 3, 132 SMs. On another GPU only the generic checks run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hwtest_support import gpu_or_skip

from kvsim.hardware import load_hardware

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def topo():
    gpu_or_skip()
    from hw.topology import detect

    return detect(0)


def test_every_figure_names_its_source(topo):
    d = topo.to_dict()
    for key, fig in d.items():
        if isinstance(fig, dict) and "source" in fig:
            assert fig["source"], key
    assert topo.link_gbps.value > 0
    assert topo.sm_count.value and topo.async_engine_count.value


def test_h200_pcie_host(topo):
    if "H200" not in str(topo.name.value):
        pytest.skip(f"expectations are for an H200; this is {topo.name.value}")
    assert topo.nvml_status.value == "ok"
    assert topo.coherent.value is False
    assert topo.uses_host_page_tables.value == 0
    assert topo.link_kind.value == "pcie"
    assert (topo.pcie_max_gen.value, topo.pcie_max_width.value) == (5, 16)
    assert topo.link_gbps.value == 64.0
    assert "PCIe Gen5 x16" in topo.link_gbps.source
    assert topo.nvml_fields.get("170") == "NOT_SUPPORTED (3)"
    assert topo.c2c_link_count.value is None
    assert topo.async_engine_count.value == 3
    assert topo.sm_count.value == 132


def test_kvsim_detect_json_and_hardware_file(topo, tmp_path):
    out = tmp_path / "detected.json"
    res = subprocess.run([sys.executable, "-m", "kvsim.cli", "detect", "--json",
                          "--write-hardware", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["link_gbps"]["value"] == topo.link_gbps.value
    assert doc["hardware_json"] == str(out)
    hw = load_hardware(out)
    assert hw.link.detected_gbps == topo.link_gbps.value
    assert hw.kernel.sm_count == topo.sm_count.value
    assert "kvsim detect" in hw.sources["link.detected_gbps"]


def test_kvsim_detect_human_readable(topo):
    res = subprocess.run([sys.executable, "-m", "kvsim.cli", "detect"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "link GB/s" in res.stdout and str(topo.name.value) in res.stdout
