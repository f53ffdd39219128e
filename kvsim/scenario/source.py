"""YAML loading that remembers where every value came from.

``load_yaml`` returns the plain data and a :class:`Source` that maps each path in it
(``("manager", "levels", 0, "quota_bytes")``) to its line, so validation errors can name the
file, the line and the field. A value set on the command line (``--set``) is blamed on the option
instead (``--set seed=abc: seed: must be an integer``).

Before anything is built from a file it is checked for what would otherwise hang or crash the
loader: text that is not UTF-8, nesting deeper than :data:`MAX_DEPTH`, and aliases that expand to
more than :data:`MAX_VALUES` values (a "billion laughs" file of a few hundred bytes). Duplicate
keys, which plain YAML loading silently collapses, are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.errors import ConfigError

PathKey = tuple[Any, ...]

MAX_FILE_BYTES = 8 << 20  # a scenario file is a few kilobytes
MAX_DEPTH = 32  # nested mappings and lists (the schema needs 5)
MAX_VALUES = 100_000  # values after aliases are expanded
OPTIONAL_BLOCKS = ("sim", "hw")  # top-level mappings that --set may create

_OPENERS = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken,
            yaml.FlowMappingStartToken, yaml.FlowSequenceStartToken)
_CLOSERS = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


class ScenarioError(ConfigError):
    """A scenario file is malformed or invalid; the message names file, line and field."""


@dataclass
class Source:
    filename: str
    lines: dict[PathKey, int] = field(default_factory=dict)
    # Paths whose values came from a command-line option: the option, as typed.
    options: dict[PathKey, str] = field(default_factory=dict)

    def line_of(self, path: PathKey) -> int | None:
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def option_of(self, path: PathKey) -> str | None:
        """The option that set ``path`` or one of its ancestors, or that created ``path`` (a
        key the file does not have, below which an option set a value)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.options:
                return self.options[path[:n]]
        if path not in self.lines:
            for key, option in self.options.items():
                if key[:len(path)] == path:
                    return option
        return None

    def error(self, path: PathKey, message: str) -> ScenarioError:
        field_name = ".".join(str(p) for p in path) or "<top level>"
        option = self.option_of(path)
        if option is not None:
            return ScenarioError(f"{option}: {field_name}: {message}")
        line = self.line_of(path)
        where = self.filename if line is None else f"{self.filename}:{line}"
        return ScenarioError(f"{where}: {field_name}: {message}")


def _check_depth(text: str, filename: str) -> None:
    """Reject nesting deeper than MAX_DEPTH by scanning tokens (the scanner does not recurse;
    the composer and constructor do, and would hit Python's recursion limit)."""
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPENERS):
            depth += 1
            if depth > MAX_DEPTH:
                raise ScenarioError(f"{filename}:{token.start_mark.line + 1}: nested more than "
                                    f"{MAX_DEPTH} levels deep")
        elif isinstance(token, _CLOSERS):
            depth -= 1


def _check_expansion(node: yaml.Node, filename: str) -> None:
    """Reject a document whose aliases expand to more than MAX_VALUES values. Sizes are summed
    over distinct nodes, each visited once, so the check itself stays linear in the file."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:  # post-order, without recursion
        n, children_done = stack.pop()
        if id(n) in sizes:
            continue
        children = _children(n)
        if not children_done:
            stack.append((n, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[id(n)] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[id(n)] > MAX_VALUES:
            raise ScenarioError(f"{filename}:{n.start_mark.line + 1}: its aliases expand to more "
                                f"than {MAX_VALUES} values")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _record_lines(node: yaml.Node, path: PathKey, source: Source, seen: set[int]) -> None:
    source.lines[path] = node.start_mark.line + 1
    if id(node) in seen:  # reached again through an alias: its lines are recorded already
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in keys:
                line = key_node.start_mark.line + 1
                raise ScenarioError(f"{source.filename}:{line}: {'.'.join(map(str, path + (key,)))}: "
                                    "duplicate key")
            keys.add(key)
            _record_lines(value_node, path + (key,), source, seen)
            source.lines[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record_lines(item, path + (i,), source, seen)


def _decode(raw: bytes, filename: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ScenarioError(f"{filename}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                            f"column {column})") from None


def load_yaml(path: str | Path) -> tuple[Any, Source]:
    filename = str(path)
    try:
        if Path(path).is_dir():
            raise ScenarioError(f"{filename}: is a directory, not a scenario file")
        if Path(path).stat().st_size > MAX_FILE_BYTES:
            raise ScenarioError(f"{filename}: larger than {MAX_FILE_BYTES >> 20} MiB; "
                                "not a scenario file")
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ScenarioError(f"{filename}: cannot read: {e.strerror or e}") from None
    text = _decode(raw, filename)
    source = Source(filename)
    loader = yaml.SafeLoader(text)
    try:
        _check_depth(text, filename)
        node = loader.get_single_node()
        if node is None:
            raise ScenarioError(f"{filename}: the file is empty")
        _check_expansion(node, filename)
        _record_lines(node, (), source, set())
        data = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}" if mark is not None else filename
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioError(f"{where}: malformed YAML: {problem}") from None
    finally:
        loader.dispose()
    return data, source


def _parse_key(part: str) -> Any:
    return int(part) if part.isdigit() else part


def apply_overrides(data: dict, source: Source, overrides: list[str]) -> None:
    """Apply ``key.sub=value`` overrides (values parsed as YAML scalars) in place; errors name
    the option. An optional top-level block (``sim:``, ``hw:``) not in the file is created."""
    for item in overrides:
        option = f"--set {item}"
        if "=" not in item:
            raise ScenarioError(f"{option}: expected KEY=VALUE")
        dotted, raw = item.split("=", 1)
        parts = dotted.split(".")
        if not dotted or any(not p for p in parts):
            raise ScenarioError(f"{option}: {dotted!r} is not a dotted field name such as seed or "
                                "manager.levels.0.quota_bytes")
        keys = [_parse_key(p) for p in parts]
        target: Any = data
        for depth, k in enumerate(keys[:-1]):
            here = ".".join(parts[:depth]) or "the scenario"
            if isinstance(target, dict):
                if k not in target and depth == 0 and k in OPTIONAL_BLOCKS:
                    target[k] = {}
                if k not in target:
                    raise ScenarioError(f"{option}: {here} has no field {parts[depth]!r}")
                target = target[k]
            elif isinstance(target, list):
                if not isinstance(k, int) or k >= len(target):
                    raise ScenarioError(f"{option}: {here} is a list of {len(target)}; "
                                        f"{parts[depth]!r} is not an index in it")
                target = target[k]
            else:
                raise ScenarioError(f"{option}: {here} is a single value, not a mapping or list")
        last = keys[-1]
        here = ".".join(parts[:-1]) or "the scenario"
        if isinstance(target, list):
            if not isinstance(last, int) or last >= len(target):
                raise ScenarioError(f"{option}: {here} is a list of {len(target)}; "
                                    f"{parts[-1]!r} is not an index in it")
        elif not isinstance(target, dict):
            raise ScenarioError(f"{option}: {here} is a single value, not a mapping or list")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (dict, list)):
            raise ScenarioError(f"{option}: the value must be a single value (a number, a string, "
                                "true or false), not a mapping or list")
        target[last] = value
        source.options[tuple(keys)] = option
