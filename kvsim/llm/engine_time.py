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

A pass's time is ``layers x per layer + head``. Requests prefilled in one pass are priced one
by one and summed (their kernels are not merged): the model is the measured single-sequence
prefill, not a packed batch.

An optional ``cold_shape_ms`` per architecture (absent: 0) is added to a prefill whose shape
the engine has not run before in the process: the first run of a shape costs time the
repeated-shape benchmark never sees (``reports/validation-h200/ttft/README.md``). No shipped
engine file has it; a what-if file does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.llm.architectures import Architecture

SCHEMA = "kvsim-engine-times/1"
ENGINES_DIR = Path(__file__).resolve().parent / "engines"


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

    def _head_ms(self, tokens: int) -> float:
        h = self.head_terms
        return h["h0"] + h["h1_per_token"] * tokens if tokens else 0.0

    def prefill_seconds(self, new: int, cached: int, cold: bool = False) -> float:
        """One sequence's prefill: ``new`` tokens after ``cached`` ones, its last token's head;
        ``cold``: a shape the process has not run before (adds ``cold_shape_ms``)."""
        if new <= 0:
            return 0.0
        p, arch = self.prefill_terms, self.architecture
        per_layer = max(p["floor"], p["a"] + p["b_per_token"] * new
                        + p["d_per_pair"] * attended_pairs(new, cached, arch.sliding_window)
                        + p["e_per_cached"] * cached)
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
    cold = entry.get("cold_shape_ms", 0.0)
    if isinstance(cold, bool) or not isinstance(cold, (int, float)) or cold < 0:
        raise ConfigError(f"{path}: architectures.{architecture.name}.cold_shape_ms must be a "
                          f"number >= 0, got {cold!r}")
    return EngineTimes(architecture, str(doc.get("gpu", path.stem)), str(doc.get("source", path)),
                       terms["prefill_per_layer_ms"], terms["decode_per_layer_ms"],
                       terms["head_ms"], float(cold))
