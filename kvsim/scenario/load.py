"""Loading a scenario file: the file, the command-line overrides, and every variant, validated
before anything runs (errors name the file, the line and the field, or the option)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.scenario.schema import Scenario, Variant, parse_scenario
from kvsim.scenario.source import Source, apply_overrides, load_yaml


@dataclass
class ScenarioFile:
    """A loaded scenario file: its data, where each value came from, the scenario as written
    and each variant's scenario (all validated when the file is loaded)."""

    data: dict
    source: Source
    base: Scenario
    variants: tuple[tuple[Variant, Scenario], ...] = ()


def load_scenario_file(path: str | Path, overrides: list[str] | None = None) -> ScenarioFile:
    """Load, override and validate a scenario file and every variant; raises ScenarioError
    naming the file, line and field (or the option) of the first problem."""
    data, source = load_yaml(path)
    if not isinstance(data, dict):
        raise source.error((), "must be a mapping")
    if overrides:
        apply_overrides(data, source, overrides)
    sf = ScenarioFile(data, source, parse_scenario(data, source))
    sf.variants = tuple((v, variant_scenario(sf, v)) for v in sf.base.variants)
    return sf


def shipped_scenario_files(root: Path) -> list[Path]:
    """The scenario files under ``root/scenarios`` that the simulator or the plan executor runs
    (sweep files and ``executor: hw`` scenarios left out), sorted by path."""
    import yaml

    out = []
    for path in sorted((Path(root) / "scenarios").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "sweep" in data or data.get("executor") == "hw":
            continue
        out.append(path)
    return out


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    return load_scenario_file(path, overrides).base


def variant_scenario(sf: ScenarioFile, variant: Variant) -> Scenario:
    """The scenario with ``variant``'s overrides applied; an error in what an override set is
    blamed on that override's line."""
    data = copy.deepcopy(sf.data)
    data.pop("variants", None)
    source = Source(sf.source.filename, dict(sf.source.lines), dict(sf.source.options))
    for dotted, value in variant.overrides:
        here = ("variants", variant.name, "set", dotted)
        line = sf.source.line_of(here)
        keys: list[Any] = [int(k) if k.isdigit() else k for k in str(dotted).split(".")]
        target: Any = data
        for k in keys[:-1]:
            if isinstance(target, dict):
                target = target.setdefault(k, {})
            elif isinstance(target, list) and isinstance(k, int) and k < len(target):
                target = target[k]
            else:
                raise sf.source.error(here, "no such field in the scenario")
        if isinstance(target, dict) or (isinstance(target, list) and isinstance(keys[-1], int)
                                        and keys[-1] < len(target)):
            target[keys[-1]] = value
        else:
            raise sf.source.error(here, "no such field in the scenario")
        source.options[tuple(keys)] = f"{sf.source.filename}:{line}: variant {variant.name!r}"
    return parse_scenario(data, source)
