"""GPU time of an engine's forward passes: prefill and decode steps, from measured terms.

An engine-times file (``kvsim/llm/engines/<gpu>.json``, schema ``kvsim-engine-times/1``) holds,
per architecture, the per-layer terms fitted to forward passes of random-weight decoder layers
on that GPU (``kvsim.calibration.engine_fit``; its ``source`` names the measurement file):

* prefill of ``new`` tokens after ``cached`` ones, per layer:
  ``max(floor, a + b new + d pairs + e cached)`` ms, ``pairs`` the query-key pairs the new tokens
  attend (:func:`attended_pairs`);
* one decode step of a batch, per layer: ``max(floor, a + b B + e K)`` ms, ``B`` the sequences,
  ``K`` the KV tokens they read (each sequence's context, at most the sliding window);
* the LM head on ``T`` tokens: ``h0 + h1 T`` ms (a prefill needs it on its last token only).

An optional ``g_per_new_sq`` in ``prefill_per_layer_ms`` (absent: 0; no shipped file has it) adds
``g new^2`` to the prefill's linear part: the superlinear growth in the new tokens that a
sliding-window prefill on compiled ``flex_attention`` showed at a fixed window
(``reports/validation-h200/prefill/PROTOCOL-5.md``; fitted with ``engine_fit --window-term new_sq``).

A pass's time is ``layers x per layer + head``. Requests prefilled in one pass are priced one
by one and summed (their kernels are not merged): the model is the measured single-sequence
prefill, not a packed batch.

An optional ``cold_shape_ms`` per architecture (absent: 0) is added to a prefill whose shape
the engine has not run before in the process: the first run of a shape costs time the
repeated-shape benchmark never sees (``reports/validation-h200/ttft/README.md``). No shipped
engine file has it; a what-if file does.

Optional, for an engine that bounds its prefill shapes (absent: none; no shipped file has them):

* ``prefill_buckets`` ``{"min", "multiple", "steps_per_doubling", "max"}``: the engine pads a
  prefill's new tokens up to the smallest bucket that holds them (:func:`bucket_list`: ``min``
  x 2^(k / ``steps_per_doubling``), k = 0, 1, ..., each rounded up to a multiple of ``multiple``,
  up to the first at or past ``max``; more new tokens than the largest bucket: not padded). The
  pad tokens are computed as real ones (projections, MLP, attention over the cache and the
  tokens before them), so a prefill is priced at its padded count (:meth:`EngineTimes.padded_new`).
  ``hw.serving_forward`` pads the same way and runs every bucket once before a run, so a run
  meets no prefill shape it has not run.
* ``prefill_attention``: the attention kernel the prefill terms were measured on and the hardware
  engine runs (``flash``: PyTorch's flash kernel for every full-attention prefill; ``default``:
  PyTorch's dispatcher, which picks cuDNN for a prefill with nothing cached on the H200, a kernel
  built once per new sequence length).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.llm.architectures import Architecture

SCHEMA = "kvsim-engine-times/1"
ENGINES_DIR = Path(__file__).resolve().parent / "engines"
PREFILL_ATTENTION = ("default", "flash")
BUCKET_KEYS = ("min", "multiple", "steps_per_doubling", "max")
# Largest bucket rule accepted: one over MAX_SEQUENCE_TOKENS is pointless, and the list stays short.
MAX_BUCKET_TOKENS = 1 << 22


def bucket_list(min_tokens: int, multiple: int, steps_per_doubling: int, max_tokens: int) -> tuple[int, ...]:
    """The padded prefill lengths: ``min_tokens x 2^(k / steps_per_doubling)`` for k = 0, 1, ...,
    each rounded up to a multiple of ``multiple``, duplicates dropped, up to and including the
    first at or past ``max_tokens``."""
    if min(min_tokens, multiple, steps_per_doubling, max_tokens) < 1:
        raise ValueError("prefill_buckets: every field must be >= 1")
    if max_tokens > MAX_BUCKET_TOKENS:
        raise ValueError(f"prefill_buckets: max must be <= {MAX_BUCKET_TOKENS}")
    out: list[int] = []
    k = 0
    while not out or out[-1] < max_tokens:
        v = multiple * math.ceil(min_tokens * 2 ** (k / steps_per_doubling) / multiple)
        if not out or v > out[-1]:
            out.append(v)
        k += 1
    return tuple(out)


def attended_pairs(new: int, cached: int, window: int | None) -> int:
    """Query-key pairs ``new`` tokens attend after ``cached`` ones: new token i sees
    ``min(cached + i + 1, window)`` keys (causal; within the sliding window if any)."""
    if new <= 0:
        return 0
    if window is None:
        return new * cached + new * (new + 1) // 2
    k = min(max(window - cached, 0), new)  # tokens whose span is still under the window
    return k * cached + k * (k + 1) // 2 + (new - k) * window


@dataclass(frozen=True)
class EngineTimes:
    """One architecture's pass times on one GPU (the terms in ms, as fitted)."""

    architecture: Architecture
    gpu: str
    source: str
    prefill_terms: dict[str, float]
    decode_terms: dict[str, float]
    head_terms: dict[str, float]
    cold_shape_ms: float = 0.0
    prefill_buckets: tuple[int, ...] = ()  # padded prefill lengths (empty: no padding)
    prefill_attention: str = "default"

    def padded_new(self, new: int) -> int:
        """The new tokens a prefill of ``new`` runs: the smallest bucket that holds them (no
        buckets, or more than the largest: ``new`` itself)."""
        b = self.prefill_buckets
        if new <= 0 or not b or new > b[-1]:
            return new
        return b[bisect_left(b, new)]

    def _head_ms(self, tokens: int) -> float:
        h = self.head_terms
        return h["h0"] + h["h1_per_token"] * tokens if tokens else 0.0

    def prefill_seconds(self, new: int, cached: int, cold: bool = False) -> float:
        """One sequence's prefill: ``new`` tokens after ``cached`` ones (padded to a bucket where
        the file has them), its last token's head; ``cold``: a shape the process has not run
        before (adds ``cold_shape_ms``)."""
        if new <= 0:
            return 0.0
        new = self.padded_new(new)
        p, arch = self.prefill_terms, self.architecture
        per_layer = max(p["floor"], p["a"] + p["b_per_token"] * new
                        + p["d_per_pair"] * attended_pairs(new, cached, arch.sliding_window)
                        + p["e_per_cached"] * cached + p.get("g_per_new_sq", 0.0) * new * new)
        cold_ms = self.cold_shape_ms if cold else 0.0
        return (arch.layers * per_layer + self._head_ms(1) + cold_ms) * 1e-3

    def decode_seconds(self, contexts: list[int]) -> float:
        """One decode step of sequences with these context lengths (each makes one token)."""
        if not contexts:
            return 0.0
        d, arch = self.decode_terms, self.architecture
        w = arch.sliding_window
        kv = sum(contexts) if w is None else sum(min(c, w) for c in contexts)
        per_layer = max(d["floor"], d["a"] + d["b_per_sequence"] * len(contexts)
                        + d["e_per_context_token"] * kv)
        return (arch.layers * per_layer + self._head_ms(len(contexts))) * 1e-3


