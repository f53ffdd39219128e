"""The scenario schema: the loaded YAML validated into frozen dataclasses.

The schema is declarative (:mod:`kvsim.validation`): each block is a dataclass whose fields carry
their types, bounds and defaults (the workload kinds' own in :mod:`kvsim.workloads`); rules that
span fields (capacity >= history, a request that fits on the GPU level, ...) follow in code.

Every rejection names the file, the line and the field (``scen.yaml:12: manager.levels.0.quota_bytes:
must be >= 0, got -1``), or the option that set the value (``--set seed=abc: seed: ...``; a
variant's override is blamed on its line). Unknown keys are errors, not silently ignored. What
can be known before running is checked when the file loads: every variant, the hardware and CPU
presets, the trace, sizes against the bounds of :mod:`kvsim.manager.limits`, a request that cannot
fit on the GPU level, more fillers than the GPU fill has blocks, a level that holds no page.

Schema (``*`` = required)::

    name*: str                      # also the default report directory, reports/<name>/:
                                    # 1-100 of [A-Za-z0-9_.-], starting with a letter or digit
    description: str
    question: str                   # what the run answers: its report opens with it and the answer
    seed: int >= 0                  # default 0
    executor: plan | sim | hw       # plan: manager plans only, no time; sim: the SimPy model;
                                    # hw: real threads, a real lock and real copies on a GPU
    hardware: str                   # sim: a preset (h100-pcie, h200-sxm, gh200, gb200, b200)
                                    #      or a hardware JSON file (relative to the scenario)
    cpu_model: str                  # sim: CPU cost preset or JSON file (default kvcm2-cpp)
    sim:                            # sim executor options
      lock_policy: reader | writer  # reader: glibc's default, readers may starve a writer
      copy_path: auto | select | ce-page | ce-batch | kernel
                                    # auto: KVCM2's rule in sim, the selector in hw;
                                    # select: the selector's cheapest path (both executors)
      kernel_ctas: int >= 1         # default: KVCM2's grid policy
      kernel_inflight_bytes: bytes  # default: the preset's reference depth
      aligned: bool                 # false: the alignment-agnostic kernel
      wait_for_copies: bool         # false (KVCM2): calls return after submitting copies
      gil_release: {API: bool}      # per API: does its binding release the GIL before the lock
      check_invariants: bool        # after every exclusive call (default true)
      check_lock_discipline: bool   # flag mutations made without the lock held exclusively
      schedule_seed: int            # interleaving exploration: perturb delays and event order
      jitter: float in [0, 1)       # relative perturbation of each modelled delay (default 0.1)
      gil_seed: int                 # the measured GIL hand-over's draws (default: the seed)
      disk: str                     # the disk level's drive: a preset (micron-7450-gen4,
                                    # micron-9550-gen5) or a JSON file; default: none (disk
                                    # copies are priced as CPU-GPU copies)
      disk_drives: int in [1, 64]   # drives striped together (default 1)
    manager*:
      tokens_per_block: int in [1, 65536]   # default 32
      layers*: list of
        slot_bytes*: [bytes, ...]   # one entry per buffer (e.g. K and V) per block
        window_tokens: int >= 1     # omit for full attention
        sink_tokens: int >= 0
        count: int >= 1             # repeat this layer (default 1)
      levels*: list (GPU first) of
        name*: str
        quota_bytes*: bytes         # an integer or a string such as "128 MiB"; at least one
                                    # page and at most 2**27 pages of each pool group
      max_util_for_resume: float in (0, 1]   # default 0.97 (KVCM2's)
      partial_reuse: bool                   # default true (KVCM2's)
      reuse_match_backoff: int >= 0         # tokens cut off every match (default 0)
      enable_stats: bool
      stats_commit: per_batch | per_page
      default_priority: int in [0, 100]
      probe_drains_root_erasures: bool   # the pre-fix bug (probe mutates under a shared lock)
    workload*:
      kind*: burst_resize | concurrent_probe
      # burst_resize (also the `background:` mapping of concurrent_probe):
      history_tokens*: int >= 0
      capacity_tokens: int >= history_tokens   # default history_tokens + 1
      growth_steps: int >= 1                   # resize calls to reach the target (1 = burst)
      gpu_fill_fraction: float in [0, 1]       # tier pressure: GPU filled by earlier requests
      filler_requests: int >= 1
      # concurrent_probe:
      background*: {burst_resize fields}
      probe_threads: int >= 1                  # default 8
      probes_per_thread: int >= 1              # default 500
      probe_interval_us: float >= 0            # think time between one thread's probes
      probe_tokens: int >= 1                   # tokens per probe (a filler's committed prefix)
      resize_start_us: float >= 0              # when the background resize starts
      # mooncake (timed replay of a Mooncake JSONL trace; see kvsim/workloads/mooncake.py):
      trace*: path (relative to this file)
      max_requests, time_scale, decode_step_tokens, decode_token_interval_us,
      prefill_token_interval_us, decode_resize, probe_on_arrival, client_threads, skip_bad_lines
      # op_trace (faithful replay of a JSONL op trace; format in kvsim/traces/op_trace.py):
      trace*: path, skip_bad_lines
      # serving (an engine over a Mooncake trace: queue, batching, onboarding, TTFT; see
      # kvsim/serving/engine.py):
      trace*: path, architecture*: llama-3-8b | llama-3-70b-tp8 | mistral-7b-v0.1
      engine_times, layers, first_request, max_requests, time_scale, max_batch_tokens, max_running,
      decode_commit_tokens, overlap_onboarding, skip_bad_lines
    hw:                             # hw executor options (lock policy, copy path, waits and
                                    # checks come from `sim:`)
      copier: cuda | none           # none: real threads and lock, no copies (no GPU needed)
      device: int >= 0
      verify: bool                  # sign every page and check every migrated page
      record_trace: path            # write the calls run as a JSONL op trace (for sim replay)
      warmup_runs: int >= 0         # run the scenario this many times first, discarding them, so
                                    # the measured run is a warm process (default 0: a cold one)
      warm_gpu_ms: float >= 0       # spin every SM this long right before the measured threads
                                    # start, so the GPU is out of its idle clocks (default 0)
      forward: model | torch        # a serving engine's passes: model (sleep their modelled
                                    # time) or torch (real random-weight prefills, PyTorch)
      decode_wait: sleep | spin     # forward torch: the (modelled) decode step sleeps, or
                                    # spins every SM so the GPU keeps its clocks
    expect_failures: [API, ...]     # APIs whose failed calls the scenario expects; any other
                                    # failed call makes `kvsim run` say so and exit 1
    variants:                       # optional: named runs of this scenario with overrides;
                                    # on sim and plan, one that comes out the same as a run
                                    # already made gets a copy of its results (no second run)
      NAME:
        set: {dotted.field: value}  # e.g. manager.stats_commit: per_page
        reference: {METRIC: number, source: str}   # figures to compare with (e.g. the seed's)
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from kvsim.errors import ConfigError
from kvsim.manager.config import LayerConfig, LevelConfig, ManagerConfig, StorageLayout
from kvsim.manager.limits import (
    MAX_LAYERS,
    MAX_SEQUENCE_TOKENS,
    MAX_SLOT_BYTES,
    MAX_TOKENS_PER_BLOCK,
)
from kvsim.model.path_names import PATHS
from kvsim.runtime.apis import LABELS
from kvsim.scenario.source import PathKey, Source
from kvsim.serving.engine import ServingWorkload
from kvsim.validation import (
    MAX_SEED,
    Bool,
    ByteRange,
    Bytes,
    FloatRange,
    IntRange,
    NonEmpty,
    OneOf,
    Str,
    schema,
    validate,
)
from kvsim.workloads.burst_resize import BurstResizeWorkload
from kvsim.workloads.concurrent_probe import ConcurrentProbeWorkload
from kvsim.workloads.gil_antagonist import GilAntagonistWorkload
from kvsim.workloads.mooncake import MooncakeReplayWorkload
from kvsim.workloads.op_trace import OpTraceWorkload
from kvsim.workloads.seed_concurrency import SeedConcurrencyWorkload

EXECUTORS = ("plan", "sim", "hw")
COPY_PATHS = ("auto", "select", *PATHS)
_SAFE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"  # one safe path component: it names a directory


def _safe_name(value: str) -> str:
    if not re.fullmatch(_SAFE_NAME, value):
        raise PydanticCustomError(
            "kvsim_name", "must be 1-100 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit (it names a directory), got {value}", {"value": repr(value)})
    return value


SafeName = Annotated[str, Field(strict=True), AfterValidator(_safe_name)]


def _api_label(value: str) -> str:
    if value not in LABELS:
        raise PydanticCustomError("kvsim_api", "unknown API {value} (see kvsim/runtime/apis.py)",
                                  {"value": repr(value)})
    return value


ApiLabel = Annotated[str, Field(strict=True), AfterValidator(_api_label)]


def _scope(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError("kvsim_scope", "must be an integer or a string, got {value}",
                                  {"value": repr(value)})
    return value


Scope = Annotated[Any, BeforeValidator(_scope)]
Workload = Annotated[BurstResizeWorkload | SeedConcurrencyWorkload | ConcurrentProbeWorkload
                     | GilAntagonistWorkload | MooncakeReplayWorkload | OpTraceWorkload
                     | ServingWorkload, Field(discriminator="kind")]
WORKLOADS = tuple(t.__dataclass_fields__["kind"].default for t in (
    BurstResizeWorkload, ConcurrentProbeWorkload, GilAntagonistWorkload, SeedConcurrencyWorkload,
    MooncakeReplayWorkload, OpTraceWorkload, ServingWorkload))

_DEFAULT = {f.name: f.default for f in dataclasses.fields(ManagerConfig)
            if f.default is not dataclasses.MISSING}


@schema
@dataclass(frozen=True)
class LayerSpec:
    slot_bytes: NonEmpty(ByteRange(1, MAX_SLOT_BYTES), most=64, what="list of byte counts")
    window_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) | None = None  # omit for full attention
    sink_tokens: IntRange(0, MAX_SEQUENCE_TOKENS) = 0
    count: IntRange(1, MAX_LAYERS) = 1  # repeat this layer


@schema
@dataclass(frozen=True)
class LevelSpec:
    name: Str
    quota_bytes: Bytes  # an integer or a string such as "128 MiB"


@schema
@dataclass(frozen=True)
class ManagerSpec:
    """The ``manager:`` block; its defaults are :class:`ManagerConfig`'s."""

    layers: NonEmpty(LayerSpec)
    levels: NonEmpty(LevelSpec)  # GPU first
    tokens_per_block: IntRange(1, MAX_TOKENS_PER_BLOCK) = _DEFAULT["tokens_per_block"]
    max_util_for_resume: FloatRange(0.0, 1.0, lo_open=True) = _DEFAULT["max_util_for_resume"]
    partial_reuse: Bool = _DEFAULT["partial_reuse"]
    reuse_match_backoff: IntRange(0, MAX_SEQUENCE_TOKENS) = _DEFAULT["reuse_match_backoff"]
    enable_stats: Bool = _DEFAULT["enable_stats"]
    stats_commit: OneOf("per_batch", "per_page") = _DEFAULT["stats_commit"]
    default_priority: IntRange(0, 100) = _DEFAULT["default_priority"]
    # The pre-fix bug: probe_reuse drains the root-erase queue under a shared lock.
    probe_drains_root_erasures: Bool = _DEFAULT["probe_drains_root_erasures"]


