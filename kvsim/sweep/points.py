"""Points of a sweep: expansion, identity, seeds, and running one point.

* **Expansion.** ``grid`` is the product of the value lists. ``random`` draws N distinct grid
  points uniformly (so each parameter's value is a uniform choice). ``lhs`` is a Latin hypercube
  over the value lists: each parameter's column holds its values equally often (N / k times,
  give or take one) in an independent seeded shuffle, so every value appears once N >= k;
  repeated points are dropped and made up with distinct random grid points. A sample of at
  least the grid size is the grid. Draws use :class:`random.Random` seeded from a hash of the
  sweep seed and the parameter names, so they are the same on every machine and Python version.
* **Identity.** A point's id hashes its scenario's content hash, its parameters, its fixed
  overrides and its seed; the table is sorted by it, and a re-run skips ids already finished.
* **Seeds.** A point's seed hashes the sweep seed and its parameters (not its position, the
  backend or the worker); it becomes the scenario's ``seed``. A sweep over ``seed`` itself uses
  the swept value.
* **Running.** :func:`run_point` (the function both backends call, in worker processes) loads
  the scenario with the point's overrides, runs it as ``kvsim run`` would (``execute`` of the
  base scenario; variants are not run), and returns one row of the table. Any exception is the
  point's result (status ``error``), never the sweep's.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.sweep.spec import Part, Sweep, canonical_json, named_files, yaml_scalar

# An ordinal stand-in for platform price (cheapest first), for the report's cost axis.
HW_RANK = {"h100-pcie": 1, "h200-sxm": 2, "gh200": 3, "b200": 4, "gb200": 5}

# Result columns of a row, in table order, with their kinds (int, float, bool, str).
METRIC_COLUMNS: dict[str, str] = {
    "resize_p50_ms": "float",             # median latency of the growth-phase KvCache.resize calls
    "resize_copies_done_p50_ms": "float",  # ... until their copies were done
    "offloaded_pages": "int",             # growth phase
    "offloaded_bytes": "int",
    "probe_p50_ms": "float",              # KVCacheManager.probe_reuse latency
    "probe_p99_ms": "float",
    "longest_writer_wait_ms": "float",    # the longest wait of an exclusive (writer) lock request
    "starved": "bool",                    # readers that entered after it made that writer wait
    "violations": "int",                  # invariant and lock-discipline violations
    "deadlocks": "int",                   # deadlocks, stuck threads and lock hazards
    "hit_rate": "float",                  # committed reuse: reused / (reused + missed) blocks
    "sim_events": "int",                  # SimPy events processed
    # a serving workload (kvsim.serving): its summary's figures
    "ttft_p50_ms": "float",               # time to first token
    "ttft_p99_ms": "float",
    "queue_p50_ms": "float",              # arrival to admission
    "copy_wait_p50_ms": "float",          # a pass waiting for its copies (onboarding)
    "gpu_busy_s": "float",                # modelled GPU compute of every pass
    "prefill_s": "float",
    "recomputed_tokens": "int",           # prefilled
    "reused_tokens": "int",               # adopted from the cache (any tier)
    "serving_hit_rate": "float",          # reused / (reused + recomputed)
    "onboarded_host_pages": "int",        # reused pages brought up from the host tier
    "onboarded_disk_pages": "int",
    "onboarded_bytes": "int",             # host->gpu and disk->gpu
    "failed_requests": "int",
    "sim_end_s": "float",                 # simulated time at the end of the run
}
# The configuration each point actually ran (resolved from the parsed scenario, whatever the
# parameter that set it), for the report's axes.
CONFIG_COLUMNS: dict[str, str] = {
    "cfg_executor": "str",
    "cfg_workload": "str",
    "cfg_hardware": "str",
    "cfg_link": "str",                # e.g. "pcie 32 GB/s", "c2c coherent 447 GB/s"
    "cfg_hw_rank": "int",             # HW_RANK; null for a hardware JSON file
    "cfg_copy_path": "str",           # sim.copy_path as set
    "cfg_copy_paths_used": "str",     # the paths the copies took ('+'-joined)
    "cfg_lock_policy": "str",
    "cfg_history_tokens": "int",      # of the (background) burst resize
    "cfg_capacity_tokens": "int",
    "cfg_probe_threads": "int",
    "cfg_probe_interval_us": "float",
    "cfg_tokens_per_block": "int",
    "cfg_gpu_tier_bytes": "int",
    "cfg_host_tier_bytes": "int",     # 0 without a host tier
    "cfg_disk_tier_bytes": "int",     # 0 without a disk tier
    "cfg_disk": "str",                # the disk level's drive (sim.disk) x drives
    "cfg_tier_bytes": "int",          # all tiers
}


@dataclass(frozen=True)
class Point:
    point_id: str
    scenario_file: str
    scenario_name: str
    scenario_hash: str
    params: dict[str, Any] = field(hash=False)
    point_seed: int
    fixed: tuple[str, ...] = ()

    @property
    def params_json(self) -> str:
        return canonical_json(self.params)

    def overrides(self) -> list[str]:
        out = list(self.fixed) + [f"{k}={yaml_scalar(v)}" for k, v in self.params.items()]
        if "seed" not in self.params:
            out.append(f"seed={self.point_seed}")
        return out

    def task(self) -> dict:
        """What a worker needs (plain, picklable)."""
        return {"point_id": self.point_id, "scenario_file": self.scenario_file,
                "scenario_name": self.scenario_name, "scenario_hash": self.scenario_hash,
                "params": self.params_json, "point_seed": self.point_seed,
                "overrides": self.overrides()}


# -- seeds and ids --------------------------------------------------------------------------------

def _digest(*parts: Any) -> bytes:
    return hashlib.sha256(canonical_json(list(parts)).encode()).digest()


def point_seed(sweep_seed: int, params: dict[str, Any]) -> int:
    """The point's scenario seed: from the sweep seed and its parameters only."""
    swept = params.get("seed")
    if isinstance(swept, int) and not isinstance(swept, bool):
        return swept
    return int.from_bytes(_digest("kvsim-sweep-seed", sweep_seed, params)[:8], "big") % (2**31 - 1)


