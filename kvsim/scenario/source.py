"""YAML loading that remembers where every value came from.

``load_yaml`` returns the plain data and a :class:`Source` that maps each path in it
(``("manager", "levels", 0, "quota_bytes")``) to its line, so validation errors can name the
file, the line and the field. Duplicate keys, which plain YAML loading silently collapses, are
rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.errors import ConfigError

PathKey = tuple[Any, ...]


class ScenarioError(ConfigError):
    """A scenario file is malformed or invalid; the message names file, line and field."""


@dataclass
class Source:
    filename: str
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line_of(self, path: PathKey) -> int | None:
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def error(self, path: PathKey, message: str) -> ScenarioError:
        line = self.line_of(path)
        where = self.filename if line is None else f"{self.filename}:{line}"
        field_name = ".".join(str(p) for p in path) or "<top level>"
        return ScenarioError(f"{where}: {field_name}: {message}")


def _record_lines(node: yaml.Node, path: PathKey, source: Source) -> None:
    source.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                line = key_node.start_mark.line + 1
                raise ScenarioError(f"{source.filename}:{line}: {'.'.join(map(str, path + (key,)))}: "
                                    "duplicate key")
            seen.add(key)
            _record_lines(value_node, path + (key,), source)
            source.lines[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record_lines(item, path + (i,), source)


def load_yaml(path: str | Path) -> tuple[Any, Source]:
    filename = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{filename}: cannot read: {e.strerror or e}") from None
    source = Source(filename)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}" if mark is not None else filename
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioError(f"{where}: malformed YAML: {problem}") from None
    if node is None:
        raise ScenarioError(f"{filename}: the file is empty")
    _record_lines(node, (), source)
    return data, source


def apply_overrides(data: dict, source: Source, overrides: list[str]) -> None:
    """Apply ``key.sub=value`` overrides (values parsed as YAML scalars) in place."""
    for item in overrides:
        if "=" not in item:
            raise ScenarioError(f"--set {item!r}: expected KEY=VALUE")
        dotted, raw = item.split("=", 1)
        keys: list[Any] = [int(k) if k.isdigit() else k for k in dotted.split(".")]
        target: Any = data
        for k in keys[:-1]:
            if isinstance(target, dict) and k not in target and isinstance(k, str) and target is data:
                target[k] = {}  # an optional top-level block (sim:, hw:) not written in the file
            try:
                target = target[k]
            except (KeyError, IndexError, TypeError):
                raise ScenarioError(f"--set {item!r}: no field {dotted!r} in the scenario") from None
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if not isinstance(target, (dict, list)):
            raise ScenarioError(f"--set {item!r}: {'.'.join(map(str, keys[:-1]))} is not a mapping")
        target[keys[-1]] = value
        source.lines.pop(tuple(keys), None)
