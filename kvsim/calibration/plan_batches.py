"""Plan-shaped copy batches: which batches ``hw.bench_plan_batches`` measures, the pre-registered
fit/judge split, and the judging of the copy model and the copy-path selector on them.

Pure Python (no CUDA). Three sources of batches, each a description (a dict, the batch list's
schema ``kvsim-plan-batch-list/1``) of direction, pool slot sizes, page count, slot arrays and pool
sizes:

* :func:`scenario_batches` -- the copy batches of the manager plans of every shipped scenario that
  the simulator or the plan executor runs (the rule of ``tools/check_results_unchanged.py``: not
  sweeps, not ``executor: hw``), base run and variants. Offload and onboard batches between levels
  0 and 1 are kept (intra-level ones are outside the link model). One description per distinct
  (direction, pool slot sizes, pages), with the real slot arrays and pool sizes of its first
  occurrence; a scenario file that makes more than :data:`MAX_SHAPES` page counts for one
  (direction, slot sizes) is binned by powers of two, the bin's median batch standing for it.
  Each description counts the plan batches it stands for.
* :func:`seed_burst_batch` -- the seed burst's shape (6380 pages of 2 x 8 KiB, offload) on
  scattered slots of the seed scenario's pools: the batch the seed-burst target is judged on.
* :func:`layout_sweep` -- :data:`SWEEP_LAYOUTS` x :data:`SWEEP_PAGES` (capped at
  :data:`MAX_BATCH_BYTES`) x scattered / sorted slots x offload / onboard.

The split (:func:`role`, fixed here before any measurement; PROTOCOL.md states it too): **fit** =
sweep batches on scattered slots whose layout is one of :data:`FIT_LAYOUTS`, both directions, every
page count; **judge** = everything else, every scenario batch and the seed burst included.

``python -m kvsim.calibration.plan_batches list [--json FILE|-] [--quick]`` writes the list;
``python -m kvsim.calibration.plan_batches judge MEASUREMENT.json [--hardware h200-sxm]
[--out FILE]`` judges a measurement (:func:`judge`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hw.bench_plan_batches import (
    LIST_SCHEMA,
    SELECT,
    encode_slots,
    slot_arrays,
)
from kvsim.calibration.packed import read_json

REPO = Path(__file__).resolve().parents[2]
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

DIRECTIONS = ("offload", "onboard")
ORDERS = ("scattered", "sorted")
SWEEP_LAYOUTS: tuple[tuple[int, ...], ...] = (
    (16 * KIB,), (8 * KIB, 8 * KIB), (4 * KIB,) * 4, (64 * KIB,), (128 * KIB, 128 * KIB), (1 * MIB,))
SWEEP_PAGES = (64, 256, 1024, 4096, 20000)
MAX_BATCH_BYTES = 2 * GIB          # page counts above this are replaced by the cap
POOL_HEADROOM = 1.25               # sweep pools: slots = ceil(1.25 x the layout's largest batch)
SWEEP_SEED = 20260123
MAX_SHAPES = 16                    # distinct page counts per (file, direction, layout) before binning
DEVICE_MEMORY_LIMIT = 139 * GIB    # the H200's memory
HOST_PINNED_LIMIT = 32 * GIB       # pinned host memory allowed at one time

# ---- the pre-registered split: fixed before any measurement, stated in PROTOCOL.md -------------
FIT_LAYOUTS: tuple[tuple[int, ...], ...] = ((8 * KIB, 8 * KIB), (64 * KIB,), (1 * MIB,))
FIT_RULE = ("fit = the layout sweep's batches on scattered slots whose pool layout is 2 x 8 KiB, "
            "1 x 64 KiB or 1 x 1 MiB (both directions, every page count); judge = every other "
            "batch: the sweep's other layouts, every sorted-slot batch, the seed burst on "
            "scattered slots, and every batch from the shipped scenarios' plans")
TARGETS = {
    "model_median_ape_pct": 3.0,      # judged points: median |predicted - measured| / measured
    "model_p90_ape_pct": 10.0,        # judged points: 90th percentile of the same
    "selector_within_pct": 5.0,       # every batch: the pick's measured time <= 1.05 x the best
    "seed_burst_min_gbps": 49.7,      # seed burst, scattered slots, the selector's pick
}
SEED_BURST = ("offload", (8 * KIB, 8 * KIB), 6380)
SEED_BURST_SCENARIO = "scenarios/seed/burst_resize.yaml"
QUICK_SCENARIOS = (SEED_BURST_SCENARIO,)


def role(batch: dict) -> str:
    """'fit' or 'judge' by the pre-registered rule (see :data:`FIT_RULE`)."""
    fit = (batch["source"] == "sweep" and batch["order"] == "scattered"
           and tuple(batch["pool_slot_bytes"]) in FIT_LAYOUTS)
    return "fit" if fit else "judge"


def layout_name(shape: Sequence[int]) -> str:
    def size(n: int) -> str:
        return f"{n // MIB}MiB" if n % MIB == 0 else f"{n // KIB}KiB" if n % KIB == 0 else f"{n}B"

    if len(set(shape)) == 1:
        return f"{len(shape)}x{size(shape[0])}"
    return "+".join(size(s) for s in shape)


def _seed(text: str) -> int:
    return (SWEEP_SEED * 1_000_003 + zlib.crc32(text.encode())) & 0xFFFFFFFF


def _describe(source: str, bid: str, direction: str, shape: Sequence[int], pages: int,
              order: str, device_slots: int, host_slots: int, slots: dict, **extra: Any) -> dict:
    shape = [int(s) for s in shape]
    d = {"id": bid, "source": source, "direction": direction,
         "src_level": 0 if direction == "offload" else 1,
         "dst_level": 1 if direction == "offload" else 0,
         "pool_slot_bytes": shape, "layout": layout_name(shape), "page_bytes": sum(shape),
         "pages": int(pages), "bytes": int(pages) * sum(shape), "order": order,
         "pool_slots": {"device": int(device_slots), "host": int(host_slots)}, "slots": slots,
         "quick": False, **extra}
    d["role"] = role(d)
    return d


# ---------------------------------------------------------------------------- (b) the sweep

def sweep_pages(shape: Sequence[int]) -> list[int]:
    """The page counts of one layout: :data:`SWEEP_PAGES`, each capped at MAX_BATCH_BYTES."""
    cap = MAX_BATCH_BYTES // sum(shape)
    return sorted({min(n, cap) for n in SWEEP_PAGES})


def sweep_pool_slots(shape: Sequence[int]) -> int:
    return math.ceil(POOL_HEADROOM * max(sweep_pages(shape)))


QUICK_SWEEP = {((8 * KIB, 8 * KIB), 256, "scattered"), ((8 * KIB, 8 * KIB), 4096, "scattered"),
               ((64 * KIB,), 1024, "scattered"), ((16 * KIB,), 1024, "sorted"),
               ((4 * KIB,) * 4, 1024, "scattered")}


def layout_sweep() -> list[dict]:
    """Every layout x page count x order x direction (see the module docstring)."""
    out = []
    for shape in SWEEP_LAYOUTS:
        slots = sweep_pool_slots(shape)
        for pages in sweep_pages(shape):
            for order in ORDERS:
                for direction in DIRECTIONS:
                    bid = f"sweep/{direction}/{layout_name(shape)}/n{pages}/{order}"
                    desc = ({"kind": "sorted"} if order == "sorted" else
                            {"kind": "hashed_choice", "src_seed": _seed(bid + "/src"),
                             "dst_seed": _seed(bid + "/dst")})
                    b = _describe("sweep", bid, direction, shape, pages, order, slots, slots, desc)
                    b["quick"] = (tuple(shape), pages, order) in QUICK_SWEEP
                    out.append(b)
    return out


# ---------------------------------------------------------------------------- (a) the scenarios

def scenario_files() -> list[Path]:
    """The shipped scenarios the simulator or the plan executor runs (sweeps and ``executor: hw``
    left out), as ``tools/check_results_unchanged.py`` enumerates them, less the serving
    scenarios: the protocol's set is the scenarios shipped when it was committed, and serving
    (issue 24) came later."""
    import yaml

    from kvsim.scenario.load import shipped_scenario_files

    return [p for p in shipped_scenario_files(REPO)
            if (yaml.safe_load(p.read_text()).get("workload") or {}).get("kind") != "serving"]


@dataclasses.dataclass
class Captured:
    """One copy batch of a plan, where it came from, and the level sizes of its pool group."""

    where: str
    api: str
    batch: Any  # kvsim.manager.plan.CopyBatch
    device_slots: int
    host_slots: int
    num_levels: int


@contextlib.contextmanager
def _capturing(sink: list[Captured], where: list[str]) -> Iterator[None]:
    """While active, every workload the scenario executors build reports each call's copy batches
    to ``sink`` (the executors look ``build_workload`` up when they run, so wrapping it here sees
    every call, setup and threads, in the order the executor makes them)."""
    import kvsim.scenario.executors as executors
    from kvsim.runtime.steps import Call, Workload

    original = executors.build_workload

    def build(spec: Any, config: Any, manager: Any, seed: int) -> Workload:
        workload = original(spec, config, manager, seed)
        lay = manager.layout

        def wrap(call: Call) -> Call:
            invoke = call.invoke

            def run() -> Any:
                outcome = invoke()
                for b in outcome.plan.copies:
                    g = b.pool_group
                    sink.append(Captured(where[0], call.api.label, b,
                                         int(lay.level_slots[0][g]),
                                         int(lay.level_slots[1][g]) if lay.num_levels > 1 else 0,
                                         lay.num_levels))
                return outcome
            return dataclasses.replace(call, invoke=run)

        def steps(it: Iterator[Any]) -> Iterator[Any]:
            value = None  # what the executor sends back (a Now's time, a GpuWork's times)
            while True:
                try:
                    s = it.send(value) if value is not None else next(it)
                except StopIteration:
                    return
                value = yield wrap(s) if isinstance(s, Call) else s

        make = workload.make_threads
        return Workload([wrap(c) for c in workload.setup],
                        lambda: {name: steps(iter(t)) for name, t in make().items()},
                        workload.holds, workload.summary)

    executors.build_workload = build
    try:
        yield
    finally:
        executors.build_workload = original


def capture_plans(files: Sequence[str | Path] | None = None, variants: bool = True) -> tuple[
        list[Captured], dict]:
    """Run each scenario (base, and every variant with ``variants``) and collect its plans' copy
    batches. Returns (captured batches, counts of what ran and what was left out)."""
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import execute

    paths = [REPO / p for p in files] if files is not None else scenario_files()
    sink: list[Captured] = []
    where = [""]
    runs = []
    with _capturing(sink, where):
        for path in paths:
            rel = str(Path(path).resolve().relative_to(REPO))
            sf = load_scenario_file(path)
            todo = [("base", sf.base)] + ([(v.name, s) for v, s in sf.variants] if variants else [])
            for name, scenario in todo:
                where[0] = f"{rel}#{name}"
                n0 = len(sink)
                execute(scenario)
                runs.append({"scenario": where[0], "executor": scenario.executor,
                             "copy_batches": len(sink) - n0})
    return sink, {"runs": runs}


def _bin_of(pages: int) -> int:
    return int(pages).bit_length() - 1  # [2^k, 2^(k+1))


def scenario_batches(files: Sequence[str | Path] | None = None, variants: bool = True) -> list[dict]:
    """One description per distinct scenario batch shape (see the module docstring)."""
    captured, info = capture_plans(files, variants)
    left_out = {"intra": 0, "not_levels_0_1": 0, "empty": 0}
    by_file: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, Captured]]] = {}
    for i, c in enumerate(captured):
        b = c.batch
        if b.kind not in DIRECTIONS:
            left_out["intra"] += 1
            continue
        if {b.src_level, b.dst_level} != {0, 1}:
            left_out["not_levels_0_1"] += 1
            continue
        if b.num_pages == 0:
            left_out["empty"] += 1
            continue
        key = (c.where.split("#")[0], b.kind, tuple(int(s) for s in b.pool_slot_bytes))
        by_file.setdefault(key, []).append((i, c))
    # representatives per file: every page count, or power-of-two bins when there are too many
    reps: dict[tuple[str, tuple[int, ...], int], dict] = {}
    for (_file, direction, shape), items in by_file.items():
        counts = sorted({c.batch.num_pages for _, c in items})
        if len(counts) <= MAX_SHAPES:
            classes: dict[Any, list[tuple[int, Captured]]] = {}
            for i, c in items:
                classes.setdefault(c.batch.num_pages, []).append((i, c))
            binned = False
        else:
            classes = {}
            for i, c in items:
                classes.setdefault(_bin_of(c.batch.num_pages), []).append((i, c))
            binned = True
        for members in classes.values():
            members.sort(key=lambda ic: (ic[1].batch.num_pages, ic[0]))
            i, rep = members[len(members) // 2] if binned else members[0]
            pages = rep.batch.num_pages
            k = (direction, shape, pages)
            entry = reps.get(k)
            pages_all = [c.batch.num_pages for _, c in members]
            where = sorted({c.where for _, c in members})
            if entry is None:
                reps[k] = {"rep": rep, "first": i, "occurrences": len(members),
                           "pages_min": min(pages_all), "pages_max": max(pages_all),
                           "distinct_pages": len(set(pages_all)), "scenarios": where,
                           "binned": binned}
            else:
                entry["occurrences"] += len(members)
                entry["pages_min"] = min(entry["pages_min"], min(pages_all))
                entry["pages_max"] = max(entry["pages_max"], max(pages_all))
                entry["distinct_pages"] = max(entry["distinct_pages"], len(set(pages_all)))
                entry["scenarios"] = sorted(set(entry["scenarios"]) | set(where))
                entry["binned"] = entry["binned"] or binned
    out = []
    for (direction, shape, pages), e in sorted(reps.items(), key=lambda kv: (kv[0][1], kv[0][0],
                                                                             kv[0][2])):
        rep: Captured = e["rep"]
        b = rep.batch
        bid = f"scenario/{direction}/{layout_name(shape)}/n{pages}"
        desc = {"kind": "explicit", "encoding": "int32 little-endian, zlib, base64",
                "src": encode_slots(np.asarray(b.src_slots)), "dst": encode_slots(np.asarray(b.dst_slots))}
        d = _describe("scenario", bid, direction, shape, pages, "plan", rep.device_slots,
                      rep.host_slots, desc,
                      scenario={"first": f"{rep.where} ({rep.api}, batch {e['first']} of the capture)",
                                "occurrences": e["occurrences"],
                                "represents_pages": [e["pages_min"], e["pages_max"]],
                                "distinct_pages_represented": e["distinct_pages"],
                                "binned": e["binned"], "scenarios": e["scenarios"]})
        d["quick"] = (direction, tuple(shape), pages) == SEED_BURST
        out.append(d)
    scenario_batches.last_info = {**info, "left_out": left_out,  # type: ignore[attr-defined]
                                  "captured": len(captured)}
    return out


def seed_burst_batch(device_slots: int = 8192, host_slots: int = 65536) -> dict:
    """The seed burst's shape on scattered (seeded random) slots of the seed scenario's pools
    (GPU tier 128 MiB = 8192 pages, host tier 1 GiB = 65536 pages, of 2 x 8 KiB)."""
    direction, shape, pages = SEED_BURST
    bid = f"seed_burst/{direction}/{layout_name(shape)}/n{pages}/scattered"
    desc = {"kind": "hashed_choice", "src_seed": _seed(bid + "/src"), "dst_seed": _seed(bid + "/dst")}
    b = _describe("seed_burst", bid, direction, shape, pages, "scattered", device_slots,
                  host_slots, desc)
    b["quick"] = True
    return b


# ---------------------------------------------------------------------------- the list

def batch_slots(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(src_slots, dst_slots) of a description, as the bench builds them."""
    return slot_arrays(batch)


