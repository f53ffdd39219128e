"""The engine time model, fitted to ``python3 -m hw.bench_engine`` and judged on held-out points;
writes the engine-times file the serving simulator reads (``kvsim/llm/engines/<gpu>.json``,
:mod:`kvsim.llm.engine_time`).

Per decoder layer on one GPU, per architecture (terms in ms):

    prefill = max(floor, a + b new + d pairs + e cached)   pairs = sum over the new tokens i of
                                                                   min(cached + i + 1, window)
    decode  = max(floor, a + b B + e K)                    K = sum over the batch of
                                                               min(context, window)
    head    = h0 + h1 T                                    (T tokens through the LM head)

(``floor``: the launch-bound time of a small pass; ``b``: projections and MLP per token or
sequence; ``d``: attention per query-key pair; ``e``: bytes of cached K/V read; ``window`` the
sliding window or none: :func:`kvsim.calibration.prefill_fit.pairs`.) The split is fixed here
before any measurement (:func:`point_role`): on each grid, the rule of
:func:`kvsim.calibration.prefill_fit.role`, a point is **fit** when the sum of its grid indexes
is even, **judge** when odd (prefill: new x cached; decode: batch x context; head: the token
index alone). Prefill and decode are fitted by least squares of the log error on the fit
points, all terms >= 0 (as ``prefill_fit``'s floor model), started from the relative
non-negative least squares of the linear part and from the fit of every nested model (any term
held at 0: a model never fits worse than one it nests, :func:`fit_max_linear`); the head by
relative non-negative least squares.
Target (issue 24): held-out median absolute error <= 5 % per architecture, prefill and decode.
The written terms are rounded to 6 significant digits; every error is of the rounded terms.

The engine-times file also carries, where the measurement has them, the prefill attention kernel
it was measured on (``prefill_attention``, from the bench's ``--prefill-attention``) and, with
``--prefill-buckets MIN,MULTIPLE,STEPS,MAX``, the bucket rule of an engine that pads its prefills
(:func:`kvsim.llm.engine_time.bucket_list`). With ``--window-term new_sq`` (call 5,
``reports/validation-h200/prefill/PROTOCOL-5.md``), an architecture with a sliding window gets
one more prefill term, ``g new^2`` (``g_per_new_sq``, all terms still >= 0): its prefill is
``max(floor, a + b new + d pairs + e cached + g new^2)``; full-attention architectures keep the
five terms, and without the option every output is as before. Not judged, reported: each
prefill point's first run against its warm median (:func:`first_runs`).

    python -m kvsim.calibration.engine_fit MEASUREMENT.json[.xz] [--out FIT.json] [--engine ENGINE.json]
        [--prefill-buckets MIN,MULTIPLE,STEPS,MAX] [--window-term new_sq]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.calibration.cpu_fit import relative_nnls
from kvsim.calibration.packed import read_json
from kvsim.calibration.prefill_fit import TARGET_MEDIAN_APE_PCT, pairs, role, role_errors

ENGINE_SCHEMA = "kvsim-engine-times/1"
SIGNIFICANT = 6  # digits kept in the written terms: byte-stable across numeric libraries
# A term whose largest contribution on the grid is under 1e-9 of the largest time is the
# solver's approach to its bound 0 (least_squares stays strictly inside bounds): written as 0.
SNAP_TO_ZERO = 1e-9
# A candidate replaces an earlier one only where its cost is lower by more than this fraction,
# 100 times least_squares' own ftol: fits equal within the solver's tolerance (an inactive
# floor at 0 or not) keep the first, the two first starts' result.
COST_TIE = 1e-6
WINDOW_TERMS = ("none", "new_sq")  # --window-term: the extra prefill term of windowed architectures
PREFILL_TERMS = ("floor", "a", "b_per_token", "d_per_pair", "e_per_cached")


def point_role(r: dict, keys: tuple[str, ...], grid: dict) -> str:
    """``fit``, ``judge`` or ``off-grid`` of a record by :func:`~kvsim.calibration.prefill_fit.role`
    on its grid: ``keys`` the record's one or two grid coordinates (a 1-D grid is the 2-D one
    with a single column)."""
    first = (r[keys[0]], tuple(grid[keys[0]]))
    second = (r[keys[1]], tuple(grid[keys[1]])) if len(keys) > 1 else (0, (0,))
    return role(first[0], second[0], first[1], second[1])


def kv_read(batch: int, context: int, window: int | None) -> float:
    """KV tokens a decode step reads: ``batch`` x min(context, window)."""
    return float(batch * (context if window is None else min(context, window)))


def prefill_features(new: int, cached: int, window: int | None,
                     window_term: str = "none") -> list[float]:
    """The linear part's features: 1, new, pairs, cached; and new^2 where ``window_term`` is
    ``new_sq`` and the architecture has a window."""
    f = [1.0, float(new), pairs(new, cached, window), float(cached)]
    if window is not None and window_term == "new_sq":
        f.append(float(new) * float(new))
    return f


def prefill_term_names(window: int | None, window_term: str = "none") -> tuple[str, ...]:
    return PREFILL_TERMS + (("g_per_new_sq",) if window is not None and window_term == "new_sq"
                            else ())


def decode_features(batch: int, context: int, window: int | None) -> list[float]:
    return [1.0, float(batch), kv_read(batch, context, window)]


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT}g}")


def max_linear(p: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``max(p[0], X @ p[1:])``: a floor, then the linear terms."""
    return np.maximum(p[0], X @ p[1:])


