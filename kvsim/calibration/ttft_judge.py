"""The TTFT validation (issue 24): a serving scenario measured on the GPU, predicted by the
simulator, judged (protocol: ``reports/validation-h200/ttft/PROTOCOL.md``).

``judge`` reads the measured run (``kvsim run SCENARIO --out DIR`` with executor hw: ``DIR``'s
``results.json`` and each variant's ``variants/NAME/results.json``, plain or compressed), runs
the same scenario and variants in the simulator (``executor: sim``, everything else as
written), and compares time to first token per run: p50 and p99, target :data:`TARGET_PCT`.
Beside the judged figures it lists what explains them: hit rate, queueing, copy wait, and the
prefill GPU time (measured by CUDA events in the hardware run, modelled in the simulator), and
per run the passes' prefill time against the engine times by the pass's new tokens
(:func:`pass_bands`).

    python -m kvsim.calibration.ttft_judge SCENARIO MEASURED_DIR --out JUDGE_DIR [--set KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from kvsim.calibration.packed import first_existing, read_json

TARGET_PCT = 10.0
JUDGED = ("ttft_p50_ms", "ttft_p99_ms")
SHOWN = ("hit_rate", "queue_p50_ms", "queue_p99_ms", "copy_wait_p50_ms", "ttft_mean_ms",
         "gpu_busy_s", "prefill_s", "passes", "failed", "admission_retries")


def measured_runs(directory: Path) -> dict[str, dict]:
    """Run name (``base`` and each variant) -> its results object."""
    def load(folder: Path) -> dict:
        path = first_existing(folder, "results.json")
        if path is None:
            raise FileNotFoundError(f"no results.json (or .xz, .gz) in {folder}")
        return read_json(path)

    base = load(directory)
    runs = {"base": base}
    for name in base.get("variants", {}):
        runs[name] = load(directory / "variants" / name)
    return runs


BANDS = ((0, 1024, "< 1k"), (1024, 4096, "1k-4k"), (4096, 16384, "4k-16k"),
         (16384, 1 << 62, ">= 16k"))


def pass_bands(forward: dict, times) -> list[dict]:
    """Each pass's CUDA-event prefill time (``hw.forward.per_pass``) over the engine times'
    price of its prefills, by the pass's new tokens (:data:`BANDS`): passes, median and range
    of the ratio."""
    import statistics

    pp = forward.get("per_pass") or {}
    rows = []
    for lo, hi, label in BANDS:
        ratios = []
        for prefills, ms in zip(pp.get("prefills", []), pp.get("prefill_ms", [])):
            new = sum(n for n, _ in prefills)
            model = sum(times.prefill_seconds(n, c) for n, c in prefills) * 1e3
            if lo <= new < hi and model > 0:
                ratios.append(ms / model)
        if ratios:
            rows.append({"new_tokens": label, "passes": len(ratios),
                         "median": statistics.median(ratios), "min": min(ratios),
                         "max": max(ratios)})
    return rows


def predicted_runs(scenario_file: str, overrides: list[str] | None = None) -> tuple[dict[str, dict], dict]:
    """The simulator's results per run, and per run the engine times it priced with."""
    from kvsim.llm.engine_time import load_engine_times
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.run import execute
    from kvsim.serving.engine import serving_architecture

    sf = load_scenario_file(scenario_file, overrides)
    scenarios = {"base": sf.base, **{v.name: sc for v, sc in sf.variants}}
    runs, times = {}, {}
    for name, sc in scenarios.items():
        runs[name] = execute(replace(sc, executor="sim"))
        times[name] = load_engine_times(sc.workload.engine_times, serving_architecture(sc.workload))
    return runs, times


def judge(scenario_file: str, measured_dir: str | Path, overrides: list[str] | None = None) -> dict:
    """``overrides`` (``KEY=VALUE``, as ``kvsim run --set``) change the prediction only: a
    what-if, not the pre-registered judgement."""
    measured = measured_runs(Path(measured_dir))
    predicted, times = predicted_runs(scenario_file, overrides)
    out: dict = {"scenario": scenario_file, "target_pct": TARGET_PCT, "runs": {},
                 "prediction_overrides": list(overrides or [])}
    for name, m_res in measured.items():
        m, p = m_res["workload_summary"], predicted[name]["workload_summary"]
        row: dict = {"judged": {}, "shown": {}}
        for k in JUDGED:
            err = (p[k] / m[k] - 1) * 100 if m[k] else None
            row["judged"][k] = {"measured": m[k], "predicted": p[k], "error_pct": err,
                                "met": err is not None and abs(err) <= TARGET_PCT}
        for k in SHOWN:
            row["shown"][k] = {"measured": m.get(k), "predicted": p.get(k)}
        fwd = (m_res.get("hw") or {}).get("forward") or {}
        row["shown"]["prefill_gpu_s_cuda_events"] = {"measured": fwd.get("prefill_s"),
                                                     "predicted": p.get("prefill_s")}
        row["requests"] = {"measured": m["requests"], "predicted": p["requests"]}
        row["prefill_by_new_tokens"] = pass_bands(fwd, times[name])
        out["runs"][name] = row
    out["met"] = sum(v["met"] for r in out["runs"].values() for v in r["judged"].values())
    out["judged"] = sum(len(r["judged"]) for r in out["runs"].values())
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def markdown(result: dict) -> str:
    what_if = result.get("prediction_overrides")
    lines = [f"# TTFT: predicted against measured ({result['met']} of {result['judged']} within "
             f"{result['target_pct']:g} %)", ""]
    if what_if:
        lines += ["A what-if, not a pre-registered judgement: the prediction with "
                  + ", ".join(f"`{o}`" for o in what_if) + ".", ""]
    lines += ["| run | figure | measured | predicted | error | within 10 % |",
              "|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        for k, v in r["judged"].items():
            err = "-" if v["error_pct"] is None else f"{v['error_pct']:+.1f} %"
            lines.append(f"| {name} | {k} | {v['measured']:.1f} | {v['predicted']:.1f} | {err} | "
                         f"{'met' if v['met'] else 'missed'} |")
    lines += ["", "What explains them (not judged):", "", "| run | figure | measured | predicted |",
              "|---|---|---|---|"]
    for name, r in result["runs"].items():
        for k, v in r["shown"].items():
            lines.append(f"| {name} | {k} | {_fmt(v['measured'])} | {_fmt(v['predicted'])} |")
    if any(r.get("prefill_by_new_tokens") for r in result["runs"].values()):
        lines += ["", "Each pass's prefill time (CUDA events) over the engine times' price, by the "
                  "pass's new tokens (not judged):", "",
                  "| run | new tokens | passes | median | min | max |", "|---|---|---|---|---|---|"]
        for name, r in result["runs"].items():
            for b in r.get("prefill_by_new_tokens", []):
                lines.append(f"| {name} | {b['new_tokens']} | {b['passes']} | {b['median']:.3f} | "
                             f"{b['min']:.3f} | {b['max']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvsim.calibration.ttft_judge")
    ap.add_argument("scenario")
    ap.add_argument("measured")
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of the prediction only (a what-if)")
    args = ap.parse_args(argv)
    from kvsim.output_dir import open_output_dir

    out = open_output_dir(Path(args.out), "--out")
    result = judge(args.scenario, args.measured, args.set)
    (out / "ttft-judge.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / "ttft-judge.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