@schema
@dataclass(frozen=True)
class SimSettings:
    lock_policy: OneOf("reader", "writer") = "reader"  # reader: readers may starve a writer
    # auto: KVCM2's rule in sim, the selector in hw; select: the selector's cheapest path
    copy_path: OneOf(*COPY_PATHS) = "auto"
    kernel_ctas: IntRange(1, 1 << 16) | None = None  # None: KVCM2's grid policy
    kernel_inflight_bytes: ByteRange(1, 1 << 30) | None = None  # None: the preset's depth
    aligned: Bool = True  # false: the alignment-agnostic kernel
    wait_for_copies: Bool = False  # false (KVCM2): calls return after submitting copies
    gil_release: dict[ApiLabel, Bool] = field(default_factory=dict)  # per API
    check_invariants: Bool = True  # after every exclusive call
    check_lock_discipline: Bool = True  # flag mutations made without the lock held exclusively
    schedule_seed: IntRange(0, MAX_SEED) | None = None  # interleaving exploration
    jitter: FloatRange(0.0, 0.99) = 0.1  # relative perturbation of each modelled delay
    gil_seed: IntRange(0, MAX_SEED) | None = None  # None: the scenario's seed
    disk: Str | None = None  # the disk level's drive (kvsim/hardware/disks/), or a JSON file
    disk_drives: IntRange(1, 64) = 1  # drives striped together

    def __post_init__(self) -> None:  # hashable and ordered, as results record it
        object.__setattr__(self, "gil_release", tuple(sorted(dict(self.gil_release).items())))