def memory_need(batches: Iterable[dict]) -> dict[str, int]:
    """Largest device and pinned host bytes of one pool set (the bench holds one set at a time)."""
    need = {"device": 0, "host": 0}
    for b in batches:
        page = sum(b["pool_slot_bytes"])
        need["device"] = max(need["device"], b["pool_slots"]["device"] * page)
        need["host"] = max(need["host"], b["pool_slots"]["host"] * page)
    return need


def plan_batch_list(quick: bool = False, files: Sequence[str | Path] | None = None) -> dict:
    """The whole list (schema ``kvsim-plan-batch-list/1``). ``quick``: only the seed scenario's
    base run is run for scenario batches (the sweep is generated whole; its ``quick`` flags mark
    the bench's quick subset)."""
    if quick and files is None:
        scen = scenario_batches(QUICK_SCENARIOS, variants=False)
    else:
        scen = scenario_batches(files)
    info = getattr(scenario_batches, "last_info", {})
    batches = scen + [seed_burst_batch()] + layout_sweep()
    ids = [b["id"] for b in batches]
    if len(ids) != len(set(ids)):
        raise AssertionError("batch ids are not unique")
    return {"schema": LIST_SCHEMA, "quick_scenarios_only": bool(quick and files is None),
            "split": {"rule": FIT_RULE, "fit_layouts": [list(s) for s in FIT_LAYOUTS],
                      "fit": [b["id"] for b in batches if b["role"] == "fit"]},
            "targets": TARGETS, "scenario_capture": info, "memory_need": memory_need(batches),
            "batches": batches}


