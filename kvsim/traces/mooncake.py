"""Mooncake request traces (FAST'25): loading, validation and deterministic tokens.

Format: JSONL, one request a line, in arrival order::

    {"timestamp": 40, "input_length": 23769, "output_length": 3, "hash_ids": [151, 152, ...]}

* ``timestamp``: arrival time in milliseconds (int or float, >= 0, never decreasing);
* ``input_length`` / ``output_length``: prompt and generated tokens (ints in [0, 2**26],
  :data:`kvsim.manager.limits.MAX_SEQUENCE_TOKENS`);
* ``hash_ids``: one id (int >= 0) per 512-token block of the prompt, in order; equal ids mean
  the same block *and* the same prefix before it, so they mark reusable prefixes. At most
  ``ceil(input_length / 512)`` of them (the last block may be partial); fewer is accepted, and the
  blocks without an id get tokens no other request has.

Other keys are ignored. :func:`load_mooncake` rejects a bad line with ``FILE:LINE: FIELD: rule``
(or, with ``skip_bad_lines``, counts it and lists the first few); see :mod:`kvsim.traces`.

Tokens (:func:`tokens_for`): block ``i`` of a request is ``perm(hash_ids[i]) XOR P[j]`` for its
positions ``j = 0..511``, where ``perm`` is a bijection of 32-bit integers (Wellons' lowbias32) and
``P`` a fixed table of 512 mixed position values. So equal ids give equal blocks, different ids
(below 2**32) differ at *every* position, a partial last block is a prefix of the full block, and
the result does not depend on the manager's ``tokens_per_block``. Ids of 2**32 or more are folded
to 32 bits first (then two distinct ids may, very rarely, collide). Blocks without an id and the
generated (output) tokens come from a per-request stream (:func:`kvsim.traces.stream_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.traces import (
    JsonlRead,
    LineError,
    SkippedLine,
    check_int,
    check_number,
    mix64,
    read_jsonl,
    skip_summary,
    stream_tokens,
)

BLOCK_TOKENS = 512  # tokens per Mooncake hash block
MAX_HASH_ID = (1 << 63) - 1
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")

# Stream domains for tokens that no hash id names (kept apart from each other).
_TAIL_DOMAIN = 0x6D6F6F6E_7461696C  # "moontail"
_OUTPUT_DOMAIN = 0x6D6F6F6E_6F757470  # "moonoutp"


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    index: int  # 0-based position among the trace's accepted requests
    line: int  # 1-based line in the file
    timestamp_ms: float  # int in the published traces; kept as read
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def arrival_s(self) -> float:
        return self.timestamp_ms / 1000.0

    @property
    def num_blocks(self) -> int:
        """512-token blocks of the prompt, the partial last one included."""
        return math.ceil(self.input_length / BLOCK_TOKENS)


@dataclass(frozen=True)
class MooncakeTrace:
    path: str
    requests: tuple[MooncakeRequest, ...]
    num_lines: int
    skipped_lines: int  # bad lines skipped (only with skip_bad_lines)
    skipped: tuple[SkippedLine, ...]  # the first few of them, with their line numbers

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_length for r in self.requests)

    def skip_summary(self) -> str:
        return skip_summary(self.path, self.skipped_lines, self.skipped)


class _Parser:
    """Validates one line; remembers the last accepted timestamp (only on success)."""

    def __init__(self) -> None:
        self.count = 0
        self.last_timestamp: float | None = None
        self.last_line = 0

    def __call__(self, obj: dict, line: int) -> MooncakeRequest:
        for name in FIELDS:
            if name not in obj:
                raise LineError(name, "required field is missing")
        timestamp = check_number(obj, "timestamp")
        input_length = check_int(obj, "input_length", maximum=MAX_SEQUENCE_TOKENS)
        output_length = check_int(obj, "output_length", maximum=MAX_SEQUENCE_TOKENS)
        ids = obj["hash_ids"]
        if not isinstance(ids, list):
            raise LineError("hash_ids", f"must be a list of integers, got {type(ids).__name__}")
        for i, h in enumerate(ids):
            if type(h) is not int:  # noqa: E721 - bool is an int subclass and is not an id
                raise LineError(f"hash_ids[{i}]", f"must be an integer, got {h!r}")
            if not 0 <= h <= MAX_HASH_ID:
                raise LineError(f"hash_ids[{i}]", f"must be in [0, 2**63), got {h}")
        limit = math.ceil(input_length / BLOCK_TOKENS)
        if len(ids) > limit:
            raise LineError("hash_ids", f"{len(ids)} ids for input_length {input_length}: at most "
                            f"ceil({input_length} / {BLOCK_TOKENS}) = {limit}")
        if self.last_timestamp is not None and timestamp < self.last_timestamp:
            raise LineError("timestamp", f"goes backwards: {timestamp} after {self.last_timestamp} "
                            f"(line {self.last_line})")
        self.last_timestamp, self.last_line = timestamp, line
        request = MooncakeRequest(self.count, line, timestamp, input_length, output_length,
                                  tuple(ids))
        self.count += 1
        return request


def tiled(trace: MooncakeTrace, copies: int, span_s: float) -> MooncakeTrace:
    """``copies`` back-to-back copies of ``trace`` stretched over ``span_s`` seconds in all: a
    longer trace of the same statistics (the benchmarks' one-hour trace: 3 copies of the 1,024 s
    synthetic trace over 3,600 s is 11,979 requests). Each copy's arrivals are scaled to
    ``span_s / copies`` and its hash ids offset past the previous copy's, so copies share no
    blocks (new users, not repeated prompts); within a copy reuse is as in the original."""
    reqs = trace.requests
    if copies < 1 or not reqs:
        raise ValueError(f"need copies >= 1 and a non-empty trace, got {copies}, {len(reqs)}")
    last_ms = max(r.timestamp_ms for r in reqs) or 1.0
    each_ms = span_s * 1000.0 / copies
    id_span = 1 + max((max(r.hash_ids) for r in reqs if r.hash_ids), default=0)
    out = [MooncakeRequest(k * len(reqs) + r.index, r.line,
                           k * each_ms + r.timestamp_ms * each_ms / last_ms, r.input_length,
                           r.output_length, tuple(h + k * id_span for h in r.hash_ids))
           for k in range(copies) for r in reqs]
    return MooncakeTrace(f"{trace.path} x{copies} over {span_s:g} s", tuple(out),
                         trace.num_lines * copies, 0, ())


def load_mooncake(path: str | Path, skip_bad_lines: bool = False) -> MooncakeTrace:
    """Load and validate a Mooncake JSONL trace; raises :class:`kvsim.traces.TraceError`."""
    read: JsonlRead = read_jsonl(path, _Parser(), skip_bad_lines, what="requests")
    return MooncakeTrace(str(path), tuple(read.records), read.num_lines, read.skipped_lines,
                         read.skipped)


# -- tokens ----------------------------------------------------------------------------------------

def _lowbias32(x: np.ndarray) -> np.ndarray:
    """Chris Wellons' lowbias32: xorshifts and odd multiplies, a bijection of uint32."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _fold32(ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.uint64)
    return ((ids ^ (ids >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


# P[j]: one mixed value per position of a block, fixed forever (changing it changes every token).
POSITION_TABLE = (mix64(np.arange(BLOCK_TOKENS, dtype=np.uint64)) >> np.uint64(32)).astype(np.uint32)


def block_tokens(hash_ids: np.ndarray | list[int] | tuple[int, ...]) -> np.ndarray:
    """The full 512-token blocks of ``hash_ids``, shape ``(len(hash_ids), 512)``, uint32."""
    ids = _fold32(np.asarray(hash_ids, dtype=np.uint64).reshape(-1))
    return _lowbias32(ids)[:, None] ^ POSITION_TABLE[None, :]


def tokens_for(request: MooncakeRequest) -> np.ndarray:
    """The request's ``input_length`` prompt tokens (uint32), derived from its hash ids."""
    n = request.input_length
    named = min(len(request.hash_ids) * BLOCK_TOKENS, n)
    if named == n:
        if not request.hash_ids:
            return np.zeros(0, dtype=np.uint32)
        return block_tokens(request.hash_ids).reshape(-1)[:n]
    out = np.empty(n, dtype=np.uint32)
    if request.hash_ids:
        out[:named] = block_tokens(request.hash_ids).reshape(-1)[:named]
    out[named:] = stream_tokens(_TAIL_DOMAIN, request.index, named, n - named)
    return out


def output_tokens_for(request: MooncakeRequest, start: int = 0, count: int | None = None) -> np.ndarray:
    """Generated tokens ``start .. start + count`` (default: all ``output_length``) of a request.

    No other request shares them: they come from the request's own stream.
    """
    if count is None:
        count = request.output_length - start
    return stream_tokens(_OUTPUT_DOMAIN, request.index, start, count)