@schema
@dataclass(frozen=True)
class HwSettings:
    copier: OneOf("cuda", "none") = "cuda"  # none: real threads and lock, no copies
    device: IntRange(0, 1023) = 0
    verify: Bool = False  # sign every page and check every migrated page
    record_trace: Str | None = None  # write the calls run as a JSONL op trace
    warmup_runs: IntRange(0, 100) = 0  # whole runs done first and discarded (a warm process)
    warm_gpu_ms: FloatRange(0.0, 60_000.0) = 0.0  # spin the GPU before the threads start
    forward: OneOf("model", "torch") = "model"  # a serving engine's passes: slept, or real
    decode_wait: OneOf("sleep", "spin") = "sleep"  # forward torch: the decode step's wait


@schema
@dataclass(frozen=True)
class VariantSpec:
    set: dict[Str, Any] = field(default_factory=dict)  # dotted field name -> value
    # metric -> number, plus `source:` saying where the figures come from
    reference: dict[Str, Any] = field(default_factory=dict)


@schema
@dataclass(frozen=True)
class ScenarioDoc:
    """A scenario file, as written."""

    name: SafeName  # also the default report directory, reports/<name>/
    manager: ManagerSpec
    workload: Workload
    description: Str = ""
    question: Str = ""  # what the run answers: the report opens with it and its answer
    seed: IntRange(0, MAX_SEED) = 0
    executor: OneOf(*EXECUTORS) = "plan"
    hardware: Str | None = None  # a preset name or a hardware JSON file (relative to the file)
    cpu_model: Str = "kvcm2-cpp"  # a CPU preset name or JSON file
    sim: SimSettings = field(default_factory=SimSettings)
    hw: HwSettings = field(default_factory=HwSettings)
    variants: dict[SafeName, VariantSpec | None] | None = None
    expect_failures: tuple[ApiLabel, ...] = ()  # APIs whose failed calls are expected


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[tuple[str, object], ...]
    reference: tuple[tuple[str, float], ...]
    reference_source: str


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    executor: str
    manager: ManagerConfig
    workload: Any  # one of the workload kinds' dataclasses
    source_file: str
    hardware: str | None = None
    cpu_model: str = "kvcm2-cpp"
    question: str = ""
    sim: SimSettings = SimSettings()
    hw: HwSettings = HwSettings()
    variants: tuple[Variant, ...] = ()
    # APIs whose failed calls the scenario expects (a bug reproduction, a deliberate overload);
    # any other failed call makes `kvsim run` say so and exit non-zero.
    expect_failures: tuple[str, ...] = ()