# ---------------------------------------------------------------------------- (d) judging

def _stats(apes: list[float]) -> dict:
    if not apes:
        return {"count": 0}
    a = np.sort(np.asarray(apes, dtype=float))
    return {"count": int(a.size), "median_ape_pct": float(np.median(a)),
            "p90_ape_pct": float(np.percentile(a, 90)), "worst_ape_pct": float(a[-1]),
            "within_3pct": int(np.sum(a <= 3)), "within_10pct": int(np.sum(a <= 10))}


def _point_key(path: str, ctas: int | None) -> str:
    return path if ctas is None else f"{path}:{ctas}"


def _hardware(preset: Any) -> Any:
    """A preset name, or a HardwareSpec as it is."""
    from kvsim.hardware import load_hardware

    return load_hardware(preset) if isinstance(preset, str) else preset


def measured_points(measurement: dict) -> tuple[dict[str, dict[str, dict[str, float]]], list[str]]:
    """``({batch id: {point: {timing: median seconds}}}, left-out points)``: points are
    ``path`` or ``kernel:CTAS``; timings ``issue``, ``gated`` and ``host`` (median host enqueue
    time of the issue samples). Points whose data check failed are left out, and listed."""
    batches = {b["id"] for b in measurement["batches"]}
    measured: dict[str, dict[str, dict[str, float]]] = {}
    bad_points: list[str] = []
    for r in measurement.get("records", []):
        bid = r["params"]["batch_id"]
        if bid not in batches:
            bad_points.append(f"{bid}: record of a batch not in the list")
            continue
        key = _point_key(r["path"], r["ctas"])
        if r.get("status") != "ok" or r.get("median_ms") is None:
            bad_points.append(f"{bid} {key} {r['timing']}: status {r.get('status')}")
            continue
        timing = r["timing"].replace("cuda_events_", "")
        m = measured.setdefault(bid, {}).setdefault(key, {})
        m[timing] = r["median_ms"] * 1e-3
        if timing == "issue" and r.get("host_enqueue_ms"):
            m["host"] = statistics.median(r["host_enqueue_ms"]) * 1e-3
    return measured, bad_points