def _log_cost(p: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Half the sum of squared log errors of :func:`max_linear` (least_squares' ``cost``)."""
    r = np.log(np.maximum(max_linear(p, X), 1e-12) / y)
    return 0.5 * float(r @ r)


def _fit_free(X: np.ndarray, y: np.ndarray, free: tuple[int, ...],
              memo: dict[tuple[int, ...], np.ndarray]) -> np.ndarray:
    """The lowest-cost (floor, terms) >= 0 found with the parameters outside ``free`` (0 the
    floor, i the i-th column) held at 0; ``memo`` holds every subset's result. Starts: the free
    columns' relative NNLS with a floor at the smallest time, and with none (the floor's start
    where it is free); then, for each free parameter, the result of the model without it (that
    parameter at 0), each of which is itself so fitted. The first starts' least_squares
    results are compared as before (the lower kept); then every start, and least_squares'
    result from each nested start, replaces it only where lower by more than
    :data:`COST_TIE` (relative), so fits equal within the solver's tolerance keep the first
    starts' result. So the result is never worse than any nested model's by more than that."""
    from scipy.optimize import least_squares

    if free in memo:
        return memo[free]
    n = X.shape[1] + 1
    cols = [i - 1 for i in free if i > 0]
    lin = np.zeros(n - 1)
    if cols:
        lin[cols] = np.maximum(relative_nnls(X[:, cols], y), 1e-12)
    first = [np.r_[y.min(), lin], np.r_[0.0, lin]] if 0 in free else [np.r_[0.0, lin]]
    nested = [_fit_free(X, y, tuple(i for i in free if i != j), memo) for j in free] \
        if len(free) > 1 else []
    idx = list(free)

    def embed(q: np.ndarray) -> np.ndarray:
        p = np.zeros(n)
        p[idx] = q
        return p

    def solve(start: np.ndarray) -> np.ndarray:
        return embed(least_squares(
            lambda q: np.log(np.maximum(max_linear(embed(q), X), 1e-12) / y), start[idx],
            bounds=(0.0, np.inf), x_scale="jac").x)

    best, best_cost = None, np.inf
    for cand in map(solve, first):  # the first starts' results, the lower kept (as before)
        c = _log_cost(cand, X, y)
        if c < best_cost:
            best, best_cost = cand, c
    # then every start, and least_squares' result from each nested start
    for cand in [*first, *(r for start in nested for r in (start, solve(start)))]:
        c = _log_cost(cand, X, y)
        if c < best_cost * (1 - COST_TIE):
            best, best_cost = cand, c
    memo[free] = best
    return best


def fit_max_linear(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(floor, linear terms) >= 0 minimising the sum of squared log errors of :func:`max_linear`.
    Columns are scaled to unit maximum for the solver. Starts: the linear part's relative NNLS
    with a floor at the smallest time, and with none; then the fit of every nested model (the
    floor or any columns held at 0, :func:`_fit_free`, 2^(terms) small fits). The lowest cost is
    kept, so a model never fits worse than a model it nests (call 5's six-term prefill, whose
    two starts stopped at 3 times the cost of the five-term fit it contains: issue 24)."""
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    s = np.abs(X).max(axis=0)
    s[s == 0] = 1.0
    Xs = X / s
    best = _fit_free(Xs, y, tuple(range(X.shape[1] + 1)), {})
    p = np.where(best < SNAP_TO_ZERO * y.max(), 0.0, best)  # a term at its bound is 0
    return np.r_[p[0], p[1:] / s]


def _judge(rows: list[dict], keys: tuple[str, ...], grid: dict, measured: str,
           predict: Callable[[dict], float]) -> list[dict]:
    pts = []
    for r in rows:
        pred = predict(r)
        pts.append({**{k: r[k] for k in keys}, "role": point_role(r, keys, grid),
                    "measured_ms": r[measured],
                    "predicted_ms": pred, "error_pct": (pred / r[measured] - 1) * 100})
    return pts


def _on_grid(rows: list[dict], grid: dict, keys: tuple[str, ...]) -> list[dict]:
    return [r for r in rows if r["verified"] and all(r[k] in grid[k] for k in keys)]


def _fit_mode(rows: list[dict], grid: dict, keys: tuple[str, str], feats: Callable[[dict], list],
              names: tuple[str, ...]) -> dict:
    rows = _on_grid(rows, grid, keys)
    fit_rows = [r for r in rows if point_role(r, keys, grid) == "fit"]
    if len(fit_rows) < len(names):
        raise ValueError(f"{len(fit_rows)} fit points, too few for {len(names)} terms")
    p = fit_max_linear(np.array([feats(r) for r in fit_rows]),
                       np.array([r["per_layer_ms"] for r in fit_rows]))
    p = np.array([_round(v) for v in p])
    points = _judge(rows, keys, grid, "per_layer_ms",
                    lambda r: float(max_linear(p, np.array([feats(r)]))[0]))
    return {"terms": dict(zip(names, map(float, p))), "errors": role_errors(points), "points": points}


def _fit_head(rows: list[dict], grid: dict) -> dict:
    rows = _on_grid(rows, grid, ("tokens",))
    fit_rows = [r for r in rows if point_role(r, ("tokens",), grid) == "fit"]
    if len(fit_rows) < 2:
        raise ValueError(f"{len(fit_rows)} head fit points, too few for 2 terms")
    h = relative_nnls([[1.0, float(r["tokens"])] for r in fit_rows],
                      [r["median_ms"] for r in fit_rows])
    h0, h1 = _round(h[0]), _round(h[1])
    points = _judge(rows, ("tokens",), grid, "median_ms", lambda r: h0 + h1 * r["tokens"])
    return {"terms": {"h0": h0, "h1_per_token": h1}, "errors": role_errors(points), "points": points}


def first_runs(records: list[dict]) -> dict:
    """Prefill points' first call against their warm median (ms, the whole forward), split by
    whether the point's new-token count had run before in the process: median and max of
    ``first_ms - median_ms``, and the points. Empty where the bench did not time first runs."""
    out: dict[str, Any] = {}
    for seen, key in ((False, "new_count_first_seen"), (True, "new_count_seen_before")):
        rows = [r for r in records if r["mode"] == "prefill" and "first_ms" in r
                and r.get("new_seen_before") is seen]
        if not rows:
            continue
        extra = [r["first_ms"] - r["median_ms"] for r in rows]
        out[key] = {"points": len(rows), "median_extra_ms": float(np.median(extra)),
                    "max_extra_ms": float(max(extra)),
                    "by_point": [{"new": r["new"], "cached": r["cached"], "first_ms": r["first_ms"],
                                  "median_ms": r["median_ms"]} for r in rows]}
    return out


def fit(measurement: dict, window_term: str = "none") -> dict:
    """Per architecture and mode: the fitted terms (ms), the fit and held-out errors, every point;
    ``window_term`` ``new_sq``: windowed architectures' prefill gets the ``g new^2`` term."""
    if window_term not in WINDOW_TERMS:
        raise ValueError(f"window_term must be one of {', '.join(WINDOW_TERMS)}, got {window_term!r}")
    g = measurement["grid"]
    grid = {"new": g["new"], "cached": g["cached"], "batch": g["batch"],
            "context": g["context"], "tokens": g["head_tokens"]}
    out: dict[str, Any] = {
        "model": {"prefill": "per layer: max(floor, a + b new + d pairs + e cached) (ms)",
                  "decode": "per layer: max(floor, a + b B + e K), K = B min(context, window) (ms)",
                  "head": "h0 + h1 T (ms)"},
        "target_median_ape_pct": TARGET_MEDIAN_APE_PCT, "architectures": {}}
    if window_term == "new_sq":
        out["model"]["prefill_windowed"] = ("per layer, sliding window: max(floor, a + b new + "
                                            "d pairs + e cached + g new^2) (ms)")
    for name, arch in measurement["architectures"].items():
        w = arch.get("sliding_window")
        recs = [r for r in measurement["records"] if r["arch"] == name]
        entry: dict[str, Any] = {"layers": arch["layers"], "sliding_window": w}
        by_mode = {m: [r for r in recs if r["mode"] == m] for m in ("prefill", "decode", "head")}
        if by_mode["prefill"]:
            entry["prefill"] = _fit_mode(
                by_mode["prefill"], grid, ("new", "cached"),
                lambda r, w=w: prefill_features(r["new"], r["cached"], w, window_term),
                prefill_term_names(w, window_term))
        if by_mode["decode"]:
            entry["decode"] = _fit_mode(
                by_mode["decode"], grid, ("batch", "context"),
                lambda r, w=w: decode_features(r["batch"], r["context"], w),
                ("floor", "a", "b_per_sequence", "e_per_context_token"))
        if by_mode["head"]:
            entry["head"] = _fit_head(by_mode["head"], grid)
        runs = first_runs(recs)
        if runs:
            entry["prefill_first_run"] = runs
        for m in ("prefill", "decode"):
            med = entry.get(m, {}).get("errors", {}).get("judge", {}).get("median_ape_pct")
            entry[f"{m}_met"] = med is not None and med <= TARGET_MEDIAN_APE_PCT
        out["architectures"][name] = entry
    return out


def source_line(measurement: dict, path: str) -> str:
    """``<path> (<date>, <GPU>, driver <v>, torch <v>)`` from the measurement's provenance."""
    prov = measurement.get("provenance", {})
    driver = prov.get("nvml", {}).get("driver_version", "unknown")
    return (f"{path} ({prov.get('date_utc', 'unknown')}, {prov.get('gpu_name', prov.get('device'))}, "
            f"driver {driver}, torch {prov.get('torch', 'unknown')})")


def engine_doc(result: dict, gpu: str, source: str, command: str,
               prefill_attention: str | None = None, prefill_buckets: dict | None = None) -> dict:
    """The engine-times document (schema ``kvsim-engine-times/1``) of a :func:`fit` result with
    all three modes for every architecture; ``prefill_attention`` and ``prefill_buckets``
    (:mod:`kvsim.llm.engine_time`) written where given."""
    archs = {}
    for name, e in result["architectures"].items():
        missing = [m for m in ("prefill", "decode", "head") if m not in e]
        if missing:
            raise ValueError(f"{name}: no {', '.join(missing)} fit; an engine-times file needs all")
        archs[name] = {
            "prefill_per_layer_ms": e["prefill"]["terms"],
            "decode_per_layer_ms": e["decode"]["terms"],
            "head_ms": e["head"]["terms"],
            "held_out": {
                "prefill_median_ape_pct": round(e["prefill"]["errors"]["judge"]["median_ape_pct"], 3),
                "decode_median_ape_pct": round(e["decode"]["errors"]["judge"]["median_ape_pct"], 3),
                "prefill_met": e["prefill_met"], "decode_met": e["decode_met"]}}
    doc = {"schema": ENGINE_SCHEMA, "gpu": gpu, "source": source, "fit": command,
           "architectures": archs}
    if prefill_attention is not None:
        doc["prefill_attention"] = prefill_attention
    if prefill_buckets is not None:
        doc["prefill_buckets"] = prefill_buckets
    return doc


def parse_buckets(text: str) -> dict:
    """``MIN,MULTIPLE,STEPS,MAX`` -> the engine-times file's ``prefill_buckets`` rule (checked by
    building its list)."""
    from kvsim.llm.engine_time import BUCKET_KEYS, bucket_list

    parts = text.split(",")
    if len(parts) != len(BUCKET_KEYS) or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--prefill-buckets takes {','.join(k.upper() for k in BUCKET_KEYS)}, "
                         f"four integers; got {text!r}")
    rule = dict(zip(BUCKET_KEYS, (int(p) for p in parts)))
    bucket_list(*rule.values())
    return rule


def dumps(doc: dict) -> str:
    """Byte-deterministic JSON text of ``doc``."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvsim.calibration.engine_fit")
    ap.add_argument("measurement")
    ap.add_argument("--out", default=None, help="the fit with every point (JSON)")
    ap.add_argument("--engine", default=None, help="the engine-times file to write")
    ap.add_argument("--gpu", default="h200-sxm", help="the engine-times file's gpu name")
    ap.add_argument("--prefill-buckets", default=None, metavar="MIN,MULTIPLE,STEPS,MAX",
                    help="write this prefill bucket rule into the engine-times file")
    ap.add_argument("--window-term", default="none", choices=WINDOW_TERMS,
                    help="new_sq: a g new^2 prefill term for sliding-window architectures (call 5)")
    args = ap.parse_args(argv)
    try:
        buckets = parse_buckets(args.prefill_buckets) if args.prefill_buckets else None
    except ValueError as e:
        ap.error(str(e))
    measurement = read_json(Path(args.measurement))
    result = fit(measurement, args.window_term)
    for name, e in result["architectures"].items():
        for m in ("prefill", "decode", "head"):
            if m not in e:
                print(f"{name:18} {m:7} not measured")
                continue
            f, j = e[m]["errors"]["fit"], e[m]["errors"]["judge"]
            verdict = "" if m == "head" else \
                f" (target <= {TARGET_MEDIAN_APE_PCT} %: {'met' if e[f'{m}_met'] else 'missed'})"
            print(f"{name:18} {m:7} fit {f['points']} pts median {f['median_ape_pct']:.2f} %, "
                  f"worst {f['worst_ape_pct']:.2f} %; held out {j['points']} pts median "
                  f"{j['median_ape_pct']:.2f} %, worst {j['worst_ape_pct']:.2f} %{verdict}")
        for key, v in e.get("prefill_first_run", {}).items():
            print(f"{name:18} first run, {key}: {v['points']} pts, extra over the warm median "
                  f"{v['median_extra_ms']:.2f} ms (median), {v['max_extra_ms']:.2f} ms (max)")
    command = "python -m kvsim.calibration.engine_fit " + " ".join(argv or sys.argv[1:])
    if args.out:
        Path(args.out).write_text(dumps({**result, "source": source_line(measurement, args.measurement),
                                         "fit": command}))
    if args.engine:
        doc = engine_doc(result, args.gpu, source_line(measurement, args.measurement), command,
                         measurement.get("config", {}).get("prefill_attention"), buckets)
        Path(args.engine).parent.mkdir(parents=True, exist_ok=True)
        Path(args.engine).write_text(dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
