"""CPU-GPU topology detection: is the link coherent, how fast is it, what does the GPU have.

Two layers, so the decision can be tested without a GPU:

* :func:`gather` asks the machine (CUDA attributes through CuPy, NVML through ``pynvml``) and
  returns the raw answers as :class:`RawAnswers`: every value, or the exception its call raised.
  It decides nothing.
* :func:`decide` turns raw answers into a :class:`Topology`; pure, no imports of GPU libraries.

:func:`detect` is ``decide(gather(device))``. Every figure of a :class:`Topology` is a
:class:`Figure` that carries the ``source`` it came from (the call and field that answered, or
which fallback was used and why). The rules follow KVCM2's detection
(seed PR #18541, ``queryNvmlLink``):

* ``coherent`` comes from CUDA attribute 100 (PageableMemoryAccessUsesHostPageTables). An NVML C2C
  link count > 0 (field 170) raises it; nothing ever clears it.
* Link bandwidth: the sum of field 172 (max bandwidth in MBps, 1 MBps = 1e6 B/s) over the C2C
  links whose status (field 171) is 1 (active); each field's own ``nvmlReturn`` is checked, and
  3 (NOT_SUPPORTED) is the ordinary answer on PCIe hosts. Without a C2C figure: on a non-coherent
  link, PCIe max generation x max width (:data:`PCIE_GBPS_PER_LANE`); a PCIe reading is never
  applied to a coherent link. Without either: :data:`DEFAULT_PCIE_GBPS` or
  :data:`DEFAULT_COHERENT_GBPS`, KVCM2's conservative fallbacks.
* NVML missing or failing (``pynvml`` not installed, library not found, function not found, no
  permission, ...) is never a crash: the answers record the exception and the figures fall back,
  naming the reason.

:func:`to_hardware_json` writes a hardware JSON (a copy of a base preset with the detected link,
SM count and copy-engine count) that :func:`kvsim.hardware.load_hardware` reads.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# CUDA device attributes (cudaDeviceAttr)
ATTR_SM_COUNT = 16  # cudaDevAttrMultiProcessorCount
ATTR_ASYNC_ENGINE_COUNT = 40  # cudaDevAttrAsyncEngineCount
ATTR_PAGEABLE_MEMORY_ACCESS = 88  # cudaDevAttrPageableMemoryAccess
ATTR_USES_HOST_PAGE_TABLES = 100  # cudaDevAttrPageableMemoryAccessUsesHostPageTables
ATTRS = (ATTR_SM_COUNT, ATTR_ASYNC_ENGINE_COUNT, ATTR_PAGEABLE_MEMORY_ACCESS, ATTR_USES_HOST_PAGE_TABLES)
ATTR_NAMES = {
    ATTR_SM_COUNT: "MultiProcessorCount",
    ATTR_ASYNC_ENGINE_COUNT: "AsyncEngineCount",
    ATTR_PAGEABLE_MEMORY_ACCESS: "PageableMemoryAccess",
    ATTR_USES_HOST_PAGE_TABLES: "PageableMemoryAccessUsesHostPageTables",
}

# NVML field ids (nvml.h) and return codes
FI_C2C_LINK_COUNT = 170
FI_C2C_LINK_GET_STATUS = 171  # per link (scopeId = link index): 0 inactive, 1 active
FI_C2C_LINK_GET_MAX_BW = 172  # per link: "C2C link speed in MBps for active links"
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_RETURN_NAMES = {
    0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE", 8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM", 15: "GPU_IS_LOST", 999: "UNKNOWN",
}

#: GB/s per lane and direction by PCIe generation, as KVCM2's detection counts it: 2.0 GB/s per
#: lane at Gen4, doubling with each generation (Gen3 taken as 1.0). So Gen4 x16 = 32.0 GB/s, which
#: is what the seed reports for its H100 PCIe host ("non-coherent, 32.0 GB/s (Gen4 x16)", seed PR
#: #18541), and Gen5 x16 = 64.0 GB/s, KVCM2's PCIe fallback constant. These are rounded signalling
#: rates, not payload rates: the raw figures after encoding are 31.5 (Gen4) and 63.0 (Gen5) GB/s
#: per x16 direction (docs/hardware-notes.md); only the CTA grid policy consumes this number.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 1.0, 4: 2.0, 5: 4.0, 6: 8.0}
DEFAULT_PCIE_GBPS = 64.0  # KVCM2 fallback for a non-coherent link when NVML gives nothing
DEFAULT_COHERENT_GBPS = 223.6  # KVCM2 fallback for a coherent link without a C2C bandwidth figure
FALLBACK_SOURCE = "KVCM2 conservative fallback (seed PR #18541)"


def nvml_return_name(code: int) -> str:
    return f"{NVML_RETURN_NAMES.get(int(code), 'ERROR')} ({int(code)})"


def _err(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# raw answers (what gather() collects; what tests fake)

FieldKey = int | tuple[int, int]  # field id (scope 0) or (field id, scope id)
FieldAnswer = tuple[int, Any]  # (nvmlReturn, value); value is meaningless unless nvmlReturn == 0


@dataclass
class NvmlAnswers:
    """What NVML said. Each entry is its value, or the exception its call raised.

    ``fields``: ``170`` -> answer for the link count; ``(171, link)`` and ``(172, link)`` -> the
    answers for each link index (queried only when the count answered > 0). A key that is absent
    means the field was not asked for (or not answered at all).
    """

    driver_version: str | BaseException | None = None
    fields: Mapping[FieldKey, FieldAnswer | BaseException] = field(default_factory=dict)
    pcie_max_gen: int | BaseException | None = None
    pcie_max_width: int | BaseException | None = None


@dataclass
class RawAnswers:
    """Everything :func:`decide` needs; each value or the exception its call raised.

    ``nvml`` is an exception when NVML could not be used at all (``pynvml`` missing, ``nvmlInit``
    or the device handle failed): its text becomes the reason of every NVML-based fallback.
    """

    device: int = 0
    name: str | BaseException = "unknown"
    attrs: Mapping[int, int | BaseException] = field(default_factory=dict)
    cuda_runtime_version: int | BaseException | None = None
    cuda_driver_version: int | BaseException | None = None
    nvml: NvmlAnswers | BaseException = field(default_factory=NvmlAnswers)


# ---------------------------------------------------------------------------------------------
# the decision


@dataclass(frozen=True)
class Figure:
    """One detected value and where it came from (the call and field, or the fallback and why)."""

    value: Any
    source: str

    def to_dict(self) -> dict:
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class Topology:
    """The detected topology of one device; every figure names its source."""

    device: int
    name: Figure
    coherent: Figure  # bool
    link_kind: Figure  # "c2c" | "pcie"
    link_gbps: Figure  # float, per direction, GB/s = 1e9 B/s; feeds the CTA grid policy
    c2c_link_count: Figure  # int | None (None: NVML did not answer field 170)
    c2c_active_links: Figure  # int | None
    c2c_gbps: Figure  # float | None: the C2C sum, when obtained
    pcie_max_gen: Figure  # int | None
    pcie_max_width: Figure  # int | None
    pcie_gbps: Figure  # float | None: gen x width, when both answered
    sm_count: Figure  # int | None
    async_engine_count: Figure  # int | None
    pageable_memory_access: Figure  # attr 88, int | None
    uses_host_page_tables: Figure  # attr 100, int | None
    driver_version: Figure  # str | None
    cuda_driver_version: Figure  # int | None (e.g. 13000)
    cuda_runtime_version: Figure  # int | None
    nvml_status: Figure  # "ok" or the reason NVML was not usable
    nvml_fields: dict[str, str] = field(default_factory=dict)  # "170" / "171[0]" -> answer text

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"device": self.device}
        for name in ("name", "coherent", "link_kind", "link_gbps", "c2c_link_count",
                     "c2c_active_links", "c2c_gbps", "pcie_max_gen", "pcie_max_width", "pcie_gbps",
                     "sm_count", "async_engine_count", "pageable_memory_access",
                     "uses_host_page_tables", "driver_version", "cuda_driver_version",
                     "cuda_runtime_version", "nvml_status"):
            out[name] = getattr(self, name).to_dict()
        out["nvml_fields"] = dict(self.nvml_fields)
        return out

    def summary_lines(self) -> list[str]:
        """Human-readable lines, one figure each, with its source."""
        lines = [f"device {self.device}: {self.name.value}"]
        for label, fig in (("coherent", self.coherent), ("link", self.link_kind),
                           ("link GB/s", self.link_gbps), ("C2C links", self.c2c_link_count),
                           ("C2C active", self.c2c_active_links), ("PCIe max gen", self.pcie_max_gen),
                           ("PCIe max width", self.pcie_max_width), ("PCIe GB/s", self.pcie_gbps),
                           ("SMs", self.sm_count), ("copy engines", self.async_engine_count),
                           ("attr 88", self.pageable_memory_access),
                           ("attr 100", self.uses_host_page_tables),
                           ("driver", self.driver_version), ("CUDA driver", self.cuda_driver_version),
                           ("CUDA runtime", self.cuda_runtime_version), ("NVML", self.nvml_status)):
            lines.append(f"  {label:<15} {fig.value!s:<22} [{fig.source}]")
        if self.nvml_fields:
            lines.append("  NVML fields     " + ", ".join(f"{k}: {v}" for k, v in self.nvml_fields.items()))
        return lines


def _attr_figure(raw: RawAnswers, attr: int) -> Figure:
    call = f"cudaDeviceGetAttribute({ATTR_NAMES[attr]}={attr}, device {raw.device})"
    v = raw.attrs.get(attr)
    if v is None:
        return Figure(None, f"{call} was not asked")
    if isinstance(v, BaseException):
        return Figure(None, f"{call} failed: {_err(v)}")
    return Figure(int(v), call)


def _simple_figure(v: Any, call: str, convert: Any = None) -> Figure:
    if v is None:
        return Figure(None, f"{call} was not asked")
    if isinstance(v, BaseException):
        return Figure(None, f"{call} failed: {_err(v)}")
    return Figure(convert(v) if convert else v, call)


def _field(fields: Mapping[FieldKey, Any], fid: int, scope: int = 0) -> FieldAnswer | BaseException | None:
    if (fid, scope) in fields:
        return fields[(fid, scope)]
    if scope == 0 and fid in fields:
        return fields[fid]
    return None


def _field_text(ans: FieldAnswer | BaseException | None) -> str:
    if ans is None:
        return "not answered"
    if isinstance(ans, BaseException):
        return f"call failed: {_err(ans)}"
    ret, value = ans
    if int(ret) == NVML_SUCCESS:
        return f"{value}"
    return nvml_return_name(ret)


def pcie_gbps(gen: int, width: int) -> float:
    """GB/s per direction for a PCIe generation and width (see :data:`PCIE_GBPS_PER_LANE`)."""
    per_lane = PCIE_GBPS_PER_LANE.get(int(gen), 0.25 * 2.0 ** (int(gen) - 1))
    return per_lane * int(width)


def decide(raw: RawAnswers) -> Topology:
    """The topology implied by raw answers. Pure; never raises on missing or failed answers."""
    dev = raw.device
    name = Figure(raw.name if not isinstance(raw.name, BaseException) else None,
                  f"cudaGetDeviceProperties(device {dev}).name" if not isinstance(raw.name, BaseException)
                  else f"cudaGetDeviceProperties(device {dev}) failed: {_err(raw.name)}")
    sm = _attr_figure(raw, ATTR_SM_COUNT)
    ce = _attr_figure(raw, ATTR_ASYNC_ENGINE_COUNT)
    a88 = _attr_figure(raw, ATTR_PAGEABLE_MEMORY_ACCESS)
    a100 = _attr_figure(raw, ATTR_USES_HOST_PAGE_TABLES)
    rt_ver = _simple_figure(raw.cuda_runtime_version, "cudaRuntimeGetVersion()", int)
    drv_ver = _simple_figure(raw.cuda_driver_version, "cudaDriverGetVersion()", int)

    # coherent: attribute 100 first
    if a100.value is None:
        coherent = Figure(False, f"assumed non-coherent: {a100.source}")
    else:
        coherent = Figure(bool(a100.value), f"{a100.source} = {a100.value}")

    nvml = raw.nvml
    fields_text: dict[str, str] = {}
    if isinstance(nvml, BaseException):
        reason = f"NVML unavailable: {_err(nvml)}"
        nvml_status = Figure(reason, "pynvml import / nvmlInit / device handle")
        count = Figure(None, reason)
        active = Figure(None, reason)
        c2c = Figure(None, reason)
        gen = Figure(None, reason)
        width = Figure(None, reason)
        driver = Figure(None, reason)
    else:
        reason = ""
        nvml_status = Figure("ok", "pynvml: nvmlInit and device handle succeeded")
        driver = _simple_figure(nvml.driver_version, "nvmlSystemGetDriverVersion()",
                                lambda v: v.decode() if isinstance(v, bytes) else str(v))
        gen = _simple_figure(nvml.pcie_max_gen, "nvmlDeviceGetMaxPcieLinkGeneration()", int)
        width = _simple_figure(nvml.pcie_max_width, "nvmlDeviceGetMaxPcieLinkWidth()", int)
        ans = _field(nvml.fields, FI_C2C_LINK_COUNT)
        fields_text[str(FI_C2C_LINK_COUNT)] = _field_text(ans)
        call = f"nvmlDeviceGetFieldValues(C2C_LINK_COUNT={FI_C2C_LINK_COUNT})"
        if isinstance(ans, tuple) and int(ans[0]) == NVML_SUCCESS:
            count = Figure(int(ans[1]), call)
        else:
            count = Figure(None, f"{call}: {_field_text(ans)}")
        no_links = (f"no C2C link count ({count.source})" if count.value is None
                    else f"C2C link count is {count.value}")
        active = Figure(None, no_links)
        c2c = Figure(None, no_links)
        if count.value is not None and count.value > 0:
            # an NVML C2C link count can raise `coherent`, never clear it
            if not coherent.value:
                coherent = Figure(True, f"raised by {call} = {count.value} "
                                        f"(link count > 0) although {coherent.source}")
            n_active, total_mbps, with_bw = 0, 0, 0
            for link in range(count.value):
                st = _field(nvml.fields, FI_C2C_LINK_GET_STATUS, link)
                bw = _field(nvml.fields, FI_C2C_LINK_GET_MAX_BW, link)
                fields_text[f"{FI_C2C_LINK_GET_STATUS}[{link}]"] = _field_text(st)
                fields_text[f"{FI_C2C_LINK_GET_MAX_BW}[{link}]"] = _field_text(bw)
                if not (isinstance(st, tuple) and int(st[0]) == NVML_SUCCESS and int(st[1]) == 1):
                    continue
                n_active += 1
                if isinstance(bw, tuple) and int(bw[0]) == NVML_SUCCESS:
                    with_bw += 1
                    total_mbps += int(bw[1])
            active = Figure(n_active, f"nvmlDeviceGetFieldValues(C2C_LINK_GET_STATUS={FI_C2C_LINK_GET_STATUS}"
                                      f", scope = link 0..{count.value - 1}) == 1")
            if total_mbps > 0:
                c2c = Figure(total_mbps / 1000.0,
                             f"sum of nvmlDeviceGetFieldValues(C2C_LINK_GET_MAX_BW={FI_C2C_LINK_GET_MAX_BW}) "
                             f"over {with_bw} of {n_active} active links of {count.value}: "
                             f"{total_mbps} MBps")
            else:
                c2c = Figure(None, f"no active link answered field {FI_C2C_LINK_GET_MAX_BW} "
                                   f"({n_active} of {count.value} links active)")

    if gen.value is not None and width.value is not None:
        pcie = Figure(pcie_gbps(gen.value, width.value),
                      f"PCIe Gen{gen.value} x{width.value} (nvmlDeviceGetMaxPcieLinkGeneration/Width) "
                      f"at {PCIE_GBPS_PER_LANE.get(gen.value, pcie_gbps(gen.value, 1))} GB/s per lane")
    else:
        pcie = Figure(None, f"no PCIe reading: generation [{gen.source}], width [{width.source}]")

    # bandwidth: C2C sum, else PCIe (non-coherent links only), else the fallback constant
    if c2c.value is not None:
        link_gbps = Figure(c2c.value, f"NVML C2C: {c2c.source}")
    elif coherent.value:
        why = reason or (f"no C2C bandwidth ({c2c.source}); a PCIe reading is never applied "
                         f"to a coherent link")
        link_gbps = Figure(DEFAULT_COHERENT_GBPS, f"{FALLBACK_SOURCE} for a coherent link: {why}")
    elif pcie.value is not None:
        link_gbps = Figure(pcie.value, pcie.source)
    else:
        why = reason or f"no C2C bandwidth and {pcie.source}"
        link_gbps = Figure(DEFAULT_PCIE_GBPS, f"{FALLBACK_SOURCE} for a PCIe link: {why}")
    kind = Figure("c2c" if coherent.value else "pcie", f"from coherent ({coherent.source})")
    return Topology(device=dev, name=name, coherent=coherent, link_kind=kind, link_gbps=link_gbps,
                    c2c_link_count=count, c2c_active_links=active, c2c_gbps=c2c, pcie_max_gen=gen,
                    pcie_max_width=width, pcie_gbps=pcie, sm_count=sm, async_engine_count=ce,
                    pageable_memory_access=a88, uses_host_page_tables=a100, driver_version=driver,
                    cuda_driver_version=drv_ver, cuda_runtime_version=rt_ver,
                    nvml_status=nvml_status, nvml_fields=fields_text)


# ---------------------------------------------------------------------------------------------
# asking the machine


class CudaUnavailableError(RuntimeError):
    """No usable CUDA: CuPy missing, no driver, or no such device. The message names what is missing."""


def _field_value(fv: Any) -> Any:
    """The value of one ``c_nvmlFieldValue_t`` by its ``valueType``."""
    union = fv.value
    by_type = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    attr = by_type.get(int(getattr(fv, "valueType", 1)), "uiVal")
    return getattr(union, attr, getattr(union, "uiVal", None))


def _query_fields(pynvml: Any, handle: Any, keys: list[tuple[int, int]],
                  out: dict[FieldKey, FieldAnswer | BaseException]) -> None:
    try:
        values = pynvml.nvmlDeviceGetFieldValues(handle, list(keys))
    except Exception as exc:  # the whole call failed (FunctionNotFound, NoPermission, ...)
        for k in keys:
            out[k] = exc
        return
    for k, fv in zip(keys, values):
        ret = int(fv.nvmlReturn)
        out[k] = (ret, _field_value(fv) if ret == NVML_SUCCESS else None)


def _gather_nvml(device: int, pci_bus_id: str | None) -> NvmlAnswers | BaseException:
    try:
        import pynvml
    except Exception as exc:  # ImportError: nvidia-ml-py not installed
        return exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission, ...
        return exc
    try:
        try:
            if pci_bus_id is None:
                raise LookupError("no PCI bus id from CUDA")
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        except Exception:
            # NVML indexes devices without CUDA_VISIBLE_DEVICES; the bus id is the safe match
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    except Exception as exc:
        _shutdown(pynvml)
        return exc
    ans = NvmlAnswers()
    try:
        try:
            ans.driver_version = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:
            ans.driver_version = exc
        fields: dict[FieldKey, FieldAnswer | BaseException] = {}
        _query_fields(pynvml, handle, [(FI_C2C_LINK_COUNT, 0)], fields)
        count = fields.get((FI_C2C_LINK_COUNT, 0))
        if isinstance(count, tuple) and count[0] == NVML_SUCCESS and int(count[1]) > 0:
            for link in range(int(count[1])):
                _query_fields(pynvml, handle, [(FI_C2C_LINK_GET_STATUS, link),
                                               (FI_C2C_LINK_GET_MAX_BW, link)], fields)
        ans.fields = fields
        for attr, fn in (("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                         ("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth")):
            try:
                setattr(ans, attr, int(getattr(pynvml, fn)(handle)))
            except Exception as exc:
                setattr(ans, attr, exc)
    finally:
        _shutdown(pynvml)
    return ans


def _shutdown(pynvml: Any) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass


def gather(device: int = 0) -> RawAnswers:
    """Ask CUDA (through CuPy) and NVML; record every answer or the exception it raised.

    Raises :class:`CudaUnavailableError` only when CUDA itself is missing (CuPy not importable,
    no driver, no device, or ``device`` out of range); NVML problems are recorded, not raised.
    """
    try:
        import cupy
    except Exception as exc:
        raise CudaUnavailableError(f"CuPy is not installed or failed to import ({_err(exc)}); "
                                   "install the 'hw' extra (cupy-cuda12x or cupy-cuda13x)") from None
    rt = cupy.cuda.runtime
    try:
        n = int(rt.getDeviceCount())
    except Exception as exc:
        raise CudaUnavailableError(f"no CUDA driver or device: cudaGetDeviceCount failed "
                                   f"({_err(exc)})") from None
    if n == 0:
        raise CudaUnavailableError("no CUDA device: cudaGetDeviceCount returned 0")
    if not 0 <= device < n:
        raise CudaUnavailableError(f"no CUDA device {device}: cudaGetDeviceCount returned {n}")
    raw = RawAnswers(device=device)
    try:
        nm = rt.getDeviceProperties(device)["name"]
        raw.name = nm.decode() if isinstance(nm, bytes) else str(nm)
    except Exception as exc:
        raw.name = exc
    attrs: dict[int, int | BaseException] = {}
    for a in ATTRS:
        try:
            attrs[a] = int(rt.deviceGetAttribute(a, device))
        except Exception as exc:
            attrs[a] = exc
    raw.attrs = attrs
    for attr, fn in (("cuda_runtime_version", rt.runtimeGetVersion),
                     ("cuda_driver_version", rt.driverGetVersion)):
        try:
            setattr(raw, attr, int(fn()))
        except Exception as exc:
            setattr(raw, attr, exc)
    try:
        bus = rt.deviceGetPCIBusId(device)
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
    except Exception:
        bus = None
    raw.nvml = _gather_nvml(device, bus)
    return raw


def detect(device: int = 0) -> Topology:
    """Detect the topology of ``device``: :func:`decide` applied to :func:`gather`."""
    return decide(gather(device))


# ---------------------------------------------------------------------------------------------
# hardware JSON for the simulator


def _preset_data(base_preset: str | Path) -> dict:
    from kvsim.errors import ConfigError
    from kvsim.hardware.spec import PRESET_DIR, preset_names

    path = Path(base_preset)
    if not path.suffix:
        path = PRESET_DIR / f"{base_preset}.json"
        if not path.exists():
            raise ConfigError(f"unknown hardware preset {str(base_preset)!r} "
                              f"(known: {', '.join(preset_names())})")
    return json.loads(path.read_text())


def to_hardware_json(topology: Topology, base_preset: str | Path = "h200-sxm",
                     path: str | Path | None = None, date: str | None = None) -> dict:
    """A hardware JSON: ``base_preset`` with the detected link, SM count and copy-engine count.

    Overwrites ``link.kind``, ``link.coherent``, ``link.detected_gbps``, ``kernel.sm_count`` and
    ``copy_engine.count`` (each with a source naming this detection) and ``name``/``gpu``/
    ``description``; every other figure (bandwidths, per-copy costs, kernel fit) stays the base
    preset's, with its own source. A figure the detection could not read keeps the base value.
    With ``path``, writes the file and checks that :func:`kvsim.hardware.load_hardware` reads it.
    """
    data = _preset_data(base_preset)
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    who = (f"kvsim detect (hw/topology.py) on {topology.name.value}, device {topology.device}, "
           f"driver {topology.driver_version.value}, {date}")
    data["name"] = f"{data.get('name', base_preset)}-detected"
    if topology.name.value:
        data["gpu"] = topology.name.value
    data["description"] = (f"Detected by {who}: link, SM count and copy-engine count from the "
                           f"device; every other figure is the '{base_preset}' preset's, not "
                           f"re-measured here. Base: {data.get('description', '')}")
    link = data["link"]
    link["kind"] = {"value": topology.link_kind.value, "source": f"{who}: {topology.link_kind.source}"}
    link["coherent"] = {"value": bool(topology.coherent.value),
                        "source": f"{who}: {topology.coherent.source}"}
    link["detected_gbps"] = {"value": float(topology.link_gbps.value),
                             "source": f"{who}: {topology.link_gbps.source}"}
    if topology.sm_count.value is not None:
        data["kernel"]["sm_count"] = {"value": int(topology.sm_count.value),
                                      "source": f"{who}: {topology.sm_count.source}"}
    if topology.async_engine_count.value is not None:
        data["copy_engine"]["count"] = {"value": int(topology.async_engine_count.value),
                                        "source": f"{who}: {topology.async_engine_count.source}"}
    if path is not None:
        from kvsim.hardware import load_hardware

        p = Path(path)
        p.write_text(json.dumps(data, indent=1) + "\n")
        load_hardware(p)  # raises ConfigError naming the field if the result is not loadable
    return data