def _pick_against_best(pick: str, fixed: dict[str, float]) -> dict:
    """The selector's ``pick`` against the fastest of a batch's measured ``fixed`` points
    (seconds by point key): the best, and, if the pick was measured, how far behind it is and
    whether that is within the target (``ok`` None when it was not measured)."""
    best = min(fixed, key=fixed.get)
    row: dict = {"best": best, "best_ms": fixed[best] * 1e3}
    if pick not in fixed:
        return row | {"ok": None}
    over = (fixed[pick] / fixed[best] - 1) * 100
    return row | {"pick_ms": fixed[pick] * 1e3, "pick_over_best_pct": over,
                  "ok": over <= TARGETS["selector_within_pct"]}


def _selector_summary(sel_rows: list[dict]) -> dict:
    """The selector target's figures over the per-batch rows (``ok`` None: not judged)."""
    judged = [r for r in sel_rows if r["ok"] is not None]
    return {"batches": len(sel_rows), "judged": len(judged),
            "within": sum(bool(r["ok"]) for r in judged),
            "not_measured": [r["batch"] for r in sel_rows if r["ok"] is None],
            "worst_pick_over_best_pct": max((r["pick_over_best_pct"] for r in judged),
                                            default=None),
            "failures": [r for r in judged if not r["ok"]], "rows": sel_rows}


