"""Trace files: Mooncake request traces and kvsim op traces (JSONL, one record a line).

Both formats share the line reader here: every rejected line is reported as
``FILE:LINE: FIELD: what is wrong`` (a :class:`TraceError`); with ``skip_bad_lines`` the reader
counts bad lines and keeps the first :data:`MAX_LISTED_SKIPS` of them (number and reason) instead
of raising. Blank lines are ignored. Two faults are never skipped, because they mean the file
itself is unusable: an empty file (no record at all) and a truncated file (the last line has no
newline and does not parse, as when a copy or a download was cut short).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from kvsim.errors import ConfigError

MAX_LISTED_SKIPS = 20

T = TypeVar("T")


class TraceError(ConfigError):
    """A trace file or one of its lines is malformed; the message names file, line and field."""

    def __init__(self, message: str, filename: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.filename = filename
        self.line = line
        self.field = field


class LineError(ValueError):
    """Raised by a record parser for one bad line: the field (or None) and the rule it broke."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class SkippedLine:
    line: int
    reason: str  # "FIELD: message", without the file name


@dataclass(frozen=True)
class JsonlRead:
    """What :func:`read_jsonl` returns: the parsed records and what it skipped."""

    records: list
    num_lines: int  # lines in the file, blank ones included
    skipped_lines: int
    skipped: tuple[SkippedLine, ...]  # the first MAX_LISTED_SKIPS skipped lines


def skip_summary(filename: str, skipped_lines: int, skipped: tuple[SkippedLine, ...]) -> str:
    """One human-readable paragraph on the lines skipped (empty when none were)."""
    if not skipped_lines:
        return ""
    listed = "; ".join(f"line {s.line}: {s.reason}" for s in skipped)
    more = f"; ... and {skipped_lines - len(skipped)} more" if skipped_lines > len(skipped) else ""
    return f"{filename}: skipped {skipped_lines} bad line(s): {listed}{more}"


def check_int(record: dict, name: str, minimum: int | None = 0, required: bool = True,
              maximum: int = 2**63 - 1) -> int | None:
    """``record[name]`` as an int (bools rejected) in ``[minimum, maximum]``; raises LineError."""
    if name not in record:
        if required:
            raise LineError(name, "required field is missing")
        return None
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise LineError(name, f"must be an integer, got {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise LineError(name, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise LineError(name, f"must be <= {maximum}, got {value}")
    return value


def check_number(record: dict, name: str, minimum: float | None = 0.0,
                 required: bool = True) -> float | int | None:
    """``record[name]`` as a finite int or float (bools rejected), at least ``minimum``."""
    if name not in record:
        if required:
            raise LineError(name, "required field is missing")
        return None
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LineError(name, f"must be a number, got {json.dumps(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise LineError(name, f"must be finite, got {value}")
    if minimum is not None and value < minimum:
        raise LineError(name, f"must be >= {minimum}, got {value}")
    return value


def read_jsonl(path: str | Path, parse: Callable[[dict, int], T],
               skip_bad_lines: bool = False, what: str = "record") -> JsonlRead:
    """Parse every non-blank line of ``path`` as a JSON object, then with ``parse(obj, line)``.

    ``parse`` raises :class:`LineError` for a bad record; it must keep any state that spans
    lines (such as the previous timestamp) unchanged when it raises, so that a skipped line
    leaves no trace. Raises :class:`TraceError` on the first bad line, or, with
    ``skip_bad_lines``, skips it; an unreadable, empty or truncated file always raises.
    """
    filename = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TraceError(f"{filename}: cannot read: {e.strerror or e}", filename) from None
    raw_lines = data.split(b"\n")
    ends_with_newline = data.endswith(b"\n")
    if ends_with_newline:
        raw_lines.pop()  # the empty piece after the final newline
    last = len(raw_lines)
    records: list = []
    skipped: list[SkippedLine] = []
    num_skipped = 0
    num_blank = 0
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            num_blank += 1
            continue
        try:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LineError(None, f"not UTF-8 text (byte {e.start})") from None
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                if number == last and not ends_with_newline:
                    raise TraceError(
                        f"{filename}:{number}: truncated file: the last line is cut short "
                        f"({e.msg} at column {e.colno}) and has no final newline",
                        filename, number) from None
                raise LineError(None, f"malformed JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(obj, dict):
                raise LineError(None, f"each line must be a JSON object, got {type(obj).__name__}")
            records.append(parse(obj, number))
        except LineError as e:
            reason = e.message if e.field is None else f"{e.field}: {e.message}"
            if not skip_bad_lines:
                raise TraceError(f"{filename}:{number}: {reason}", filename, number,
                                 e.field) from None
            num_skipped += 1
            if len(skipped) < MAX_LISTED_SKIPS:
                skipped.append(SkippedLine(number, reason))
    if not records:
        if num_skipped:
            raise TraceError(f"{filename}: no valid {what}: all {num_skipped} non-blank line(s) "
                             f"are bad ({skip_summary(filename, num_skipped, tuple(skipped))})",
                             filename)
        raise TraceError(f"{filename}: empty trace: no {what} in the file"
                         + (f" ({num_blank} blank line(s))" if num_blank else ""), filename)
    return JsonlRead(records, len(raw_lines), num_skipped, tuple(skipped))


# -- deterministic token streams ------------------------------------------------------------------
# splitmix64's constants (Steele, Lea and Flood 2014): a bijective 64-bit mixer.
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic): a bijection."""
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _mix64_int(x: int) -> int:
    """:func:`mix64` of one value, in Python integers (masked to 64 bits, so the same wrapping
    arithmetic): a stream's base costs two of these per slice, where numpy arrays of one element
    cost ~9 us each."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def stream_tokens(domain: int, key: int, start: int, count: int) -> np.ndarray:
    """Tokens ``start .. start + count - 1`` of the stream named by ``(domain, key)``, as uint32.

    Token ``i`` is the low 32 bits of ``mix64(s + i)`` with ``s = mix64(mix64(domain) XOR key)``
    (wrapping uint64 arithmetic): it depends only on the stream and the position, so two
    requests using the same stream share every prefix, and any slice can be made on its own (a
    commit continuing where the previous one stopped).
    """
    base = _mix64_int(_mix64_int(domain & _MASK64) ^ (key & _MASK64))
    positions = np.arange(start, start + count, dtype=np.uint64)
    return (mix64(positions + np.uint64(base)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