# -- rules that span fields ----------------------------------------------------------------------
def _manager_config(spec: ManagerSpec, source: Source) -> ManagerConfig:
    where = ("manager",)
    layers: list[LayerConfig] = []
    for i, layer in enumerate(spec.layers):
        if layer.window_tokens is None and layer.sink_tokens:
            raise source.error(where + ("layers", i, "sink_tokens"),
                               "only sliding-window layers (window_tokens set) have sinks")
        layers += [LayerConfig(tuple(layer.slot_bytes), layer.window_tokens,
                               layer.sink_tokens)] * layer.count
        if len(layers) > MAX_LAYERS:
            raise source.error(where + ("layers",),
                               f"at most {MAX_LAYERS} layers in all (kvsim.manager.limits)")
    if len(spec.levels) > 3:
        raise source.error(where + ("levels",),
                           f"at most 3 levels (gpu, host, disk), got {len(spec.levels)}")
    names = [lv.name for lv in spec.levels]
    for i, name in enumerate(names):
        if not name or name in names[:i]:
            raise source.error(where + ("levels",),
                               f"level names must be unique and non-empty, got {names}")
    options = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
               if f.name not in ("layers", "levels")}
    try:
        config = ManagerConfig(layers=tuple(layers), levels=tuple(LevelConfig(lv.name, lv.quota_bytes)
                                                                  for lv in spec.levels),
                               **options)
        layout = StorageLayout.from_config(config)
    except ConfigError as e:  # what the fields above cannot see alone (a quota's page count)
        raise source.error(where + ("levels",), str(e)) from None
    for level, row in enumerate(layout.level_slots):
        for g, slots in enumerate(row):
            if slots == 0:
                raise source.error(where + ("levels", level, "quota_bytes"),
                                   f"level {names[level]!r} holds no page of pool group {g} "
                                   f"({layout.pool_groups[g].page_bytes} bytes per page); every "
                                   "level must hold at least one (leave a level out to have none)")
    return config


