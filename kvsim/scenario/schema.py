"""The scenario schema: validation of loaded YAML into frozen dataclasses.

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
      max_util_for_resume: float in (0, 1]
      partial_reuse: bool
      enable_stats: bool
      stats_commit: per_batch | per_page
      default_priority: int in [0, 100]
      reuse_scopes: [scope, ...]    # declared reuse scopes (default [0])
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
    expect_failures: [API, ...]     # APIs whose failed calls the scenario expects; any other
                                    # failed call makes `kvsim run` say so and exit 1
    variants:                       # optional: named runs of this scenario with overrides
      NAME:
        set: {dotted.field: value}  # e.g. manager.stats_commit: per_page
        reference: {METRIC: number, source: str}   # figures to compare with (e.g. the seed's)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kvsim.errors import ConfigError
from kvsim.manager.config import LayerConfig, LevelConfig, ManagerConfig, StorageLayout
from kvsim.manager.limits import (
    MAX_LAYERS,
    MAX_SEQUENCE_TOKENS,
    MAX_SLOT_BYTES,
    MAX_TOKENS_PER_BLOCK,
)
from kvsim.scenario.source import PathKey, Source
from kvsim.workloads.burst_resize import BurstResizeWorkload
from kvsim.workloads.concurrent_probe import ConcurrentProbeWorkload
from kvsim.workloads.gil_antagonist import GilAntagonistWorkload
from kvsim.workloads.mooncake import MooncakeReplayWorkload
from kvsim.workloads.op_trace import OpTraceWorkload
from kvsim.workloads.seed_concurrency import SeedConcurrencyWorkload

_REQUIRED = object()
MAX_BYTES = 1 << 62  # any byte count (sizes are also bounded by kvsim.manager.limits)
MAX_COUNT = 10**7  # threads' call counts (probes, queries, iterations): a run of days at most
MAX_THREADS = 1024
MAX_SEED = 2**63 - 1
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
EXECUTORS = ("plan", "sim", "hw")
WORKLOADS = ("burst_resize", "concurrent_probe", "gil_antagonist", "seed_concurrency", "mooncake",
             "op_trace")
COPY_PATHS = ("auto", "select", "ce-page", "ce-batch", "kernel")


class Fields:
    """Typed, located access to one mapping of the scenario."""

    def __init__(self, data: Any, source: Source, path: PathKey, allowed: set[str]) -> None:
        if not isinstance(data, dict):
            raise source.error(path, f"must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - allowed)
        if unknown:
            raise source.error(path + (unknown[0],),
                               f"unknown key (allowed: {', '.join(sorted(allowed))})")
        self.data, self.source, self.path = data, source, path

    def error(self, key: str | int | tuple, message: str) -> ConfigError:
        """An error at ``key`` (or a tuple of keys below this mapping)."""
        return self.source.error(self.path + (key if isinstance(key, tuple) else (key,)), message)

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise self.source.error(self.path + (key,), "required field is missing")
            return default
        return self.data[key]

    def int(self, key: str, default: Any = _REQUIRED, minimum: int = 0,
            maximum: int = MAX_SEED) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if value < minimum or value > maximum:
            bound = (f"in [{minimum}, 2**63)" if value > maximum else f">= {minimum}") \
                if maximum == MAX_SEED else f"in [{minimum}, {maximum}]"
            raise self.error(key, f"must be {bound}, got {value}")
        return value

    def float(self, key: str, default: Any, low: float, high: float,
              low_open: bool = False) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise self.error(key, f"must be a finite number, got {value!r}")
        if value > high or value < low or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise self.error(key, f"must be in {bracket}{low}, {high}], got {value}")
        return float(value)

    def bool(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def str(self, key: str, default: Any = _REQUIRED, choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def size(self, key: str | int, value: Any) -> int:
        """Bytes from an integer or a string like ``"16 KiB"``."""
        if isinstance(value, str):
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
            if not m or m.group(2).lower() not in _UNITS:
                raise self.error(key, f"must be a byte count such as 4096 or '16 KiB', got {value!r}")
            number = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if number != int(number):
                raise self.error(key, f"{value!r} is not a whole number of bytes")
            value = int(number)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be a byte count, got {value!r}")
        if value < 0:
            raise self.error(key, f"must be >= 0, got {value}")
        if value > MAX_BYTES:
            raise self.error(key, f"must be at most 2**62 bytes, got {value}")
        return value

    def sub(self, key: str, allowed: set[str]) -> Fields:
        return Fields(self.raw(key), self.source, self.path + (key,), allowed)

    def items(self, key: str, allowed: set[str]) -> list[Fields]:
        value = self.raw(key)
        if not isinstance(value, list) or not value:
            raise self.error(key, "must be a non-empty list")
        return [Fields(v, self.source, self.path + (key, i), allowed) for i, v in enumerate(value)]


@dataclass(frozen=True)
class SimSettings:
    lock_policy: str = "reader"
    copy_path: str = "auto"
    kernel_ctas: int | None = None
    kernel_inflight_bytes: int | None = None
    aligned: bool = True
    wait_for_copies: bool = False
    gil_release: tuple[tuple[str, bool], ...] = ()
    check_invariants: bool = True
    check_lock_discipline: bool = True
    schedule_seed: int | None = None
    jitter: float = 0.1
    gil_seed: int | None = None  # None: the scenario's seed


@dataclass(frozen=True)
class HwSettings:
    copier: str = "cuda"
    device: int = 0
    verify: bool = False
    record_trace: str | None = None
    warmup_runs: int = 0  # whole runs done first and discarded (a warm process)
    warm_gpu_ms: float = 0.0  # spin the GPU this long right before the threads start


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
    workload: BurstResizeWorkload | ConcurrentProbeWorkload | GilAntagonistWorkload | SeedConcurrencyWorkload
    source_file: str
    hardware: str | None = None
    cpu_model: str = "kvcm2-cpp"
    sim: SimSettings = SimSettings()
    hw: HwSettings = HwSettings()
    variants: tuple[Variant, ...] = ()
    # APIs whose failed calls the scenario expects (a bug reproduction, a deliberate overload);
    # any other failed call makes `kvsim run` say so and exit non-zero.
    expect_failures: tuple[str, ...] = ()


def _manager(f: Fields) -> ManagerConfig:
    layers: list[LayerConfig] = []
    for lf in f.items("layers", {"slot_bytes", "window_tokens", "sink_tokens", "count"}):
        raw_slots = lf.raw("slot_bytes")
        if not isinstance(raw_slots, list) or not raw_slots:
            raise lf.error("slot_bytes", "must be a non-empty list of byte counts")
        if len(raw_slots) > 64:
            raise lf.error("slot_bytes", f"at most 64 buffers per layer, got {len(raw_slots)}")
        slots = tuple(Fields.size(lf, "slot_bytes", s) for s in raw_slots)
        if any(s == 0 or s > MAX_SLOT_BYTES for s in slots):
            raise lf.error("slot_bytes", f"every slot must be 1 byte to 1 GiB, got {list(slots)}")
        window = lf.raw("window_tokens", None)
        if window is not None:
            window = lf.int("window_tokens", minimum=1, maximum=MAX_SEQUENCE_TOKENS)
        sinks = lf.int("sink_tokens", 0, maximum=MAX_SEQUENCE_TOKENS)
        if window is None and sinks:
            raise lf.error("sink_tokens", "only sliding-window layers (window_tokens set) have sinks")
        layers += [LayerConfig(slots, window, sinks)] * lf.int("count", 1, minimum=1,
                                                              maximum=MAX_LAYERS)
        if len(layers) > MAX_LAYERS:
            raise f.error("layers", f"at most {MAX_LAYERS} layers in all (kvsim.manager.limits)")
    levels = []
    for vf in f.items("levels", {"name", "quota_bytes"}):
        levels.append(LevelConfig(vf.str("name"), vf.size("quota_bytes", vf.raw("quota_bytes"))))
    if len(levels) > 3:
        raise f.error("levels", f"at most 3 levels (gpu, host, disk), got {len(levels)}")
    names = [lv.name for lv in levels]
    for i, name in enumerate(names):
        if not name or name in names[:i]:
            raise f.error("levels", f"level names must be unique and non-empty, got {names}")
    options = dict(
        tokens_per_block=f.int("tokens_per_block", 32, minimum=1, maximum=MAX_TOKENS_PER_BLOCK),
        max_util_for_resume=f.float("max_util_for_resume", 0.97, 0.0, 1.0, low_open=True),
        partial_reuse=f.bool("partial_reuse", False),
        enable_stats=f.bool("enable_stats", True),
        stats_commit=f.str("stats_commit", "per_batch", ("per_batch", "per_page")),
        default_priority=f.int("default_priority", 35, maximum=100),
        reuse_scopes=_scopes(f),
        probe_drains_root_erasures=f.bool("probe_drains_root_erasures", False),
    )
    try:
        config = ManagerConfig(layers=tuple(layers), levels=tuple(levels), **options)
        layout = StorageLayout.from_config(config)
    except ConfigError as e:  # what the fields above cannot see alone (a quota's page count)
        raise f.error("levels", str(e)) from None
    for level, row in enumerate(layout.level_slots):
        for g, slots in enumerate(row):
            if slots == 0:
                raise f.error(("levels", level, "quota_bytes"),
                              f"level {names[level]!r} holds no page of pool group {g} "
                              f"({layout.pool_groups[g].page_bytes} bytes per page); every level "
                              "must hold at least one (leave a level out to have none)")
    return config


def _scopes(f: Fields) -> tuple:
    raw = f.raw("reuse_scopes", [0])
    if not isinstance(raw, list) or not raw or not all(
            isinstance(x, (int, str)) and not isinstance(x, bool) for x in raw):
        raise f.error("reuse_scopes", "must be a non-empty list of integers or strings")
    if len(set(raw)) != len(raw):
        raise f.error("reuse_scopes", f"scopes must be unique, got {raw}")
    if len(raw) > 4096:
        raise f.error("reuse_scopes", f"at most 4096 scopes, got {len(raw)}")
    return tuple(raw)


def _burst(f: Fields) -> BurstResizeWorkload:
    history = f.int("history_tokens", maximum=MAX_SEQUENCE_TOKENS)
    capacity = f.int("capacity_tokens", min(history + 1, MAX_SEQUENCE_TOKENS),
                     maximum=MAX_SEQUENCE_TOKENS)
    if capacity < history:
        raise f.error("capacity_tokens", f"must be >= history_tokens ({history}), got {capacity}")
    return BurstResizeWorkload(
        history_tokens=history,
        capacity_tokens=capacity,
        growth_steps=f.int("growth_steps", 1, minimum=1, maximum=100_000),
        gpu_fill_fraction=f.float("gpu_fill_fraction", 1.0, 0.0, 1.0),
        filler_requests=f.int("filler_requests", 4, minimum=1, maximum=100_000),
    )


BURST_KEYS = {"history_tokens", "capacity_tokens", "growth_steps", "gpu_fill_fraction",
              "filler_requests"}
PROBE_KEYS = {"background", "probe_threads", "probes_per_thread", "probe_interval_us",
              "probe_tokens", "resize_start_us"}


GIL_KEYS = {"iterations", "setter_calls", "tokens", "priority", "victim_start_us"}
MOONCAKE_KEYS = {"trace", "max_requests", "time_scale", "decode_step_tokens",
                 "decode_token_interval_us", "prefill_token_interval_us", "decode_resize",
                 "probe_on_arrival", "client_threads", "skip_bad_lines"}
OP_TRACE_KEYS = {"trace", "skip_bad_lines"}
SEED_KEYS = PROBE_KEYS | {"stats_queries", "stats_interval_us", "drop_tokens"}


def _probe(f: Fields) -> ConcurrentProbeWorkload:
    return ConcurrentProbeWorkload(
        background=_burst(f.sub("background", BURST_KEYS)),
        probe_threads=f.int("probe_threads", 8, minimum=1, maximum=MAX_THREADS),
        probes_per_thread=f.int("probes_per_thread", 500, minimum=1, maximum=MAX_COUNT),
        probe_interval_us=f.float("probe_interval_us", 0.0, 0.0, 1e9),
        probe_tokens=f.int("probe_tokens", 4096, minimum=1, maximum=MAX_SEQUENCE_TOKENS),
        resize_start_us=f.float("resize_start_us", 100.0, 0.0, 1e12),
    )


def _workload(data: object, source: Source):
    kind = Fields(data, source, ("workload",),
                  {"kind"} | BURST_KEYS | SEED_KEYS | GIL_KEYS | MOONCAKE_KEYS).str(
        "kind", choices=WORKLOADS)
    if kind == "mooncake":
        f = Fields(data, source, ("workload",), {"kind"} | MOONCAKE_KEYS)
        threads = f.raw("client_threads", None)
        try:
            workload = MooncakeReplayWorkload(
                trace=_trace_path(f, source),
                max_requests=None if f.raw("max_requests", None) is None
                else f.int("max_requests", minimum=1),
                time_scale=f.float("time_scale", 1.0, 0.0, 1e9),
                decode_step_tokens=f.int("decode_step_tokens", 32, minimum=1,
                                         maximum=MAX_SEQUENCE_TOKENS),
                decode_token_interval_us=f.float("decode_token_interval_us", 20000.0, 0.0, 1e12),
                prefill_token_interval_us=f.float("prefill_token_interval_us", 0.0, 0.0, 1e12),
                decode_resize=f.bool("decode_resize", True),
                probe_on_arrival=f.bool("probe_on_arrival", True),
                client_threads=None if threads is None
                else f.int("client_threads", minimum=1, maximum=MAX_THREADS),
                skip_bad_lines=f.bool("skip_bad_lines", False))
        except ConfigError as e:
            raise f.error("kind", str(e)) from None
        from kvsim.traces.mooncake import load_mooncake

        _check_trace(f, load_mooncake, workload.trace, workload.skip_bad_lines)
        return workload
    if kind == "op_trace":
        f = Fields(data, source, ("workload",), {"kind"} | OP_TRACE_KEYS)
        workload = OpTraceWorkload(trace=_trace_path(f, source),
                                   skip_bad_lines=f.bool("skip_bad_lines", False))
        from kvsim.traces.op_trace import load_op_trace

        _check_trace(f, load_op_trace, workload.trace, workload.skip_bad_lines)
        return workload
    if kind == "burst_resize":
        return _burst(Fields(data, source, ("workload",), {"kind"} | BURST_KEYS))
    if kind == "concurrent_probe":
        return _probe(Fields(data, source, ("workload",), {"kind"} | PROBE_KEYS))
    if kind == "gil_antagonist":
        f = Fields(data, source, ("workload",), {"kind"} | GIL_KEYS)
        return GilAntagonistWorkload(
            iterations=f.int("iterations", 50, minimum=1, maximum=MAX_COUNT),
            setter_calls=f.int("setter_calls", 50, minimum=1, maximum=MAX_COUNT),
            tokens=f.int("tokens", 64, minimum=1, maximum=MAX_SEQUENCE_TOKENS),
            priority=f.int("priority", 50, maximum=100),
            victim_start_us=f.float("victim_start_us", 1.0, 0.0, 1e12))
    f = Fields(data, source, ("workload",), {"kind"} | SEED_KEYS)
    return SeedConcurrencyWorkload(
        probes=_probe(f),
        stats_queries=f.int("stats_queries", 50, minimum=1, maximum=MAX_COUNT),
        stats_interval_us=f.float("stats_interval_us", 20.0, 0.0, 1e9),
        drop_tokens=f.int("drop_tokens", 256, minimum=1, maximum=MAX_SEQUENCE_TOKENS))


def _trace_path(f: Fields, source: Source) -> str:
    """A trace path relative to the scenario file (absolute paths as given); it must exist."""
    from pathlib import Path

    raw = f.str("trace")
    path = Path(raw)
    if not path.is_absolute():
        path = Path(source.filename).parent / path
    if not path.exists():
        raise f.error("trace", f"no such file: {path}")
    if not path.is_file():
        raise f.error("trace", f"not a file: {path}")
    return str(path)


def _check_trace(f: Fields, load, path: str, skip_bad_lines: bool) -> None:
    """Read the trace once at load, so a bad line is reported before the run starts."""
    try:
        load(path, skip_bad_lines)
    except ConfigError as e:
        raise f.error("trace", str(e)) from None


def _check_burst_fits(source: Source, path: tuple, config: ManagerConfig,
                      burst: BurstResizeWorkload) -> None:
    """What a burst can be known to fail at, before running it: a request whose pages cannot
    all be on the GPU level at once, and more fillers than the GPU fill has blocks."""
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


def _check_workload(source: Source, config: ManagerConfig, workload: object) -> None:
    """Rules that need both the manager configuration and the workload."""
    if 0 not in config.reuse_scopes and not isinstance(workload, (OpTraceWorkload,)):
        raise source.error(("manager", "reuse_scopes"),
                           f"the {workload.kind} workload uses reuse scope 0, which "
                           f"{list(config.reuse_scopes)} does not declare")
    if isinstance(workload, BurstResizeWorkload):
        _check_burst_fits(source, ("workload",), config, workload)
    elif isinstance(workload, ConcurrentProbeWorkload):
        _check_burst_fits(source, ("workload", "background"), config, workload.background)
    elif isinstance(workload, SeedConcurrencyWorkload):
        _check_burst_fits(source, ("workload", "background"), config, workload.probes.background)


def _sim(f: Fields) -> SimSettings:
    gil = f.raw("gil_release", {})
    if not isinstance(gil, dict):
        raise f.error("gil_release", "must be a mapping of API name to true/false")
    from kvsim.runtime.apis import LABELS

    for api, flag in gil.items():
        if api not in LABELS:
            raise f.error("gil_release", f"unknown API {api!r} (see kvsim/runtime/apis.py)")
        if not isinstance(flag, bool):
            raise f.error("gil_release", f"{api}: must be true or false, got {flag!r}")
    inflight = f.raw("kernel_inflight_bytes", None)
    ctas = f.raw("kernel_ctas", None)
    if inflight is not None and not 1 <= f.size("kernel_inflight_bytes", inflight) <= 1 << 30:
        raise f.error("kernel_inflight_bytes", f"must be 1 byte to 1 GiB, got {inflight!r}")
    return SimSettings(
        lock_policy=f.str("lock_policy", "reader", ("reader", "writer")),
        copy_path=f.str("copy_path", "auto", COPY_PATHS),
        kernel_ctas=None if ctas is None else f.int("kernel_ctas", minimum=1, maximum=1 << 16),
        kernel_inflight_bytes=None if inflight is None else f.size("kernel_inflight_bytes", inflight),
        aligned=f.bool("aligned", True),
        wait_for_copies=f.bool("wait_for_copies", False),
        gil_release=tuple(sorted(gil.items())),
        check_invariants=f.bool("check_invariants", True),
        check_lock_discipline=f.bool("check_lock_discipline", True),
        schedule_seed=None if f.raw("schedule_seed", None) is None else f.int("schedule_seed"),
        jitter=f.float("jitter", 0.1, 0.0, 0.99),
        gil_seed=None if f.raw("gil_seed", None) is None else f.int("gil_seed"),
    )


def _variants(data: object, source: Source) -> tuple[Variant, ...]:
    if data is None:
        return ()
    if not isinstance(data, dict) or not data:
        raise source.error(("variants",), "must be a non-empty mapping of variant names")
    out = []
    for name, body in data.items():
        if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
            raise source.error(("variants", name), "a variant name must be letters, digits, '_', "
                               "'-' or '.', starting with a letter or digit (it names a directory)")
        f = Fields(body if body is not None else {}, source, ("variants", name), {"set", "reference"})
        overrides = f.raw("set", {})
        if not isinstance(overrides, dict):
            raise f.error("set", "must be a mapping of dotted field names to values")
        ref = f.raw("reference", {})
        if not isinstance(ref, dict):
            raise f.error("reference", "must be a mapping of metric names to numbers")
        ref = dict(ref)
        ref_source = ref.pop("source", "")
        if ref and not ref_source:
            raise f.error("reference", "needs a 'source' saying where the figures come from")
        for metric, value in ref.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise source.error(("variants", name, "reference", metric), "must be a finite number")
        out.append(Variant(str(name), tuple(overrides.items()),
                           tuple((k, float(v)) for k, v in ref.items()), str(ref_source)))
    return tuple(out)


# One safe path component: it names a directory (reports/<name>/, variants/<name>/).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def _expect_failures(f: Fields) -> tuple[str, ...]:
    from kvsim.runtime.apis import LABELS

    raw = f.raw("expect_failures", [])
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise f.error("expect_failures", "must be a list of API names such as KvCache.resize")
    for api in raw:
        if api not in LABELS:
            raise f.error("expect_failures", f"unknown API {api!r} (see kvsim/runtime/apis.py)")
    return tuple(raw)


def _preset(top: Fields, key: str, value: str, loader) -> None:
    """A hardware or CPU preset must load (a name that exists, a file that parses)."""
    try:
        loader(value)
    except (ConfigError, OSError, ValueError) as e:
        raise top.error(key, str(e)) from None


def parse_scenario(data: Any, source: Source) -> Scenario:
    top = Fields(data, source, (), {"name", "description", "seed", "executor", "manager",
                                    "workload", "hardware", "cpu_model", "sim", "hw", "variants",
                                    "expect_failures"})
    name = top.str("name")
    if not SAFE_NAME.fullmatch(name):
        raise top.error("name", "must be 1-100 letters, digits, '_', '-' or '.', starting with a "
                        f"letter or digit (it names the report directory), got {name!r}")
    executor = top.str("executor", "plan", EXECUTORS)
    hardware = top.raw("hardware", None)
    if executor in ("sim", "hw") and hardware is None:
        raise top.error("hardware", f"the {executor} executor needs a hardware preset or file")
    if hardware is not None:
        hardware = _resolve(top.str("hardware"), source)
        from kvsim.hardware import load_hardware

        _preset(top, "hardware", hardware, load_hardware)
    cpu_model = _resolve(top.str("cpu_model", "kvcm2-cpp"), source)
    if executor == "sim":
        from kvsim.model.cpu_cost import load_cpu_model

        _preset(top, "cpu_model", cpu_model, load_cpu_model)
    manager = _manager(top.sub("manager", {
        "tokens_per_block", "layers", "levels", "max_util_for_resume", "partial_reuse",
        "enable_stats", "stats_commit", "default_priority", "reuse_scopes",
        "probe_drains_root_erasures"}))
    workload = _workload(top.raw("workload"), source)
    _check_workload(source, manager, workload)
    return Scenario(
        name=name,
        description=top.str("description", ""),
        seed=top.int("seed", 0),
        executor=executor,
        manager=manager,
        workload=workload,
        source_file=source.filename,
        hardware=hardware,
        cpu_model=cpu_model,
        sim=_sim(top.sub("sim", set(SimSettings.__dataclass_fields__)))
        if top.raw("sim", None) is not None else SimSettings(),
        hw=_hw(top.sub("hw", {"copier", "device", "verify", "record_trace", "warmup_runs",
                              "warm_gpu_ms"}))
        if top.raw("hw", None) is not None else HwSettings(),
        variants=_variants(top.raw("variants", None), source),
        expect_failures=_expect_failures(top),
    )


def _hw(f: Fields) -> HwSettings:
    return HwSettings(copier=f.str("copier", "cuda", ("cuda", "none")),
                      device=f.int("device", 0, maximum=1023), verify=f.bool("verify", False),
                      record_trace=f.raw("record_trace", None) and f.str("record_trace"),
                      warmup_runs=f.int("warmup_runs", 0, maximum=100),
                      warm_gpu_ms=f.float("warm_gpu_ms", 0.0, 0.0, 60_000.0))


def _resolve(value: str, source: Source) -> str:
    """A preset name stays a name; a path is taken relative to the scenario file."""
    from pathlib import Path

    if not value.endswith(".json"):
        return value
    path = Path(value)
    if not path.is_absolute():
        path = Path(source.filename).parent / path
    return str(path)
