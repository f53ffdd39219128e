"""``kvsim validate``: the simulator's predictions against hardware-executor measurements.

Inputs: one scenario, one or more results directories the hardware executor wrote for it (runs of
``kvsim run SCENARIO`` with ``executor: hw``), and optionally the copy-bench measurement the
copy model was fitted to. The scenario is re-run in the simulator (``executor: sim``, same
manager, workload and seed; the hardware and CPU presets given) and compared:

* copy batches: the copy model against every held-out batch of the copy-bench measurement with
  16 KiB-4 MiB pages (all paths, both directions), and against each copy batch of the runs;
* burst resize: per growth ``resize()`` call, host time and call-to-copies-done time;
* probes: ``probe_reuse`` latency p50/p99 over all probes and over those overlapping an exclusive
  hold; a two-sample Kolmogorov-Smirnov statistic between measured and predicted samples, a
  +-10 % equivalence verdict from a bootstrap 90 % interval of measured/predicted (probes
  resampled), and the interval of the measured quantile when whole runs are resampled (how much
  the figure moves between runs; the simulator runs as many GIL seeds as there are runs).

Absolute percentage error = |predicted - measured| / measured x 100.

The command's options are in :mod:`kvsim.cli.calibration`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kvsim.calibration.packed import first_existing, read_json
from kvsim.errors import KvsimError
from kvsim.output_dir import MARKER, MARKER_TEXT, OutputDirError, is_kvsim_dir, open_output_dir


def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100 if meas else float("nan")


def ks_statistic(a: list[float], b: list[float]) -> float:
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, "right") / a.size
                               - np.searchsorted(b, grid, "right") / b.size)))


def equivalence(measured: list[float], predicted: float, q: float, seed: int = 0) -> dict:
    """Bootstrap 90 % interval of (measured quantile q) / predicted; equivalent within +-10 %
    when the whole interval lies in [0.9, 1.1]."""
    rng = np.random.default_rng(seed)
    m = np.asarray(measured)
    boots = [np.quantile(rng.choice(m, m.size), q) / predicted for _ in range(500)]
    lo, hi = (float(x) for x in np.quantile(boots, [0.05, 0.95]))
    return {"ratio_ci90": [lo, hi], "equivalent_10pct": bool(lo >= 0.9 and hi <= 1.1)}


def run_bootstrap(per_run: list[list[float]], q: float, seed: int = 0,
                  draws: int = 2000) -> list[float] | None:
    """90 % interval of the pooled quantile ``q`` when whole runs are resampled (with
    replacement): the spread that comes from runs differing, which resampling probes hides (a
    run's tail depends on how that run's threads happened to hand the GIL over)."""
    if len(per_run) < 2:
        return None
    rng = np.random.default_rng(seed)
    runs = [np.asarray(r) for r in per_run]
    boots = [np.quantile(np.concatenate([runs[i] for i in rng.integers(0, len(runs), len(runs))]), q)
             for _ in range(draws)]
    return [float(x) for x in np.quantile(boots, [0.05, 0.95])]


def read_results(run_dir: Path) -> dict:
    """A hardware run's ``results.json`` (or the gzipped or packed form committed measurements
    keep: :mod:`kvsim.calibration.packed`)."""
    path = first_existing(run_dir, "results.json")
    if path is None:
        raise KvsimError(f"{run_dir}: no results.json (or results.json.xz / .gz)")
    return read_json(path)


def _pair(measured: float, predicted: float | None) -> dict:
    return {"measured": measured, "predicted": predicted,
            "ape_pct": None if predicted is None else ape(predicted, measured)}


def _growth(results: dict) -> list[dict]:
    return [c for c in results["calls"] if c["phase"] == "growth" and c["api"] == "KvCache.resize"]


def _probes(results: dict, during: bool | None) -> list[float]:
    holds = [(c["lock_granted_ms"], c["lock_released_ms"]) for c in results["calls"]
             if c["mode"] == "exclusive" and c.get("lock_granted_ms") is not None
             and c.get("lock_released_ms") is not None] if "mode" in results["calls"][0] else []
    out = []
    for c in results["calls"]:
        if c["api"] != "KVCacheManager.probe_reuse" or c.get("latency_ms") is None:
            continue
        if during is None:
            out.append(c["latency_ms"])
            continue
        end = c["start_ms"] + c["latency_ms"]
        hit = any(c["start_ms"] < r and end > g for g, r in holds)
        if hit == during:
            out.append(c["latency_ms"])
    return out


def validate(scenario_path: str, measured_dirs: list[Path], hardware: str | None,
             cpu_model: str | None, copy_measurement: str | None) -> dict:
    from kvsim.scenario.load import load_scenario
    from kvsim.scenario.run import execute

    overrides = ["executor=sim"]
    if hardware:
        overrides.append(f"hardware={hardware}")
    if cpu_model:
        overrides.append(f"cpu_model={cpu_model}")
    scenario = load_scenario(scenario_path, overrides)
    predicted = execute(scenario)
    runs = [read_results(d) for d in measured_dirs]
    if not runs:
        raise KvsimError("validate needs at least one --measured results directory")
    for d, r in zip(measured_dirs, runs):
        if r.get("executor") != "hw":
            raise KvsimError(f"{d}/results.json: executor is {r.get('executor')!r}, not 'hw'")
    out: dict = {"scenario": scenario.name, "file": scenario_path, "hardware": predicted["hardware"],
                 "cpu_model": predicted["cpu_model"], "measured_runs": [str(d) for d in measured_dirs]}
    # Burst resize: per growth call, medians over the runs.
    pg = _growth(predicted)
    rows = []
    for i, p in enumerate(pg):
        ms = [_growth(r)[i] for r in runs if len(_growth(r)) > i]
        host = statistics.median(c["latency_ms"] for c in ms)
        e2e = statistics.median(c["copies_done_ms"] - c["start_ms"] for c in ms if c.get("copies_done_ms"))
        p_e2e = p["copies_done_ms"] - p["start_ms"] if p.get("copies_done_ms") else None
        rows.append({
            "call": i, "pages": p["offloaded_pages"],
            "host_ms": _pair(host, p["latency_ms"]),
            "end_to_end_ms": _pair(e2e, p_e2e),
            "cpu_ms": _pair(statistics.median(c["cpu_ms"] for c in ms), p["cpu_ms"]),
            "submit_ms": _pair(statistics.median(c["submit_ms"] for c in ms), p["submit_ms"]),
        })
    out["burst_resize"] = rows
    # Copy batches of the runs (in order).
    batches = []
    for i, pc in enumerate(predicted["copies"]):
        meas = [r["copies"][i]["seconds"] for r in runs if len(r["copies"]) > i and r["copies"][i]["seconds"]]
        if meas and pc["seconds"]:
            m = statistics.median(meas)
            batches.append({"kind": pc["kind"], "pages": pc["pages"], "page_bytes": pc["page_bytes"],
                            "path_predicted": pc["path"], "path_measured": runs[0]["copies"][i]["path"],
                            "measured_ms": m * 1e3, "predicted_ms": pc["seconds"] * 1e3,
                            "ape_pct": ape(pc["seconds"], m)})
    out["run_copy_batches"] = batches
    # Probes: as many simulated runs as measured ones, each with its own GIL seed (the measured
    # hand-over is random, run to run, in the model as on the machine), pooled like the runs.
    predictions = [predicted]
    if any(c["api"] == "KVCacheManager.probe_reuse" for c in predicted["calls"]):
        predictions += [execute(replace(scenario, sim=replace(scenario.sim, gil_seed=scenario.seed + k)))
                        for k in range(1, len(runs))]
    out["predicted_runs"] = len(predictions)
    probe = {}
    samples = {}
    for label, during in (("all", None), ("during_exclusive_hold", True)):
        meas_runs = [_probes(r, during) for r in runs]
        meas = [x for r in meas_runs for x in r]
        pred = [x for p in predictions for x in _probes(p, during)]
        samples[label] = {"measured": meas, "predicted": pred}
        if not meas or not pred:
            continue
        entry = {"measured_count": len(meas), "predicted_count": len(pred),
                 "ks_statistic": ks_statistic(meas, pred)}
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            m, p = float(np.quantile(meas, q)), float(np.quantile(pred, q))
            runs_ci = run_bootstrap(meas_runs, q)
            entry[name] = {"measured_ms": m, "predicted_ms": p, "ape_pct": ape(p, m),
                           **equivalence(meas, p, q),
                           "measured_run_bootstrap_ci90_ms": runs_ci,
                           "predicted_within_run_ci90": (None if runs_ci is None
                                                         else runs_ci[0] <= p <= runs_ci[1]),
                           "measured_per_run_ms": [float(np.quantile(r, q)) for r in meas_runs if r]}
        probe[label] = entry
    out["probe"] = probe
    out["_samples"] = samples["all"]
    if copy_measurement:
        from kvsim.calibration.copy_fit import KIB, MIB, compare, observations
        from kvsim.hardware import load_hardware

        meas = json.loads(Path(copy_measurement).read_text())
        hw = load_hardware(hardware or scenario.hardware)
        sections = ("paged_ce", "kernel_page_sweep", "kernel_cta_sweep")
        rows_c = [c for c in compare(hw, observations(meas))
                  if c.observation.role == "judge" and c.observation.section in sections
                  and 16 * KIB <= c.observation.page_bytes <= 4 * MIB and c.observation.aligned]
        apes = sorted(abs(c.error_pct) for c in rows_c)
        out["copy_bench"] = {"file": copy_measurement, "rows": len(apes),
                             "median_ape_pct": statistics.median(apes), "worst_ape_pct": apes[-1],
                             "selection": "held-out (judge) batches, 16 KiB-4 MiB pages, aligned, "
                                          "all paths, both directions"}
        prov = meas["provenance"]
        out["gpu"] = prov.get("gpu_name")
        out["driver"] = prov.get("nvml_start", {}).get("driver_version")
    return out


def summary(result: dict) -> dict:
    rows = result["burst_resize"]
    burst = [r["end_to_end_ms"]["ape_pct"] for r in rows if r["end_to_end_ms"]["ape_pct"] is not None]
    # "During a background resize": every probe of the run, which all run while the background
    # thread grows its request step by step; the few probes that overlap an exclusive hold are
    # reported apart (the quantiles of a handful of samples are their extremes).
    probe = result["probe"].get("all") or {}
    held = result["probe"].get("during_exclusive_hold") or {}
    return {
        "copy_batch_median_ape_pct": result.get("copy_bench", {}).get("median_ape_pct"),
        "copy_batch_worst_ape_pct": result.get("copy_bench", {}).get("worst_ape_pct"),
        "burst_resize_ape_pct": statistics.median(burst) if burst else None,
        "burst_resize_host_ape_pct":
            statistics.median(r["host_ms"]["ape_pct"] for r in rows) if rows else None,
        "probe_p50_ape_pct": probe.get("p50", {}).get("ape_pct"),
        "probe_p99_ape_pct": probe.get("p99", {}).get("ape_pct"),
        "probe_overlapping_hold_p50_ape_pct": held.get("p50", {}).get("ape_pct"),
        "probe_overlapping_hold_p99_ape_pct": held.get("p99", {}).get("ape_pct"),
        "probe_overlapping_hold_count": held.get("measured_count"),
        "probe_runs": len(result.get("measured_runs", [])) if probe else None,
        # The +-10 % equivalence verdicts (90 % interval of measured/predicted over probes inside
        # [0.9, 1.1]): a point error under 10 % with an interval past the band is not equivalence.
        "probe_p50_equivalent_10pct": probe.get("p50", {}).get("equivalent_10pct"),
        "probe_p99_equivalent_10pct": probe.get("p99", {}).get("equivalent_10pct"),
        "probe_p99_measured_ms": probe.get("p99", {}).get("measured_ms"),
        "probe_p99_predicted_ms": probe.get("p99", {}).get("predicted_ms"),
        "probe_p99_measured_run_ci90_ms": probe.get("p99", {}).get("measured_run_bootstrap_ci90_ms"),
        "gpu": result.get("gpu"), "driver": result.get("driver"),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def _pack_large(run_dir: Path, limit: int = 256 * 1024) -> None:
    """Gzip (reproducibly: no name, no time) the run's JSON and CSV files above ``limit`` bytes,
    so a committed report keeps every call without megabytes of text."""
    import gzip

    for f in sorted(run_dir.iterdir()):
        if f.suffix in (".json", ".csv") and f.stat().st_size > limit:
            f.with_name(f.name + ".gz").write_bytes(gzip.compress(f.read_bytes(), mtime=0))
            f.unlink()


def run(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.measured]
    try:
        out = open_output_dir(args.out)
        for d in dirs:
            dst = out / "measured" / d.name
            if dst.exists() and dst.resolve() != d.resolve() and not is_kvsim_dir(dst):
                raise OutputDirError(f"--out {out}: {dst} exists and was not written by kvsim")
        result = validate(args.scenario, dirs, args.hardware, args.cpu_model, args.copy_measurement)
    except (KvsimError, OSError, ValueError, KeyError) as e:
        print(f"kvsim validate: {e}", file=sys.stderr)
        return 2
    for d in dirs:
        dst = out / "measured" / d.name
        if dst.resolve() == d.resolve():
            continue  # validated where it lies already
        if dst.exists():
            shutil.rmtree(dst)  # a copy this command made before (checked above)
        shutil.copytree(d, dst)
        (dst / MARKER).write_text(MARKER_TEXT)
        _pack_large(dst)
    samples = result.pop("_samples")
    _figures(result, samples, out)
    (out / f"{result['scenario']}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    validated = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "summary.json"]
    combined = combine([v for v in validated if "burst_resize" in v and "scenario" in v])
    (out / "summary.json").write_text(json.dumps(combined, indent=1, sort_keys=True) + "\n")
    # The console line is this scenario's part of summary.json: a probe scenario's growth steps
    # are not a burst resize, so their error is not printed as one.
    print(json.dumps(combine([result]), sort_keys=True))
    return 0


def _figures(result: dict, samples: dict, out: Path) -> None:
    from kvsim.report.figures import new_figure, save

    name = result["scenario"]
    if samples["measured"] and samples["predicted"]:
        fig, ax = new_figure()
        for label in ("measured", "predicted"):
            v = np.sort(samples[label])
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{label} (n={v.size})")
        ax.set_xscale("log")
        ax.set_xlabel("probe_reuse latency (ms)")
        ax.set_ylabel("fraction of probes")
        ax.set_title(f"{name}: probe latency, measured (hw) vs predicted (sim)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        save(fig, out / f"{name}-probe-cdf.png")
    rows = result["burst_resize"]
    if rows:
        fig, ax = new_figure()
        x = np.arange(len(rows))
        for i, (key, label) in enumerate((("host_ms", "resize() host time"),
                                          ("end_to_end_ms", "until copies done"))):
            ax.bar(x + i * 0.4 - 0.3, [r[key]["measured"] or 0 for r in rows], 0.2,
                   label=f"{label}: measured")
            ax.bar(x + i * 0.4 - 0.1, [r[key]["predicted"] or 0 for r in rows], 0.2,
                   label=f"{label}: predicted")
        ax.set_xticks(x)
        ax.set_xticklabels([f"call {r['call']}\n{r['pages']} pages" for r in rows], fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title(f"{name}: burst resize, measured (median of runs) vs predicted")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        save(fig, out / f"{name}-burst.png")


def combine(results: list[dict]) -> dict:
    """One summary over every scenario validated into the same directory: copy figures from the
    run that had the copy-bench file, burst figures from burst scenarios (one resize per run),
    probe figures from runs with probes."""
    out: dict = {"scenarios": [r["scenario"] for r in results]}
    for r in results:
        s = summary(r)
        if r.get("copy_bench"):
            out.update({k: s[k] for k in ("copy_batch_median_ape_pct", "copy_batch_worst_ape_pct",
                                          "gpu", "driver")})
        if len(r["burst_resize"]) == 1:
            out["burst_resize_ape_pct"] = s["burst_resize_ape_pct"]
            out["burst_resize_host_ape_pct"] = s["burst_resize_host_ape_pct"]
        if r["probe"]:
            for k in ("probe_p50_ape_pct", "probe_p99_ape_pct", "probe_overlapping_hold_p50_ape_pct",
                      "probe_overlapping_hold_p99_ape_pct", "probe_overlapping_hold_count",
                      "probe_runs", "probe_p50_equivalent_10pct", "probe_p99_equivalent_10pct",
                      "probe_p99_measured_ms", "probe_p99_predicted_ms",
                      "probe_p99_measured_run_ci90_ms"):
                out[k] = s[k]
        out["date"] = s["date"]
    return out