def judge(measurement: dict | str | Path, hardware_preset: Any = "h200-sxm") -> dict:
    """The model's predictions for every measured (batch, path, CTAs) against the measurement.

    * ``model``: predicted end-to-end time (``CopyEstimate.end_to_end_seconds`` of
      :meth:`CopySelector.price`: ``host_seconds + seconds - overlap_seconds``, as the simulator's
      timeline places a batch: the submission, and the copy once the device can start) against the median
      ``cuda_events_issue`` time (submission start to last byte); fixed-path points only.
    * ``device``: predicted ``seconds`` against the median ``cuda_events_gated`` time, where gated.
    * ``host``: predicted ``host_seconds`` against the median host enqueue time.
    * ``selector``: per batch, the selector's pick (path and CTAs) and its measured issue time
      against the fastest measured fixed point; within :data:`TARGETS` ``selector_within_pct``.
    * ``seed_burst``: payload GB/s of the selector's pick on the scattered seed burst, gated
      (device) and issue (end to end); the target applies to the gated figure.

    Roles come from :func:`role` (the pre-registered rule), not from the file; a disagreement is
    listed under ``role_mismatches``. Points whose data check failed are left out and listed.
    """
    from kvsim.model.copy_select import CopySelector

    if not isinstance(measurement, dict):
        measurement = read_json(measurement)
    hw = _hardware(hardware_preset)
    hardware_preset = hw.name
    sel = CopySelector(hw)
    batches = {b["id"]: b for b in measurement["batches"]}
    mismatches = [bid for bid, b in batches.items() if b.get("role") != role(b)]
    rows: list[dict] = []
    measured, bad_points = measured_points(measurement)
    for bid, pts in measured.items():
        b = batches[bid]
        d, shape, pages = b["direction"], b["pool_slot_bytes"], int(b["pages"])
        for key, m in pts.items():
            path, _, c = key.partition(":")
            ctas = int(c) if c else None
            if path == SELECT:
                choice = sel.choose(d, shape, pages)
                est, real = choice.estimate, _point_key(choice.path, choice.estimate.ctas
                                                        if choice.path == "kernel" else None)
            else:
                est, real = sel.price(path, d, shape, pages, True, ctas), key
            row = {"batch": bid, "role": role(b), "source": b["source"], "direction": d,
                   "layout": b.get("layout", layout_name(shape)), "pages": pages,
                   "order": b["order"], "point": key, "priced_as": real, "bytes": b["bytes"],
                   "predicted_total_ms": est.end_to_end_seconds * 1e3,
                   "predicted_device_ms": est.seconds * 1e3,
                   "predicted_host_ms": est.host_seconds * 1e3}
            for t, pred in (("issue", est.end_to_end_seconds), ("gated", est.seconds),
                            ("host", est.host_seconds)):
                if t in m:
                    row[f"measured_{t}_ms"] = m[t] * 1e3
                    row[f"error_{t}_pct"] = (pred - m[t]) / m[t] * 100 if m[t] > 0 else None
            if "issue" in m:
                row["measured_issue_gbps"] = b["bytes"] / m["issue"] / 1e9
            if "gated" in m:
                row["measured_gated_gbps"] = b["bytes"] / m["gated"] / 1e9
            rows.append(row)

    def apes(metric: str, which: str, fixed_only: bool = True) -> list[float]:
        return [abs(r[f"error_{metric}_pct"]) for r in rows
                if r.get(f"error_{metric}_pct") is not None and r["role"] == which
                and (not fixed_only or r["point"] != SELECT)]

    out: dict[str, Any] = {"hardware": hardware_preset, "targets": TARGETS, "split": FIT_RULE,
                           "measurement": {k: measurement.get(k) for k in ("schema", "command",
                                                                           "mode")},
                           "role_mismatches": mismatches, "left_out_points": bad_points}
    for metric, name in (("issue", "model"), ("gated", "device"), ("host", "host")):
        out[name] = {w: _stats(apes(metric, w)) for w in ("judge", "fit")}
        # PROTOCOL-2.md: a new measurement is held out whole (the model was fitted on another file)
        out[name]["all"] = _stats(apes(metric, "judge") + apes(metric, "fit"))
        out[name]["judge_by_source"] = {
            s: _stats([abs(r[f"error_{metric}_pct"]) for r in rows if r["source"] == s
                       and r["role"] == "judge" and r["point"] != SELECT
                       and r.get(f"error_{metric}_pct") is not None])
            for s in sorted({r["source"] for r in rows})}
    # the selector
    sel_rows = []
    for bid, b in batches.items():
        pts = measured.get(bid, {})
        fixed = {k: m["issue"] for k, m in pts.items() if k != SELECT and "issue" in m}
        choice = sel.choose(b["direction"], b["pool_slot_bytes"], int(b["pages"]))
        pick = _point_key(choice.path, choice.estimate.ctas if choice.path == "kernel" else None)
        row = {"batch": bid, "role": role(b), "pick": pick, "measured_points": len(fixed)}
        if fixed:
            row.update(_pick_against_best(pick, fixed))  # ok None: the pick was not measured
            if SELECT in pts and "issue" in pts[SELECT]:
                row["select_ms"] = pts[SELECT]["issue"] * 1e3
        else:
            row["ok"] = None
        sel_rows.append(row)
    out["selector"] = _selector_summary(sel_rows)
    # the seed burst
    direction, shape, pages = SEED_BURST
    burst = {}
    for bid, b in batches.items():
        if (b["direction"], tuple(b["pool_slot_bytes"]), int(b["pages"])) != (direction, shape, pages):
            continue
        pick = next(r["pick"] for r in sel_rows if r["batch"] == bid)
        m = measured.get(bid, {}).get(pick, {})
        best_gated = max(((k, b["bytes"] / v["gated"] / 1e9) for k, v in measured.get(bid, {}).items()
                          if "gated" in v and k != SELECT), key=lambda kv: kv[1], default=(None, None))
        burst[bid] = {"source": b["source"], "order": b["order"], "pick": pick,
                      "pick_gated_gbps": b["bytes"] / m["gated"] / 1e9 if "gated" in m else None,
                      "pick_issue_gbps": b["bytes"] / m["issue"] / 1e9 if "issue" in m else None,
                      "best_gated_point": best_gated[0], "best_gated_gbps": best_gated[1]}
    out["seed_burst"] = burst
    # PROTOCOL-2.md's onboard figure: the largest onboard batch of the shipped plans in the seed's
    # layout, the pick's gated GB/s; and every path's gated GB/s on both
    onboard = [b for b in batches.values() if b["source"] == "scenario" and b["direction"] == "onboard"
               and tuple(b["pool_slot_bytes"]) == shape]
    by_path = {}
    if onboard:
        ob = max(onboard, key=lambda b: int(b["pages"]))
        pick = next(r["pick"] for r in sel_rows if r["batch"] == ob["id"])
        m = measured.get(ob["id"], {}).get(pick, {})
        out["onboard_largest"] = {"batch": ob["id"], "pick": pick,
                                  "pick_gated_gbps": ob["bytes"] / m["gated"] / 1e9 if "gated" in m else None,
                                  "pick_issue_gbps": ob["bytes"] / m["issue"] / 1e9 if "issue" in m else None}
        by_path[ob["id"]] = ob
    for bid, b in batches.items():
        if b["source"] == "seed_burst":
            by_path[bid] = b
    out["gated_gbps_by_path"] = {
        bid: {k: b["bytes"] / v["gated"] / 1e9 for k, v in sorted(measured.get(bid, {}).items())
              if "gated" in v} for bid, b in by_path.items()}
    target_burst = [v for v in burst.values() if v["source"] == "seed_burst"]
    ma = out["model"]["all"]
    ob = out.get("onboard_largest") or {}
    out["verdict_protocol2"] = {
        "model_median": ma["median_ape_pct"] <= TARGETS["model_median_ape_pct"] if ma["count"] else None,
        "model_p90": ma["p90_ape_pct"] <= TARGETS["model_p90_ape_pct"] if ma["count"] else None,
        "selector": None,  # set below, with the selector's verdict
        "seed_burst_offload": (target_burst[0]["pick_gated_gbps"] >= TARGETS["seed_burst_min_gbps"])
        if target_burst and target_burst[0]["pick_gated_gbps"] is not None else None,
        "onboard": (ob["pick_gated_gbps"] >= TARGETS["seed_burst_min_gbps"])
        if ob.get("pick_gated_gbps") is not None else None,
    }
    mj = out["model"]["judge"]
    out["verdict"] = {
        "model_median": (mj["median_ape_pct"] <= TARGETS["model_median_ape_pct"]) if mj["count"] else None,
        "model_p90": (mj["p90_ape_pct"] <= TARGETS["model_p90_ape_pct"]) if mj["count"] else None,
        "selector": (out["selector"]["within"] == out["selector"]["judged"]
                     and not out["selector"]["not_measured"]) if out["selector"]["judged"] else None,
        "seed_burst": (target_burst[0]["pick_gated_gbps"] >= TARGETS["seed_burst_min_gbps"])
        if target_burst and target_burst[0]["pick_gated_gbps"] is not None else None,
    }
    out["verdict_protocol2"]["selector"] = out["verdict"]["selector"]
    out["rows"] = rows
    return out


