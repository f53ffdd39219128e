"""Sweep definitions: which scenario files, which parameters, how to draw the points.

A sweep is one or more *parts*; each part is a scenario file plus its parameters (dotted scenario
fields, the keys of ``--set``, each with a list of values) and how to draw its points. From the
command line there is one part: ``kvsim sweep SCENARIO --param KEY=V1,V2 ...`` (the file's
``sweep:`` block, if any, is then ignored). Without ``--param`` the block is read::

    sweep:
      seed: 0                     # the sweep seed; per-point seeds derive from it (default 0)
      method: grid                # grid | random | lhs
      sample: 12                  # random / lhs: the number of points to draw
      set: {sim.jitter: 0.1}      # fixed overrides for every point of this file
      params:                     # this file's parameters: {dotted.field: [values]}
        hardware: [h100-pcie, h200-sxm, gh200]
        sim.copy_path: [auto, select]
      parts:                      # more scenario files swept into the same table
        - scenario: other.yaml    # relative to this file
          params: {sim.lock_policy: [reader, writer]}
          method: lhs             # optional: method, sample and set as above
          sample: 4
          set: {}

``--method``/``--sample`` on the command line replace every part's (a sample is drawn from each
part's grid); ``--seed`` replaces the block's seed; ``--set`` adds to every part's overrides.

The ``sweep:`` block is not part of the scenario schema: :func:`load_sweep_scenario` strips it
before validation (so ``kvsim run`` rejects such a file; run it with ``kvsim sweep``). A sweep
ignores the scenario's ``variants:``; sweep the fields they set instead.

A point's identity includes a hash of its scenario's content (the loaded data with the
``sweep:`` block removed), so editing a scenario invalidates its finished points while widening
the sweep block does not.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.errors import KvsimError
from kvsim.scenario.load import ScenarioFile
from kvsim.scenario.schema import parse_scenario
from kvsim.scenario.source import ScenarioError, Source, apply_overrides, load_yaml
from kvsim.validation import MAX_SEED, IntRange, OneOf, Str, schema, validate

METHODS = ("grid", "random", "lhs")

# Columns of the table that a parameter may not be named after (parameters are named by their
# dotted key; these are the table's own columns).
RESERVED_COLUMNS = {
    "point_id", "scenario", "point_seed", "status", "error", "params", "scenario_hash",
    "scenario_file", "wall_s",
}


class SweepError(KvsimError):
    """A sweep definition or command line is invalid."""


@dataclass(frozen=True)
class Part:
    scenario_file: str                          # path as given (error messages name it)
    scenario_name: str
    scenario_hash: str                          # scenario_hash(): data without ``sweep:``, files
    params: tuple[tuple[str, tuple], ...]      # (dotted key, values), in declaration order
    method: str = "grid"
    sample: int | None = None
    fixed: tuple[str, ...] = ()                 # KEY=VALUE overrides for every point

    @property
    def grid_size(self) -> int:
        n = 1
        for _, values in self.params:
            n *= len(values)
        return n


@dataclass(frozen=True)
class Sweep:
    name: str            # the first part's scenario name (default output reports/sweeps/<name>)
    seed: int
    parts: tuple[Part, ...]
    source_file: str

    def to_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed, "file": self.source_file,
                "parts": [{"scenario": p.scenario_file, "name": p.scenario_name,
                           "scenario_hash": p.scenario_hash, "method": p.method,
                           "sample": p.sample, "set": list(p.fixed),
                           "params": {k: list(v) for k, v in p.params}} for p in self.parts]}


# -- loading one scenario of a sweep -------------------------------------------------------------

def canonical_json(value: Any) -> str:
    """JSON with sorted keys (dict keys as strings), for hashing."""
    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        return v
    return json.dumps(norm(value), sort_keys=True, separators=(",", ":"), default=str)


def content_hash(data: Any) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]


def named_files(value: Any, base: Path) -> list[tuple[str, str]]:
    """``(name, SHA-256 of the content)`` of every file that a string in ``value`` (nested dicts
    and lists; ``KEY=VALUE`` overrides by their value) names, relative to ``base`` or absolute,
    as the scenario loader resolves traces and preset files. What a point reads besides its
    scenario and kvsim itself: a trace, a CPU or hardware JSON kept elsewhere."""
    found: dict[str, str] = {}

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, str) and 0 < len(v) < 4096 and ("/" in v or "." in v):
            name = v.split("=", 1)[1] if "=" in v else v
            path = Path(name) if Path(name).is_absolute() else base / name
            try:
                if path.is_file():
                    found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                pass

    walk(value)
    return sorted(found.items())


def scenario_hash(data: Any, path: str | Path) -> str:
    """Of a scenario's data (without ``sweep:``) and of the files it names (:func:`named_files`):
    a row of a resumed sweep is reused only while neither changed."""
    return content_hash([data, named_files(data, Path(path).parent)])


def _load_stripped(path: str | Path) -> tuple[dict, Source, Any]:
    data, source = load_yaml(path)
    if not isinstance(data, dict):
        raise source.error((), "must be a mapping")
    data = dict(data)  # a copy: the sweep block is not part of the scenario schema
    block = data.pop("sweep", None)
    return data, source, block


def load_sweep_scenario(path: str | Path, overrides: list[str] | None = None
                        ) -> tuple[ScenarioFile, str]:
    """Like ``load_scenario_file``, with the ``sweep:`` block removed; also its
    :func:`scenario_hash`."""
    data, source, _ = _load_stripped(path)
    digest = scenario_hash(data, path)
    if overrides:
        apply_overrides(data, source, overrides)
    return ScenarioFile(data, source, parse_scenario(data, source)), digest


# -- parameters --------------------------------------------------------------------------------

def yaml_scalar(value: Any) -> str:
    """``value`` as flow YAML that ``yaml.safe_load`` reads back as ``value``."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    if text.endswith("\n..."):
        text = text[:-4].rstrip()
    elif text.endswith("..."):
        text = text[:-3].rstrip()
    return text


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def parse_param(text: str) -> tuple[str, tuple]:
    """``KEY=V1,V2,...`` (values parsed as YAML scalars, as ``--set`` does)."""
    if "=" not in text:
        raise SweepError(f"--param {text!r}: expected KEY=V1,V2,...")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise SweepError(f"--param {text!r}: empty key")
    values = tuple(_parse_scalar(v.strip()) for v in raw.split(","))
    if raw.strip() == "" or any(v is None for v in values):
        raise SweepError(f"--param {text!r}: empty value")
    return key, values


