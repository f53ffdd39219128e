"""Op traces: one manager API call a line (JSONL), for faithful replay and for recording runs.

Each line is a JSON object::

    {"t": 0.0125, "thread": "req3", "op": "commit", "cache": "c3", "token_count": 512,
     "token_seed": 3, "token_offset": 1024}

Keys (``*`` = required):

``t``\\*
    seconds since the threads started (int or float >= 0); never decreasing within one thread
    (threads are independent of one another). The replay waits until ``t`` before the call.
``thread``\\*
    non-empty string: the client thread issuing the call; each thread replays in file order.
``op``\\*
    one of ``create_kv_cache``, ``resume``, ``suspend``, ``close``, ``resize``, ``commit``,
    ``stop_committing``, ``commit_pending_stats``, ``probe_reuse``,
    ``get_and_reset_iteration_stats``.
``cache``
    non-empty string naming a KV cache; required by every cache op and by ``create_kv_cache``
    (it becomes the manager's ``cache_id``), not allowed on the others. A cache op on an id that
    no earlier ``create_kv_cache`` created fails at replay time (a failed call, not a parse
    error), naming the trace line.
``tokens``
    a list of token ids (ints in ``[0, 2**32)``): the prompt of ``create_kv_cache`` (optional,
    default none), the tokens of ``commit`` or ``probe_reuse`` (required, or the next three).
``token_count``, ``token_seed``, ``token_offset``
    synthesised tokens instead of a list: tokens ``token_offset .. token_offset + token_count - 1``
    of the deterministic stream ``token_seed`` (ints >= 0; seed and offset default to 0; count
    and offset at most 2**26, :data:`kvsim.manager.limits.MAX_SEQUENCE_TOKENS`).
    Token ``i`` of a stream depends only on the seed and ``i``, so equal seeds share prefixes and a
    ``commit`` continues a prompt by setting ``token_offset`` to the tokens already committed.
``capacity``, ``history_length``
    ``resize`` only: capacity (required) and history (optional) in tokens, ints in [0, 2**26].
``scope``
    ``create_kv_cache`` and ``probe_reuse`` only: the reuse scope (int or string; default the
    default scope, KVCM2's ``ReuseScope()``).
``ok``, ``result``, ``error``, ``duration_s``
    optional, what a recorded run observed (``ok`` bool, ``result`` bool/int/null, ``error``
    string, ``duration_s`` number >= 0). Kept by the parser and written back by the writer, ignored
    by the replay, which records its own outcome.

Any other key is an error (a misspelt argument must not be silently dropped). The parser reports
bad lines as ``FILE:LINE: FIELD: rule`` (:mod:`kvsim.traces`); :func:`write_op_trace` and
:class:`OpTraceWriter` write the same format back (keys in a fixed order, nothing omitted that
was set), so ``load(write(ops)) == ops``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Annotated, Any

import numpy as np
from pydantic import AfterValidator, BeforeValidator, Strict
from pydantic_core import PydanticCustomError

from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.traces import (
    LineError,
    SkippedLine,
    read_jsonl,
    skip_summary,
    stream_tokens,
)
from kvsim.validation import Bool, FloatRange, Int, IntRange, OneOf, Str, dotted, schema, validate

OPS = ("create_kv_cache", "resume", "suspend", "close", "resize", "commit", "stop_committing",
       "commit_pending_stats", "probe_reuse", "get_and_reset_iteration_stats")
CACHE_OPS = ("create_kv_cache", "resume", "suspend", "close", "resize", "commit", "stop_committing",
             "commit_pending_stats")
TOKEN_OPS = ("create_kv_cache", "commit", "probe_reuse")  # may carry tokens
TOKENS_REQUIRED = ("commit", "probe_reuse")
SCOPE_OPS = ("create_kv_cache", "probe_reuse")
OUTCOME_KEYS = ("ok", "result", "error", "duration_s")
TOKEN_SYNTH_KEYS = ("token_count", "token_seed", "token_offset")
KEY_ORDER = ("t", "thread", "op", "cache", "tokens", "token_count", "token_seed", "token_offset",
             "capacity", "history_length", "scope") + OUTCOME_KEYS

_OP_TRACE_DOMAIN = 0x6B767369_6D6F7073  # "kvsimops": the stream domain of token_seed


@dataclass(frozen=True)
class TraceOp:
    """One call of an op trace; ``None`` marks an argument that is not given."""

    t: float
    thread: str
    op: str
    cache: str | None = None
    tokens: tuple[int, ...] | None = None
    token_count: int | None = None
    token_seed: int | None = None
    token_offset: int | None = None
    capacity: int | None = None
    history_length: int | None = None
    scope: int | str | None = None
    ok: bool | None = None
    result: bool | int | None = None
    error: str | None = None
    duration_s: float | None = None
    line: int = 0  # where it was read (0: not read from a file); not part of the format

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceOp):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    @property
    def num_tokens(self) -> int:
        if self.tokens is not None:
            return len(self.tokens)
        return self.token_count or 0

    def token_array(self) -> np.ndarray:
        """The call's tokens as uint32: the literal list, or the synthesised stream slice."""
        if self.tokens is not None:
            return np.asarray(self.tokens, dtype=np.uint32)
        if self.token_count is None:
            return np.zeros(0, dtype=np.uint32)
        return synth_tokens(self.token_seed or 0, self.token_count, self.token_offset or 0)

    def to_json(self) -> dict:
        """The line's JSON object (only the keys that are set, in the format's key order)."""
        out: dict = {}
        for key in KEY_ORDER:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if key == "tokens" else value
        return out