def _resolve(value: str, source: Source) -> str:
    """A preset name stays a name; a path is taken relative to the scenario file."""
    if not value.endswith(".json"):
        return value
    path = Path(value)
    if not path.is_absolute():
        path = Path(source.filename).parent / path
    return str(path)


def _trace(workload: Any, source: Source) -> tuple[Any, Any]:
    """A trace path relative to the scenario file (absolute paths as given): it must be a file
    and read cleanly, so a bad line is reported before the run starts. Returns the workload
    with the resolved path, and the trace as read (for the checks that need it)."""
    from kvsim.traces.mooncake import load_mooncake
    from kvsim.traces.op_trace import load_op_trace

    where = ("workload", "trace")
    path = Path(workload.trace)
    if not path.is_absolute():
        path = Path(source.filename).parent / path
    if not path.exists():
        raise source.error(where, f"no such file: {path}")
    if not path.is_file():
        raise source.error(where, f"not a file: {path}")
    load = (load_op_trace if isinstance(workload, OpTraceWorkload) else load_mooncake)
    try:
        trace = load(str(path), workload.skip_bad_lines)
    except ConfigError as e:
        raise source.error(where, str(e)) from None
    return dataclasses.replace(workload, trace=str(path)), trace


def _check_burst(source: Source, path: PathKey, config: ManagerConfig,
                 burst: BurstResizeWorkload) -> None:
    """What a burst can be known to fail at, before running it: capacity below history, a
    request whose pages cannot all be on the GPU level at once, more fillers than the GPU fill
    has blocks."""
    if burst.capacity_tokens < burst.history_tokens:
        raise source.error(path + ("capacity_tokens",),
                           f"must be >= history_tokens ({burst.history_tokens}), got "
                           f"{burst.capacity_tokens}")
    layout = StorageLayout.from_config(config)
    tpb = layout.tokens_per_block
    blocks = -(-burst.capacity_tokens // tpb)
    for g, pg in enumerate(layout.pool_groups):
        need = 0
        for lc_index in pg.life_cycles:
            begin, end = layout.life_cycles[lc_index].stale_range(burst.history_tokens, tpb)
            need += blocks - (end - begin)
        have = layout.level_slots[0][g]
        if need > have:
            raise source.error(path + ("capacity_tokens",),
                               f"a cache of {burst.capacity_tokens} tokens (history "
                               f"{burst.history_tokens}) needs {need} pages of pool group {g} on "
                               f"the GPU level at once, which holds {have}: the growth cannot "
                               "succeed")
    fill_blocks = min(slots // len(pg.life_cycles)
                      for slots, pg in zip(layout.level_slots[0], layout.pool_groups))
    wanted = math.floor(fill_blocks * burst.gpu_fill_fraction)
    if wanted and burst.filler_requests > wanted:
        raise source.error(path + ("filler_requests",),
                           f"{burst.filler_requests} fillers cannot share the {wanted} blocks of "
                           f"a {burst.gpu_fill_fraction:.0%} GPU fill (each needs at least one); "
                           f"at most {wanted}")


def _check_workload(source: Source, config: ManagerConfig, workload: Any, trace: Any) -> None:
    """Rules that need both the manager configuration and the workload (and its trace, read
    by :func:`_trace`, or None)."""
    if isinstance(workload, BurstResizeWorkload):
        _check_burst(source, ("workload",), config, workload)
    elif isinstance(workload, ConcurrentProbeWorkload):  # seed_concurrency is one too
        _check_burst(source, ("workload", "background"), config, workload.background)
    elif isinstance(workload, ServingWorkload):
        _check_serving(source, config, workload, trace)


def _check_serving(source: Source, config: ManagerConfig, workload: ServingWorkload,
                   trace: Any) -> None:
    """The manager holds the architecture's KV cache; the engine times exist for it."""
    from kvsim.llm.engine_time import load_engine_times
    from kvsim.serving.engine import check_layout, serving_architecture

    arch = serving_architecture(workload)
    try:
        check_layout(config, arch)
    except ConfigError as e:
        raise source.error(("manager", "layers"), str(e)) from None
    try:
        load_engine_times(workload.engine_times, arch)
    except (ConfigError, ValueError) as e:
        raise source.error(("workload", "engine_times"), str(e)) from None
    from kvsim.serving.engine import load_requests

    try:
        load_requests(workload, trace)
    except ConfigError as e:
        raise source.error(("workload", "first_request"), str(e)) from None


def _variants(doc: ScenarioDoc, source: Source) -> tuple[Variant, ...]:
    if doc.variants is None:
        return ()
    if not doc.variants:
        raise source.error(("variants",), "must be a non-empty mapping of variant names")
    out = []
    for name, body in doc.variants.items():
        body = body or VariantSpec()
        ref = dict(body.reference)
        ref_source = ref.pop("source", "")
        if ref and not ref_source:
            raise source.error(("variants", name, "reference"),
                               "needs a 'source' saying where the figures come from")
        for metric, value in ref.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise source.error(("variants", name, "reference", metric),
                                   "must be a finite number")
        out.append(Variant(name, tuple(body.set.items()),
                           tuple((k, float(v)) for k, v in ref.items()), str(ref_source)))
    return tuple(out)


def _preset(source: Source, key: str, value: str, loader) -> None:
    """A hardware, CPU or disk preset must load (a name that exists, a file that parses);
    ``key`` is the field's dotted name."""
    try:
        loader(value)
    except (ConfigError, OSError, ValueError) as e:
        raise source.error(tuple(key.split(".")), str(e)) from None


def parse_scenario(data: Any, source: Source) -> Scenario:
    """Validate a loaded scenario file; raises ScenarioError at the first problem."""
    doc = validate(ScenarioDoc, data, source.error)
    if doc.executor in ("sim", "hw") and doc.hardware is None:
        raise source.error(("hardware",),
                           f"the {doc.executor} executor needs a hardware preset or file")
    hardware = None
    if doc.hardware is not None:
        from kvsim.hardware import load_hardware

        hardware = _resolve(doc.hardware, source)
        _preset(source, "hardware", hardware, load_hardware)
    cpu_model = _resolve(doc.cpu_model, source)
    if doc.executor == "sim":
        from kvsim.model.cpu_cost import load_cpu_model

        _preset(source, "cpu_model", cpu_model, load_cpu_model)
    manager = _manager_config(doc.manager, source)
    sim = doc.sim
    if sim.disk is not None:
        from kvsim.hardware.disk import load_disk

        sim = dataclasses.replace(sim, disk=_resolve(sim.disk, source))
        _preset(source, "sim.disk", sim.disk, load_disk)
        if len(manager.levels) < 3:
            raise source.error(("sim", "disk"), f"a disk is given but manager.levels has "
                               f"{len(manager.levels)} levels; the disk is level 3 (gpu, host, disk)")
    workload, trace = doc.workload, None
    if isinstance(workload, (MooncakeReplayWorkload, OpTraceWorkload, ServingWorkload)):
        workload, trace = _trace(workload, source)
    if isinstance(workload, ServingWorkload) and workload.engine_times.endswith(".json"):
        workload = dataclasses.replace(workload, engine_times=_resolve(workload.engine_times,
                                                                        source))
    _check_workload(source, manager, workload, trace)
    if doc.hw.forward == "torch" and not isinstance(workload, ServingWorkload):
        raise source.error(("hw", "forward"), "torch runs a serving engine's passes; this "
                           f"workload is {workload.kind}")
    return Scenario(
        name=doc.name, description=doc.description, question=doc.question, seed=doc.seed,
        executor=doc.executor,
        manager=manager, workload=workload, source_file=source.filename, hardware=hardware,
        cpu_model=cpu_model, sim=sim, hw=doc.hw, variants=_variants(doc, source),
        expect_failures=doc.expect_failures)