def parse_set(text: str) -> str:
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise SweepError(f"--set {text!r}: expected KEY=VALUE")
    return text


def _check_keys(data: dict, source: Source, params: tuple[tuple[str, tuple], ...],
                fixed: tuple[str, ...], where: str) -> None:
    """Every key must name a field of the scenario (values are checked per point)."""
    seen = set()
    for key, values in params:
        if key in seen:
            raise SweepError(f"{where}: parameter {key!r} given twice")
        seen.add(key)
        if key in RESERVED_COLUMNS:
            raise SweepError(f"{where}: parameter {key!r} clashes with a column of the table")
        if not values:
            raise SweepError(f"{where}: parameter {key!r} has no values")
    for item in [f"{k}={yaml_scalar(v[0])}" for k, v in params] + list(fixed):
        try:
            apply_overrides(copy.deepcopy(data), Source(source.filename), [item])
        except ScenarioError as e:
            raise SweepError(f"{where}: {e}") from None


def _method(method: str | None, sample: int | None, where: str) -> tuple[str, int | None]:
    if method is None:
        method = "lhs" if sample is not None else "grid"
    if method not in METHODS:
        raise SweepError(f"{where}: method must be one of {', '.join(METHODS)}; got {method!r}")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise SweepError(f"{where}: sample must be an integer >= 1, got {sample!r}")
    if method == "grid" and sample is not None:
        raise SweepError(f"{where}: --sample draws points with --method random or lhs; "
                         "grid runs every point")
    if method != "grid" and sample is None:
        raise SweepError(f"{where}: method {method} needs a sample size (--sample N)")
    return method, sample