def judge_select(select_run: dict | str | Path, full_run: dict | str | Path,
                 hardware_preset: Any = "h200-sxm") -> dict:
    """A re-measurement of a changed selector (``hw.bench_plan_batches --select-only``: per batch
    the pick as a fixed point, then ``select``) against a full run of the same batch list.

    Per batch: the selector's pick (as recorded in ``select_run``; ``pick_by_preset_now`` is what
    ``hardware_preset`` picks), the pick's and ``select``'s measured end-to-end time in
    ``select_run``, the fastest fixed point of ``full_run`` and the pick's own time there, and
    ``select_over_best_pct`` = select now / best then - 1 (two runs, so drift between them is in
    it: ``pick_now_over_then_pct`` shows how much for the same point). Plus the payload GB/s of
    the pick, gated, on the seed burst (offload) and on the largest onboard batch of the same
    layout (``onboard_largest``), the figures the seed-burst target reads."""
    from kvsim.model.copy_select import CopySelector

    new = select_run if isinstance(select_run, dict) else read_json(select_run)
    old = full_run if isinstance(full_run, dict) else read_json(full_run)
    hw = _hardware(hardware_preset)
    sel = CopySelector(hw)
    now, _ = measured_points(new)
    then, _ = measured_points(old)
    # the pick as the run's selector made it (the preset may have changed since)
    recorded = {r["params"]["batch_id"]: _point_key(r["selector_pick"]["path"], r["selector_pick"]["ctas"])
                for r in new.get("records", []) if r.get("selector_pick")}
    rows = []
    for b in new["batches"]:
        bid = b["id"]
        choice = sel.choose(b["direction"], b["pool_slot_bytes"], int(b["pages"]))
        pick_now = _point_key(choice.path, choice.estimate.ctas if choice.path == "kernel" else None)
        pick = recorded.get(bid, pick_now)
        pts_now, pts_then = now.get(bid, {}), then.get(bid, {})
        fixed_then = {k: m["issue"] for k, m in pts_then.items() if k != SELECT and "issue" in m}
        row: dict[str, Any] = {"batch": bid, "role": role(b), "direction": b["direction"],
                               "layout": b.get("layout", layout_name(b["pool_slot_bytes"])),
                               "pages": int(b["pages"]), "order": b["order"], "pick": pick,
                               "pick_by_preset_now": pick_now, "bytes": b["bytes"]}
        if SELECT in pts_now and "issue" in pts_now[SELECT]:
            row["select_ms"] = pts_now[SELECT]["issue"] * 1e3
        if pick in pts_now:
            for t in ("issue", "gated"):
                if t in pts_now[pick]:
                    row[f"pick_{t}_ms"] = pts_now[pick][t] * 1e3
            if "gated" in pts_now[pick]:
                row["pick_gated_gbps"] = b["bytes"] / pts_now[pick]["gated"] / 1e9
        if fixed_then:
            best = min(fixed_then, key=fixed_then.get)
            row.update(best_then=best, best_then_ms=fixed_then[best] * 1e3)
            if "select_ms" in row:
                row["select_over_best_pct"] = (row["select_ms"] / row["best_then_ms"] - 1) * 100
            if pick in fixed_then and "pick_issue_ms" in row:
                row["pick_now_over_then_pct"] = (row["pick_issue_ms"] / (fixed_then[pick] * 1e3) - 1) * 100
        rows.append(row)
    judged = [r for r in rows if "select_over_best_pct" in r]
    within = [r for r in judged if r["select_over_best_pct"] <= TARGETS["selector_within_pct"]]
    direction, shape, pages = SEED_BURST
    seed = [r for r in rows if r["direction"] == direction and r["pages"] == pages
            and r["layout"] == layout_name(shape) and r["order"] == "scattered"]
    onboard = max((r for r in rows if r["direction"] == "onboard" and r["layout"] == layout_name(shape)
                   and r["order"] == "scattered"), key=lambda r: r["pages"], default=None)
    drift = [r["pick_now_over_then_pct"] for r in rows if "pick_now_over_then_pct" in r]
    return {"hardware": hw.name, "select_run": {k: new.get(k) for k in ("command", "mode")},
            "batches": len(rows), "judged": len(judged), "within": len(within),
            "target_pct": TARGETS["selector_within_pct"],
            "median_select_over_best_pct": statistics.median(r["select_over_best_pct"] for r in judged)
            if judged else None,
            "median_pick_now_over_then_pct": statistics.median(drift) if drift else None,
            "seed_burst": seed[0] if seed else None, "onboard_largest": onboard,
            "seed_burst_min_gbps": TARGETS["seed_burst_min_gbps"],
            "failures": [r for r in judged
                         if r["select_over_best_pct"] > TARGETS["selector_within_pct"]],
            "rows": rows}