def point_id(scenario_hash: str, params: dict[str, Any], fixed: tuple[str, ...], seed: int,
             files: list[tuple[str, str]] | None = None) -> str:
    """Names the point's inputs: kvsim, the scenario and the files it names, the parameters and
    overrides and the files they name (``files``: :func:`kvsim.sweep.spec.named_files`), the
    seed."""
    return _digest("kvsim-sweep-point", kvsim_digest(), scenario_hash, params, list(fixed),
                   seed, files or []).hex()[:16]


@functools.cache
def kvsim_digest() -> str:
    """Of every file of the kvsim package (its code, and the presets, CPU models, engine times
    and architectures it ships). A point's results depend on them as much as on its scenario,
    so a sweep resumed into a directory reuses only the rows the same kvsim made: after a
    preset or the code changed, every point runs again."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json", ".yaml") and "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# -- expansion ------------------------------------------------------------------------------------

def _rng(seed: int, method: str, keys: list[str]) -> random.Random:
    return random.Random(int.from_bytes(_digest("kvsim-sweep-draw", seed, method, keys)[:8], "big"))


def _decode(index: int, sizes: list[int]) -> tuple[int, ...]:
    """Mixed-radix digits of a grid index (last parameter fastest, like itertools.product)."""
    digits = []
    for size in reversed(sizes):
        index, d = divmod(index, size)
        digits.append(d)
    return tuple(reversed(digits))


def expand_values(params: tuple[tuple[str, tuple], ...] | list, method: str = "grid",
                  sample: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """The points' parameter values, in draw order (grid: product order)."""
    keys = [k for k, _ in params]
    values = [list(v) for _, v in params]
    sizes = [len(v) for v in values]
    total = 1
    for s in sizes:
        total *= s

    def point(idx: tuple[int, ...]) -> dict[str, Any]:
        return {k: values[i][j] for i, (k, j) in enumerate(zip(keys, idx))}

    if method == "grid" or sample is None or sample >= total:
        return [point(idx) for idx in itertools.product(*(range(s) for s in sizes))]
    rng = _rng(seed, method, keys)
    if method == "random":
        return [point(_decode(i, sizes)) for i in rng.sample(range(total), sample)]
    if method != "lhs":
        raise ValueError(f"unknown sampling method {method!r}")
    columns = []
    for k in sizes:
        col = [j * k // sample for j in range(sample)]
        rng.shuffle(col)
        columns.append(col)
    chosen: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for idx in zip(*columns):
        if idx not in seen:
            seen.add(idx)
            chosen.append(idx)
    while len(chosen) < sample:  # repeated points made up with distinct random ones
        idx = _decode(rng.randrange(total), sizes)
        if idx not in seen:
            seen.add(idx)
            chosen.append(idx)
    return [point(idx) for idx in chosen]


def part_points(part: Part, sweep_seed: int) -> list[Point]:
    base = Path(part.scenario_file).parent
    out = []
    for params in expand_values(part.params, part.method, part.sample, sweep_seed):
        seed = point_seed(sweep_seed, params)
        files = named_files([params, list(part.fixed)], base)
        out.append(Point(point_id(part.scenario_hash, params, part.fixed, seed, files),
                         part.scenario_file, part.scenario_name, part.scenario_hash, params, seed,
                         part.fixed))
    return out


def sweep_points(sweep: Sweep) -> list[Point]:
    """Every point of every part, repeated ids dropped, in expansion order."""
    out: dict[str, Point] = {}
    for part in sweep.parts:
        for p in part_points(part, sweep.seed):
            out.setdefault(p.point_id, p)
    return list(out.values())


# -- running one point ----------------------------------------------------------------------------

def _link_label(hardware) -> str:
    link = hardware.link
    return f"{link.kind}{' coherent' if link.coherent else ''} {link.detected_gbps:g} GB/s"


def _config(scenario, results: dict | None) -> dict[str, Any]:
    w = scenario.workload
    probe = getattr(w, "probes", w)  # seed_concurrency wraps a concurrent_probe
    burst = getattr(probe, "background", w)
    levels = [lv.quota_bytes for lv in scenario.manager.levels]
    out: dict[str, Any] = {
        "cfg_executor": scenario.executor,
        "cfg_workload": w.kind,
        "cfg_hardware": None, "cfg_link": None, "cfg_hw_rank": None,
        "cfg_copy_path": scenario.sim.copy_path,
        "cfg_copy_paths_used": None,
        "cfg_lock_policy": scenario.sim.lock_policy,
        "cfg_history_tokens": getattr(burst, "history_tokens", None),
        "cfg_capacity_tokens": getattr(burst, "capacity_tokens", None),
        "cfg_probe_threads": getattr(probe, "probe_threads", None),
        "cfg_probe_interval_us": getattr(probe, "probe_interval_us", None),
        "cfg_tokens_per_block": scenario.manager.tokens_per_block,
        "cfg_gpu_tier_bytes": levels[0],
        "cfg_host_tier_bytes": levels[1] if len(levels) > 1 else 0,
        "cfg_disk_tier_bytes": levels[2] if len(levels) > 2 else 0,
        "cfg_disk": (None if scenario.sim.disk is None
                     else f"{Path(scenario.sim.disk).stem} x{scenario.sim.disk_drives}"),
        "cfg_tier_bytes": sum(levels),
    }
    if scenario.hardware is not None:
        from kvsim.hardware import load_hardware

        hardware = load_hardware(scenario.hardware)
        out["cfg_hardware"] = hardware.name
        out["cfg_link"] = _link_label(hardware)
        out["cfg_hw_rank"] = (None if scenario.hardware.endswith(".json")
                              else HW_RANK.get(hardware.name))
    if results is not None and results.get("copies"):
        out["cfg_copy_paths_used"] = "+".join(sorted({c["path"] for c in results["copies"]}))
    return out


def summarize(results: dict) -> dict[str, Any]:
    """The table's result columns from a results object (``execute``'s)."""
    growth = [r for r in results["calls"]
              if r["phase"] == "growth" and r["api"] == "KvCache.resize"]
    latencies = [r["latency_ms"] for r in growth if r.get("latency_ms") is not None]
    done = [r["copies_done_ms"] - r["start_ms"] for r in growth
            if r.get("copies_done_ms") is not None and r.get("start_ms") is not None]
    probe = results["api"].get("KVCacheManager.probe_reuse", {}).get("latency") or {}
    starvation = results.get("starvation")
    return {
        "resize_p50_ms": statistics.median(latencies) if latencies else None,
        "resize_copies_done_p50_ms": statistics.median(done) if done else None,
        "offloaded_pages": results["offload"]["growth_pages"],
        "offloaded_bytes": results["offload"]["growth_bytes"],
        "probe_p50_ms": probe.get("p50_ms"),
        "probe_p99_ms": probe.get("p99_ms"),
        "longest_writer_wait_ms": starvation.get("longest_writer_wait_ms") if starvation else None,
        "starved": bool(starvation.get("starved")) if starvation else None,
        "violations": len(results["violations"]),
        "deadlocks": len(results["deadlocks"]),
        "hit_rate": results["reuse"]["hit_rate"],
        "sim_events": (results.get("sim") or {}).get("events"),
    } | _serving_columns(results)


def _serving_columns(results: dict) -> dict[str, Any]:
    s = results.get("workload_summary") or {}
    if "ttft_p50_ms" not in s:
        return {}
    moved = s["moved_bytes"]
    return {
        "ttft_p50_ms": s["ttft_p50_ms"], "ttft_p99_ms": s["ttft_p99_ms"],
        "queue_p50_ms": s["queue_p50_ms"], "copy_wait_p50_ms": s["copy_wait_p50_ms"],
        "gpu_busy_s": s["gpu_busy_s"], "prefill_s": s["prefill_s"],
        "recomputed_tokens": s["recomputed_tokens"], "reused_tokens": s["reused_tokens"],
        "serving_hit_rate": s["hit_rate"],
        "onboarded_host_pages": s["onboarded_pages"]["host"],
        "onboarded_disk_pages": s["onboarded_pages"]["disk"],
        "onboarded_bytes": moved.get("host->gpu", 0) + moved.get("disk->gpu", 0),
        "failed_requests": s["failed"],
        "sim_end_s": (results.get("sim") or {}).get("end_time_s"),
    }


def empty_row(task: dict) -> dict[str, Any]:
    row: dict[str, Any] = {
        "point_id": task["point_id"], "scenario": task["scenario_name"],
        "params": task["params"], "point_seed": task["point_seed"],
        "status": "error", "error": None,
    }
    row.update(dict.fromkeys(METRIC_COLUMNS))
    row.update(dict.fromkeys(CONFIG_COLUMNS))
    row.update({"scenario_file": task["scenario_file"], "scenario_hash": task["scenario_hash"],
                "wall_s": None})
    return row


def run_point(task: dict) -> dict[str, Any]:
    """Run one point (in a worker process); returns its row, status ``ok`` or ``error``."""
    from kvsim.scenario.run import execute
    from kvsim.sweep.spec import load_sweep_scenario

    t0 = time.perf_counter()
    row = empty_row(task)
    try:
        sf, digest = load_sweep_scenario(task["scenario_file"], task["overrides"])
        if digest != task["scenario_hash"]:
            raise RuntimeError(f"{task['scenario_file']} changed since the sweep started")
        row.update(_config(sf.base, None))
        results = execute(sf.base)
        row.update(_config(sf.base, results))
        row.update(summarize(results))
        row["status"] = "ok"
    except Exception as e:  # a failing point is recorded, never fatal to the sweep
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {e}"
    row["wall_s"] = time.perf_counter() - t0
    return row


def failed_row(task: dict, exc: BaseException) -> dict[str, Any]:
    """The row of a point whose worker failed (died, or the backend lost it)."""
    row = empty_row(task)
    row["error"] = f"worker failed: {type(exc).__name__}: {exc}"
    return row


def params_of(row: dict) -> dict[str, Any]:
    return json.loads(row["params"])
