"""Declarative validation: field types with their rules, and errors that name the field.

Scenario files, hardware presets and op-trace records are validated the same way: each is a
frozen dataclass whose fields carry their rules as annotations (``tokens: IntRange(1, 2**26)``),
read by pydantic (:func:`validate`), which checks every field of every nested block and reports
each failure with its location. :func:`validate` turns the first failure into a
:class:`~kvsim.errors.ConfigError` whose message is ``WHERE: FIELD: rule`` in kvsim's words
(``must be in [1, 65536], got -4``), ``WHERE`` coming from the caller (a YAML line, a trace line,
a preset file). Rules that span several fields stay in code beside the schema that needs them.

Why pydantic: it validates plain dataclasses (the rest of kvsim keeps using them as they are),
reports every error with its path, and is well kept; the rules and messages here are kvsim's.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Strict,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic_core import PydanticCustomError

from kvsim.errors import ConfigError

Loc = tuple[Any, ...]

MAX_COUNT = 10**7  # calls one thread makes (probes, queries, iterations): a run of days at most
MAX_THREADS = 1024
MAX_SEED = 2**63 - 1


def schema(cls: type) -> type:
    """Mark a dataclass as a schema: unknown keys are errors, not silently dropped."""
    return with_config(ConfigDict(extra="forbid"))(cls)


# -- field types --------------------------------------------------------------------------------------
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


def _fail(kind: str, message: str) -> PydanticCustomError:
    """A validation error whose message is ``message`` as given (pydantic formats templates)."""
    return PydanticCustomError(kind, message.replace("{", "{{").replace("}", "}}"))


def IntRange(lo: int, hi: int | None = None) -> Any:  # noqa: N802 - a type, named like one
    """An integer (not a bool) in ``[lo, hi]`` (no upper bound: ``>= lo``)."""
    def check(value: int) -> int:
        if value < lo or (hi is not None and value > hi):
            if hi is None or (hi == MAX_SEED and value < lo):
                bound = f">= {lo}"
            elif hi == MAX_SEED:
                bound = f"in [{lo}, 2**63)"
            else:
                bound = f"in [{lo}, {hi}]"
            raise _fail("kvsim_range", f"must be {bound}, got {value}")
        return value
    return Annotated[int, Strict(), AfterValidator(check)]


def FloatRange(lo: float, hi: float | None = None, lo_open: bool = False) -> Any:  # noqa: N802
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``; no upper bound: ``>= lo``);
    integers accepted."""
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail("kvsim_number", f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise _fail("kvsim_finite", f"must be a finite number, got {value!r}")
        if hi is None and value < lo:
            raise _fail("kvsim_range", f"must be >= {lo:g}, got {value}")
        if hi is not None and (value > hi or value < lo or (lo_open and value == lo)):
            raise _fail("kvsim_range", f"must be in {'(' if lo_open else '['}{lo}, {hi}], "
                        f"got {value}")
        return float(value)
    return Annotated[float, BeforeValidator(check)]


def OneOf(*choices: str) -> Any:  # noqa: N802
    """One of ``choices`` (a string)."""
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _fail("kvsim_string", f"must be a string, got {value!r}")
        if value not in choices:
            raise _fail("kvsim_choice", f"must be one of {', '.join(choices)}; got {value!r}")
        return value
    return Annotated[str, BeforeValidator(check)]


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
MAX_BYTES = 1 << 62  # any byte count (sizes are also bounded by kvsim.manager.limits)


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string such as ``"16 KiB"``; raises ValueError saying why."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"must be a byte count such as 4096 or '16 KiB', got {value!r}")
        number = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if number != int(number):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        value = int(number)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a byte count, got {value!r}")
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    if value > MAX_BYTES:
        raise ValueError(f"must be at most 2**62 bytes, got {value}")
    return value


def _size(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise _fail("kvsim_size", str(e)) from None


Bytes = Annotated[int, BeforeValidator(_size)]


def ByteRange(lo: int, hi: int) -> Any:  # noqa: N802
    """A byte count (integer or ``"16 KiB"``) in ``[lo, hi]``."""
    def check(value: int) -> int:
        if not lo <= value <= hi:
            raise _fail("kvsim_range", f"must be {lo} to {hi} bytes, got {value}")
        return value
    return Annotated[int, BeforeValidator(_size), AfterValidator(check)]


def NonEmpty(item: Any, most: int | None = None, what: str = "list") -> Any:  # noqa: N802
    """A non-empty list (a tuple once validated) of ``item``, of at most ``most`` entries."""
    def check(value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not value:
            raise _fail("kvsim_list", f"must be a non-empty {what}")
        if most is not None and len(value) > most:
            raise _fail("kvsim_list", f"at most {most} entries, got {len(value)}")
        return value
    return Annotated[tuple[item, ...], BeforeValidator(check)]


# -- errors ---------------------------------------------------------------------------------------------
def _type_at(root: Any, loc: Loc) -> Any:
    """The dataclass reached from ``root`` by following ``loc`` (field names, list indexes,
    union tags), or None."""
    tp = root
    for key in loc:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp, include_extras=True)
            if key not in hints:
                return None
            tp = hints[key]
        elif isinstance(key, int):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            tp = args[0] if args else None
        else:  # a union's tag
            tp = next((a for a in _members(tp) if _tag_of(a) == key), None)
        if tp is None:
            return None
    return _unwrap(tp)


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    members = [m for m in _members(tp) if m is not type(None)]
    if len(members) == 1 and members[0] is not tp:
        return _unwrap(members[0])
    return tp


def _members(tp: Any) -> tuple:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(_unwrap(a) for a in typing.get_args(tp))
    return (tp,)


def _tag_of(tp: Any) -> Any:
    if dataclasses.is_dataclass(tp):
        for f in dataclasses.fields(tp):
            if f.name == "kind" and f.default is not dataclasses.MISSING:
                return f.default
    return None


def allowed_keys(root: Any, loc: Loc) -> list[str]:
    tp = _type_at(root, loc)
    return sorted(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else []


def _describe(root: Any, err: dict) -> tuple[Loc, str]:
    """(where the error is, what is wrong) in kvsim's words."""
    kind, loc, value = err["type"], tuple(err["loc"]), err.get("input")
    if "[key]" in loc:  # a mapping's key is wrong (pydantic marks the key so)
        loc = loc[:loc.index("[key]")]
    loc = _strip_tags(root, loc)
    if kind.startswith("kvsim_"):
        return loc, err["msg"]
    if kind == "missing":
        return loc, "required field is missing"
    if kind in _UNKNOWN_KEY:
        keys = allowed_keys(root, loc[:-1])
        return loc, "unknown key" + (f" (allowed: {', '.join(keys)})" if keys else "")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return loc, f"must be an integer, got {value!r}"
    if kind in ("float_type", "float_parsing"):
        return loc, f"must be a number, got {value!r}"
    if kind == "finite_number":
        return loc, f"must be a finite number, got {value!r}"
    if kind in ("bool_type", "bool_parsing"):
        return loc, f"must be true or false, got {value!r}"
    if kind == "string_type":
        return loc, f"must be a string, got {value!r}"
    if kind in ("dataclass_type", "dict_type", "model_type"):
        return loc, f"must be a mapping, got {type(value).__name__}"
    if kind in ("list_type", "tuple_type"):
        return loc, f"must be a list, got {type(value).__name__}"
    if kind == "union_tag_invalid":
        expected = sorted(filter(None, (_tag_of(m) for m in _members(_type_at(root, loc)))))
        return loc + ("kind",), f"must be one of {', '.join(expected)}; got {err['ctx']['tag']!r}"
    if kind == "union_tag_not_found":
        return loc + ("kind",), "required field is missing"
    if kind == "value_error":
        return loc, str(err.get("ctx", {}).get("error", err["msg"]))
    return loc, err["msg"]


def _strip_tags(root: Any, loc: Loc) -> Loc:
    """Drop the union tags pydantic puts in a location (``workload.burst_resize.history``)."""
    out: list = []
    for key in loc:
        tp = _type_at(root, tuple(out))
        if isinstance(key, str) and len(_members(tp)) > 1 and not dataclasses.is_dataclass(tp) \
                and key in {getattr(m, "__name__", None) for m in _members(tp)}:
            continue  # the member of a plain union pydantic tried ("int", "str")
        if isinstance(key, str) and tp is not None and not dataclasses.is_dataclass(tp) \
                and any(_tag_of(m) == key for m in _members(tp)):
            continue
        out.append(key)
    return tuple(out)


def validate(root: Any, data: Any, error: Callable[[Loc, str], ConfigError],
             adapter: TypeAdapter | None = None) -> Any:
    """``data`` validated as ``root``; the first failure becomes ``error(location, message)``."""
    try:
        return (adapter or adapter_for(root)).validate_python(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        # A misspelt key also shows as a required one missing: the misspelling is the news.
        first = min(errors, key=lambda err: err["type"] not in _UNKNOWN_KEY)
        loc, message = _describe(root, first)
        raise error(loc, message) from None


_UNKNOWN_KEY = ("unexpected_keyword_argument", "extra_forbidden")


_ADAPTERS: dict[Any, TypeAdapter] = {}


def adapter_for(root: Any) -> TypeAdapter:
    """One pydantic adapter per schema type (building one compiles the schema)."""
    if root not in _ADAPTERS:
        _ADAPTERS[root] = TypeAdapter(root)
    return _ADAPTERS[root]


def dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(k) for k in loc) or "<top level>"


__all__ = ["MAX_COUNT", "MAX_SEED", "MAX_THREADS", "Bool", "ByteRange", "Bytes", "FloatRange",
           "Int", "IntRange", "Literal", "NonEmpty", "OneOf", "Str", "allowed_keys", "dotted",
           "parse_size", "schema", "validate"]