@schema
@dataclass(frozen=True)
class PartBlock:
    """One entry of ``sweep.parts``: another scenario file swept alongside."""

    scenario: Str
    params: dict[Str, Any] = field(default_factory=dict)  # dotted field -> list of values
    method: OneOf(*METHODS) | None = None
    sample: IntRange(1) | None = None
    set: dict[Str, Any] = field(default_factory=dict)  # dotted field -> value, every point


@schema
@dataclass(frozen=True)
class SweepBlock:
    """A scenario file's ``sweep:`` block."""

    seed: IntRange(0, MAX_SEED) = 0
    params: dict[Str, Any] = field(default_factory=dict)
    method: OneOf(*METHODS) | None = None
    sample: IntRange(1) | None = None
    set: dict[Str, Any] = field(default_factory=dict)
    parts: tuple[PartBlock, ...] = ()


def _block_params(block: SweepBlock | PartBlock, source: Source,
                  where: tuple) -> tuple[tuple[str, tuple], ...]:
    out = []
    for k, v in block.params.items():
        values = tuple(v) if isinstance(v, list) else (v,)
        if not values or any(x is None for x in values):
            raise source.error(where + ("params", k), "needs one or more (non-null) values")
        out.append((str(k), values))
    return tuple(out)


def _block_set(block: SweepBlock | PartBlock) -> tuple[str, ...]:
    return tuple(f"{k}={yaml_scalar(v)}" for k, v in block.set.items())


def _part(path: str, params, fixed, method, sample, where: str) -> Part:
    data, source, _ = _load_stripped(path)
    _check_keys(data, source, params, fixed, where)
    method, sample = _method(method, sample, where)
    name = data.get("name") if isinstance(data.get("name"), str) else Path(path).stem
    return Part(str(path), name, scenario_hash(data, path), params, method, sample, fixed)


def load_sweep(path: str | Path, params: list[str] | None = None, sets: list[str] | None = None,
               method: str | None = None, sample: int | None = None,
               seed: int | None = None) -> Sweep:
    """The sweep of ``path``: the command-line parameters if any, else its ``sweep:`` block.

    ``method``, ``sample`` and ``seed`` given here override the block's; ``sets`` (``--set``)
    apply to every point of every part.
    """
    path = str(path)
    _, source, block = _load_stripped(path)
    cli_fixed = tuple(parse_set(s) for s in sets or [])
    cli_draw = (method, sample) if method is not None or sample is not None else None
    block_seed = 0
    if params:
        draw = cli_draw or (None, None)
        parts = [_part(path, tuple(parse_param(p) for p in params), cli_fixed, *draw, path)]
    elif block is None:
        raise SweepError(f"{path}: no --param given and the file has no 'sweep:' block")
    else:
        spec = validate(SweepBlock, block, lambda loc, message: source.error(("sweep", *loc),
                                                                             message))
        block_seed = spec.seed
        top_draw = (spec.method, spec.sample)
        parts = [_part(path, _block_params(spec, source, ("sweep",)), _block_set(spec) + cli_fixed,
                       *(cli_draw or top_draw), f"{path}: sweep")]
        for i, part in enumerate(spec.parts):
            sub = Path(part.scenario)
            if not sub.is_absolute():
                sub = Path(path).parent / sub
            part_draw = (part.method, part.sample)
            draw = cli_draw or (part_draw if part_draw != (None, None) else top_draw)
            parts.append(_part(str(sub), _block_params(part, source, ("sweep", "parts", i)),
                               _block_set(part) + cli_fixed, *draw, f"{path}: sweep.parts.{i}"))
    if seed is None:
        seed = block_seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SweepError(f"sweep seed must be an integer >= 0, got {seed!r}")
    return Sweep(parts[0].scenario_name, seed, tuple(parts), path)