def judge3(measurement: dict | str | Path, hardware_preset: Any = "h200-sxm") -> dict:
    """PROTOCOL-3.md: copy model 3 fitted on the fit-role batches of ``measurement`` and judged
    on its judge-role batches, each batch priced at its own host speed (the run's host probes;
    :func:`kvsim.calibration.plan_batch_fit.refit_probe`).

    * ``model``: every fixed-path point, predicted ``CopyEstimate.end_to_end_seconds`` against
      the median ``cuda_events_issue`` time; ``judge`` (the target's set) and ``fit`` (reference);
      ``judge_by`` breaks the judged points down by path and size (<= 256 pages or more).
    * ``device`` / ``host``: predicted ``seconds`` / ``host_seconds`` against the gated time / the
      median host enqueue time.
    * ``selector``: every batch, the pick of ``CopySelector(model 3, host_speed=the batch's)`` against
      the fastest fixed point of the same batch in the same file; within 5 %.
    * ``seed_burst`` and ``onboard_largest``: the pick's payload GB/s over its gated median.
    """
    from kvsim.calibration.plan_batch_fit import refit_probe
    from kvsim.model.copy_select import CopySelector

    if not isinstance(measurement, dict):
        measurement = read_json(measurement)
    base = _hardware(hardware_preset)
    hw, speeds, report = refit_probe(base, measurement, ("fit",))
    batches = {b["id"]: b for b in measurement["batches"]}
    measured, bad_points = measured_points(measurement)
    sels = {bid: CopySelector(hw, host_speed=speeds.get(bid, {})) for bid in batches}
    rows: list[dict] = []
    for bid, pts in measured.items():
        b, sel = batches[bid], sels[bid]
        d, shape, pages = b["direction"], b["pool_slot_bytes"], int(b["pages"])
        for key, m in pts.items():
            if key == SELECT:
                continue
            path, _, c = key.partition(":")
            est = sel.price(path, d, shape, pages, True, int(c) if c else None)
            row = {"batch": bid, "role": role(b), "source": b["source"], "direction": d,
                   "layout": b.get("layout", layout_name(shape)), "pages": pages, "order": b["order"],
                   "point": key, "host_speed": speeds.get(bid, {}).get(path),
                   "predicted_total_ms": est.end_to_end_seconds * 1e3,
                   "predicted_device_ms": est.seconds * 1e3, "predicted_host_ms": est.host_seconds * 1e3}
            for t, pred in (("issue", est.end_to_end_seconds), ("gated", est.seconds),
                            ("host", est.host_seconds)):
                if t in m and m[t] > 0:
                    row[f"measured_{t}_ms"] = m[t] * 1e3
                    row[f"error_{t}_pct"] = (pred - m[t]) / m[t] * 100
            rows.append(row)

    def apes(metric: str, keep: Any) -> list[float]:
        return [abs(r[f"error_{metric}_pct"]) for r in rows
                if r.get(f"error_{metric}_pct") is not None and keep(r)]

    out: dict[str, Any] = {"protocol": "PROTOCOL-3.md", "hardware": base.name, "targets": TARGETS,
                           "split": FIT_RULE, "fit": report,
                           "measurement": {k: measurement.get(k) for k in ("schema", "command", "mode")},
                           "left_out_points": bad_points, "batches_without_probe":
                               sorted(set(batches) - set(speeds))}
    for metric, name in (("issue", "model"), ("gated", "device"), ("host", "host")):
        out[name] = {w: _stats(apes(metric, lambda r, w=w: r["role"] == w)) for w in ("judge", "fit")}
    out["model"]["judge_by"] = {
        f"{path} {size}": _stats(apes("issue", lambda r, path=path, small=small: r["role"] == "judge"
                                      and r["point"].split(":")[0] == path
                                      and (r["pages"] <= 256) == small))
        for path in ("ce-page", "ce-batch", "kernel") for size, small in (("<=256", True), (">256", False))}
    sel_rows = []
    for bid, b in batches.items():
        fixed = {k: m["issue"] for k, m in measured.get(bid, {}).items() if k != SELECT and "issue" in m}
        choice = sels[bid].choose(b["direction"], b["pool_slot_bytes"], int(b["pages"]))
        pick = _point_key(choice.path, choice.estimate.ctas if choice.path == "kernel" else None)
        row = {"batch": bid, "role": role(b), "pages": int(b["pages"]), "pick": pick}
        if fixed and pick in fixed:
            row.update(_pick_against_best(pick, fixed))
        else:
            row["ok"] = None
        sel_rows.append(row)
    out["selector"] = _selector_summary(sel_rows)
    picks = {r["batch"]: r["pick"] for r in sel_rows}

    def gbps(bid: str, key: str, timing: str = "gated") -> float | None:
        m = measured.get(bid, {}).get(key, {})
        return batches[bid]["bytes"] / m[timing] / 1e9 if m.get(timing) else None

    direction, shape, pages = SEED_BURST
    seed = [bid for bid, b in batches.items() if b["source"] == "seed_burst"]
    onboard = [b for b in batches.values() if b["source"] == "scenario" and b["direction"] == "onboard"
               and tuple(b["pool_slot_bytes"]) == shape]
    figs = {}
    largest = max(onboard, key=lambda b: int(b["pages"]))["id"] if onboard else None
    for name, bid in (("seed_burst", seed[0] if seed else None), ("onboard_largest", largest)):
        if bid is None:
            continue
        figs[name] = {"batch": bid, "pick": picks[bid], "pick_gated_gbps": gbps(bid, picks[bid]),
                      "pick_issue_gbps": gbps(bid, picks[bid], "issue"),
                      "gated_gbps_by_point": {k: gbps(bid, k) for k in sorted(measured.get(bid, {}))
                                              if gbps(bid, k) is not None}}
    out.update(figs)
    mj = out["model"]["judge"]
    minimum = TARGETS["seed_burst_min_gbps"]
    out["verdict"] = {
        "model_median": mj["median_ape_pct"] <= TARGETS["model_median_ape_pct"] if mj["count"] else None,
        "model_p90": mj["p90_ape_pct"] <= TARGETS["model_p90_ape_pct"] if mj["count"] else None,
        "selector": (out["selector"]["within"] == len(sel_rows)) if out["selector"]["judged"] else None,
        "seed_burst_offload": (figs["seed_burst"]["pick_gated_gbps"] >= minimum)
        if figs.get("seed_burst", {}).get("pick_gated_gbps") is not None else None,
        "onboard": (figs["onboard_largest"]["pick_gated_gbps"] >= minimum)
        if figs.get("onboard_largest", {}).get("pick_gated_gbps") is not None else None,
    }
    out["rows"] = rows
    return out