def synth_tokens(seed: int, count: int, offset: int = 0) -> np.ndarray:
    """Tokens ``offset .. offset + count - 1`` of op-trace stream ``seed`` (uint32)."""
    return stream_tokens(_OP_TRACE_DOMAIN, seed, offset, count)


@dataclass(frozen=True)
class OpTrace:
    path: str
    ops: tuple[TraceOp, ...]
    num_lines: int
    skipped_lines: int
    skipped: tuple[SkippedLine, ...]

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def threads(self) -> dict[str, list[TraceOp]]:
        """Each thread's ops in file order; threads sorted by name."""
        out: dict[str, list[TraceOp]] = {}
        for op in self.ops:
            out.setdefault(op.thread, []).append(op)
        return dict(sorted(out.items()))

    def skip_summary(self) -> str:
        return skip_summary(self.path, self.skipped_lines, self.skipped)


def _token(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 1 << 32:  # noqa: E721 - no bools
        raise PydanticCustomError("kvsim_token", "must be an integer in [0, 2**32), got {value}",
                                  {"value": repr(value)})
    return value


def _scope(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PydanticCustomError("kvsim_scope", "must be an integer or a string, got {value}",
                                  {"value": json.dumps(value)})
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise PydanticCustomError("kvsim_empty", "must be a non-empty string")
    return value


def _tokens(value: Any) -> Any:
    if not isinstance(value, list):
        raise PydanticCustomError("kvsim_tokens", "must be a list of token ids, got {kind}",
                                  {"kind": type(value).__name__})
    if len(value) > MAX_SEQUENCE_TOKENS:
        raise PydanticCustomError("kvsim_tokens", f"{len(value)} tokens; at most "
                                  f"{MAX_SEQUENCE_TOKENS}")
    return value


Name = Annotated[str, Strict(), AfterValidator(_non_empty)]
Tokens = IntRange(0, MAX_SEQUENCE_TOKENS)


@schema
@dataclass(frozen=True)
class _Record:
    """One line's keys and the rule of each (which op takes which key: :meth:`_Parser.__call__`)."""

    t: FloatRange(0.0)
    thread: Name
    op: OneOf(*OPS)
    cache: Name | None = None
    tokens: Annotated[tuple[Annotated[int, BeforeValidator(_token)], ...],
                      BeforeValidator(_tokens)] | None = None
    token_count: Tokens | None = None
    token_seed: IntRange(0, 2**63 - 1) | None = None
    token_offset: Tokens | None = None
    capacity: Tokens | None = None
    history_length: Tokens | None = None
    scope: Annotated[Any, BeforeValidator(_scope)] = None
    ok: Bool | None = None
    result: Bool | Int | None = None
    error: Str | None = None
    duration_s: FloatRange(0.0) | None = None


def _record_error(loc: tuple, message: str) -> LineError:
    return LineError(dotted(loc) if loc else None, message)


class _Parser:
    """Validates one line; remembers each thread's last time (only for accepted lines)."""

    def __init__(self) -> None:
        self.last_t: dict[str, tuple[float, int]] = {}

    def __call__(self, obj: dict, line: int) -> TraceOp:
        if "t" in obj and obj["t"] is None:
            raise LineError("t", "required field is missing")
        rec = validate(_Record, obj, _record_error)
        op = rec.op
        if op in CACHE_OPS and rec.cache is None:
            raise LineError("cache", f"required field is missing ({op} needs it)")
        if op not in CACHE_OPS and rec.cache is not None:
            raise LineError("cache", f"not an argument of {op}")
        synth = [k for k in TOKEN_SYNTH_KEYS if getattr(rec, k) is not None]
        if op not in TOKEN_OPS:
            for k in ("tokens", *synth):
                if getattr(rec, k) is not None:
                    raise LineError(k, f"not an argument of {op}")
        elif rec.tokens is not None and synth:
            raise LineError(synth[0], "give either tokens or token_count/token_seed/"
                            "token_offset, not both")
        elif synth and rec.token_count is None:
            raise LineError("token_count", f"required field is missing ({synth[0]} needs it)")
        elif rec.tokens is None and not synth and op in TOKENS_REQUIRED:
            raise LineError("tokens", f"required field is missing ({op} needs tokens or "
                            "token_count)")
        for k in ("capacity", "history_length"):
            if getattr(rec, k) is not None and op != "resize":
                raise LineError(k, f"not an argument of {op}")
        if op == "resize" and rec.capacity is None:
            raise LineError("capacity", "required field is missing")
        if rec.scope is not None and op not in SCOPE_OPS:
            raise LineError("scope", f"not an argument of {op}")
        previous = self.last_t.get(rec.thread)
        if previous is not None and rec.t < previous[0]:
            raise LineError("t", f"goes backwards on thread {rec.thread!r}: {rec.t} after "
                            f"{previous[0]} (line {previous[1]})")
        self.last_t[rec.thread] = (rec.t, line)
        fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
        fields["t"] = obj["t"]  # as written (an int stays an int: load(write(ops)) == ops)
        if fields["duration_s"] is not None:
            fields["duration_s"] = obj["duration_s"]
        return TraceOp(line=line, **fields)


def load_op_trace(path: str | Path, skip_bad_lines: bool = False) -> OpTrace:
    """Load and validate an op trace; raises :class:`kvsim.traces.TraceError`."""
    read = read_jsonl(path, _Parser(), skip_bad_lines, what="ops")
    return OpTrace(str(path), tuple(read.records), read.num_lines, read.skipped_lines, read.skipped)


def format_op(op: TraceOp) -> str:
    """One line of the format (no newline)."""
    if op.op not in OPS:
        raise ValueError(f"unknown op {op.op!r}")
    return json.dumps(op.to_json(), separators=(", ", ": "))


def check_trace_target(path: str | Path, option: str) -> Path:
    """``path`` if an op trace may be written there: a new file in a writable directory, or an
    existing op trace (its first line an op); anything else is refused, naming ``option``."""
    from kvsim.output_dir import OutputDirError, check_output_dir, is_writable_dir

    path = Path(path)
    if path.is_dir():
        raise OutputDirError(f"{option} {path}: is a directory")
    if path.exists():
        try:
            with path.open("rb") as f:
                first = json.loads(f.readline(1 << 20) or b"null")
        except (OSError, ValueError):
            first = None
        if not (isinstance(first, dict) and {"t", "thread", "op"} <= set(first)):
            raise OutputDirError(f"{option} {path}: exists and is not an op trace; kvsim "
                                 "overwrites only its own traces")
    parent = path.parent
    if not parent.exists():
        check_output_dir(parent, option)  # a directory to be created: where it would go
    elif not parent.is_dir():
        raise OutputDirError(f"{option} {path}: {parent} is not a directory")
    elif not is_writable_dir(parent):
        raise OutputDirError(f"{option} {path}: {parent} is read-only")
    return path


class OpTraceWriter:
    """Streams ops to a file as they happen (a recorder's sink); use as a context manager.

    Writes go to a temporary sibling, renamed over ``path`` on :meth:`close`, so an interrupted
    recording never leaves a file that looks complete.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._file: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self.num_ops = 0

    def write(self, op: TraceOp) -> None:
        if self._file is None:
            raise ValueError("OpTraceWriter: write() after close()")
        self._file.write(format_op(op) + "\n")
        self.num_ops += 1

    def close(self) -> None:
        """Finish the file and move it into place."""
        if self._file is None:
            return
        self._file.close()
        self._file = None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discard what was written."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> OpTraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_op_trace(path: str | Path, ops: Iterable[TraceOp]) -> int:
    """Write ``ops`` to ``path`` (atomically); returns the number written."""
    with OpTraceWriter(path) as writer:
        for op in ops:
            writer.write(op)
    return writer.num_ops


__all__ = ["OPS", "OpTrace", "OpTraceWriter", "TraceOp", "format_op", "load_op_trace",
           "synth_tokens", "write_op_trace"]

# Every TraceOp field but ``line`` is a key of the format, in KEY_ORDER.
assert tuple(f.name for f in fields(TraceOp) if f.name != "line") == KEY_ORDER