def engine_file(name_or_path: str) -> Path:
    """A shipped engine-times preset by GPU name (``h200-sxm``), or a JSON file's path."""
    path = Path(name_or_path)
    if path.suffix == ".json":
        return path
    return ENGINES_DIR / f"{name_or_path}.json"


def known_engines() -> list[str]:
    return sorted(p.stem for p in ENGINES_DIR.glob("*.json"))


def load_engine_times(name_or_path: str, architecture: Architecture) -> EngineTimes:
    """The pass times of ``architecture`` from an engine-times file; a clear error when the file,
    the architecture or a term is missing."""
    path = engine_file(name_or_path)
    if not path.is_file():
        raise ConfigError(f"engine times {name_or_path!r}: no file {path} (shipped: "
                          f"{', '.join(known_engines()) or 'none'})")
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    archs = doc.get("architectures", {})
    entry = archs.get(architecture.name)
    if entry is None:
        raise ConfigError(f"{path}: no terms for architecture {architecture.name!r} "
                          f"(it has: {', '.join(sorted(archs)) or 'none'})")
    needed = {"prefill_per_layer_ms": ("floor", "a", "b_per_token", "d_per_pair", "e_per_cached"),
              "decode_per_layer_ms": ("floor", "a", "b_per_sequence", "e_per_context_token"),
              "head_ms": ("h0", "h1_per_token")}
    terms = {}
    for block, names in needed.items():
        got = entry.get(block, {})
        missing = [n for n in names if not isinstance(got.get(n), (int, float))]
        if missing:
            raise ConfigError(f"{path}: architectures.{architecture.name}.{block} lacks "
                              f"{', '.join(missing)}")
        terms[block] = {n: float(got[n]) for n in names}
    g = entry.get("prefill_per_layer_ms", {}).get("g_per_new_sq")
    if g is not None:
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g < 0:
            raise ConfigError(f"{path}: architectures.{architecture.name}.prefill_per_layer_ms."
                              f"g_per_new_sq must be a number >= 0, got {g!r}")
        terms["prefill_per_layer_ms"]["g_per_new_sq"] = float(g)
    cold = entry.get("cold_shape_ms", 0.0)
    if isinstance(cold, bool) or not isinstance(cold, (int, float)) or cold < 0:
        raise ConfigError(f"{path}: architectures.{architecture.name}.cold_shape_ms must be a "
                          f"number >= 0, got {cold!r}")
    attention = doc.get("prefill_attention", "default")
    if attention not in PREFILL_ATTENTION:
        raise ConfigError(f"{path}: prefill_attention must be one of {', '.join(PREFILL_ATTENTION)}, "
                          f"got {attention!r}")
    return EngineTimes(architecture, str(doc.get("gpu", path.stem)), str(doc.get("source", path)),
                       terms["prefill_per_layer_ms"], terms["decode_per_layer_ms"],
                       terms["head_ms"], float(cold), _buckets(path, doc.get("prefill_buckets")),
                       attention)


def _buckets(path: Path, rule) -> tuple[int, ...]:
    if rule is None:
        return ()
    if not isinstance(rule, dict) or set(rule) != set(BUCKET_KEYS) or not all(
            isinstance(rule[k], int) and not isinstance(rule[k], bool) for k in BUCKET_KEYS):
        raise ConfigError(f"{path}: prefill_buckets must be {{{', '.join(BUCKET_KEYS)}}}, each an "
                          f"integer; got {rule!r}")
    try:
        return bucket_list(*(rule[k] for k in BUCKET_KEYS))
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