def _print_errors(j: dict, what: dict[str, str] | None = None) -> None:
    """The model's, the device time's and the host time's errors, judged and fit points."""
    for name in ("model", "device", "host"):
        for w in ("judge", "fit"):
            s = j[name][w]
            if s["count"]:
                print(f"{name:<6} {w:<5} {s['count']:5d} points: median APE {s['median_ape_pct']:6.2f} %"
                      f", p90 {s['p90_ape_pct']:7.2f} %, worst {s['worst_ape_pct']:8.2f} %"
                      + (f"   ({what[name]})" if what else ""))


def print_judgement3(j: dict) -> None:
    _print_errors(j)
    for k, s in j["model"]["judge_by"].items():
        if s["count"]:
            print(f"  judged {k:<16} {s['count']:5d} points: median {s['median_ape_pct']:6.2f} %, "
                  f"p90 {s['p90_ape_pct']:7.2f} %")
    s = j["selector"]
    print(f"selector: {s['within']} of {s['batches']} batches within "
          f"{j['targets']['selector_within_pct']} % of the best point of the same file (worst "
          f"{s['worst_pick_over_best_pct']}); not measured: {len(s['not_measured'])}")
    for name in ("seed_burst", "onboard_largest"):
        f = j.get(name)
        if f:
            print(f"{name} {f['batch']}: pick {f['pick']} gated {f['pick_gated_gbps']} GB/s, "
                  f"end to end {f['pick_issue_gbps']} GB/s")
    print(f"host probe reference (ms): {j['fit']['host_probe']['reference_ms']}")
    print(f"PROTOCOL-3 verdict: {j['verdict']}")


def print_judgement(j: dict) -> None:
    t = j["targets"]
    _print_errors(j, {"model": "end to end (issue) vs predicted end to end",
                      "device": "device (gated) vs predicted seconds",
                      "host": "host enqueue vs predicted host_seconds"})
    s = j["selector"]
    print(f"selector: {s['within']} of {s['judged']} batches within {t['selector_within_pct']} % of "
          f"the best measured point; worst {s['worst_pick_over_best_pct']}; not measured: "
          f"{len(s['not_measured'])}")
    for bid, v in j["seed_burst"].items():
        print(f"seed burst {bid}: pick {v['pick']} gated {v['pick_gated_gbps']} GB/s, issue "
              f"{v['pick_issue_gbps']} GB/s (best gated {v['best_gated_point']} "
              f"{v['best_gated_gbps']})")
    print(f"targets: model median <= {t['model_median_ape_pct']} %, p90 <= {t['model_p90_ape_pct']} %,"
          f" selector within {t['selector_within_pct']} %, seed burst >= {t['seed_burst_min_gbps']} "
          f"GB/s -> {j['verdict']}")
    a = j["model"]["all"]
    if a["count"]:
        print(f"every fixed-path point (PROTOCOL-2.md): {a['count']} points, median APE "
              f"{a['median_ape_pct']:.2f} %, p90 {a['p90_ape_pct']:.2f} %")
    ob = j.get("onboard_largest")
    if ob:
        print(f"onboard largest {ob['batch']}: pick {ob['pick']} gated {ob['pick_gated_gbps']} GB/s")
    print(f"PROTOCOL-2 verdict: {j['verdict_protocol2']}")
    if j["role_mismatches"]:
        print(f"ROLE MISMATCHES (file vs the pre-registered rule): {j['role_mismatches']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvsim.calibration.plan_batches",
                                 description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="write the batch list")
    p.add_argument("--json", default=None, help="file to write ('-' = stdout); default: a table")
    p.add_argument("--quick", action="store_true", help="scenario batches of the seed scenario only")
    p = sub.add_parser("judge", help="judge a hw.bench_plan_batches measurement")
    p.add_argument("measurement")
    p.add_argument("--hardware", default="h200-sxm")
    p.add_argument("--out", default=None, help="write the judgement (with every row) here")
    p = sub.add_parser("judge3", help="PROTOCOL-3.md: fit on the file's fit-role batches with its "
                                       "host probes, judge its other batches")
    p.add_argument("measurement")
    p.add_argument("--hardware", default="h200-sxm")
    p.add_argument("--out", default=None, help="write the judgement (with every row) here")
    p = sub.add_parser("judge-select", help="judge a --select-only re-measurement against a full run")
    p.add_argument("measurement")
    p.add_argument("--against", required=True, help="the full run of the same batch list")
    p.add_argument("--hardware", default="h200-sxm")
    p.add_argument("--out", default=None, help="write the judgement (with every row) here")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        doc = plan_batch_list(quick=args.quick)
        if args.json == "-":
            json.dump(doc, sys.stdout)
            sys.stdout.write("\n")
        elif args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        else:
            for b in doc["batches"]:
                print(f"{b['id']:<48} {b['role']:<6} {b['bytes'] / 2**20:10.2f} MiB")
            print(f"{len(doc['batches'])} batches; {FIT_RULE}")
        return 0
    if args.cmd == "judge3":
        j = judge3(args.measurement, args.hardware)
        print_judgement3(j)
    elif args.cmd == "judge-select":
        j = judge_select(args.measurement, args.against, args.hardware)
        print(f"select within {j['target_pct']} % of the full run's best point: {j['within']} of "
              f"{j['judged']} batches (median select/best - 1: {j['median_select_over_best_pct']:.1f} %; "
              f"the same point now vs then, median: {j['median_pick_now_over_then_pct']:+.1f} %)")
        for name in ("seed_burst", "onboard_largest"):
            r = j[name]
            if r:
                print(f"{name}: {r['batch']} pick {r['pick']} gated {r.get('pick_gated_gbps', 0):.1f} GB/s"
                      f" (target >= {j['seed_burst_min_gbps']}), select {r.get('select_ms', 0):.3f} ms")
    else:
        j = judge(args.measurement, args.hardware)
        print_judgement(j)
    if args.out:
        Path(args.out).write_text(json.dumps(j, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
