"""Re-derive a CPU preset's GIL hand-over fields from raw benchmark runs, with this version's
estimator and fit, so no machine is needed: the runs a calibration's samples keep
(``gil_handover.raw_runs``), or runs made apart (tools/gil_bench_runs.py, as
tools/interleaved_runs.sh makes them between validation runs).

    python3 tools/gil_fields_from_samples.py SAMPLES.json PRESET.json [BENCH.jsonl[.gz|.xz] ...]

Rewrites PRESET.json's GIL fields (and its host speed factor, from the same runs:
kvsim.calibration.host_speed) and writes the estimate and the fit, every grid point
included, to PRESET-gil-fit.json beside SAMPLES.json (not beside the preset: a preset directory
holds presets only). The fit simulates the benchmark: minutes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvsim.calibration import gil_fit, host_speed
from kvsim.calibration import gil_handover as gh
from kvsim.calibration.cpu_fit import gil_fields, machine_label
from kvsim.calibration.packed import read_json
from kvsim.model.cpu_cost import cpu_model_from_dict

GIL_KEYS = ("gil_hold_ms", "gil_hold_waiter_exponent", "gil_recent_taker_share",
            "gil_starter_takeover_per_s", "host_speed_factor",
            # the previous model's fields, replaced
            "gil_takeover_per_s", "gil_takeover_delay_ms")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    samples_file, preset_file, bench_files = Path(argv[0]), Path(argv[1]), argv[2:]
    samples = read_json(samples_file)
    if bench_files:
        runs = gh.read_runs(bench_files)
        source = ", ".join(bench_files)
    else:
        runs = gh.runs_from_json(samples["gil_handover"]["raw_runs"])
        source = str(samples_file)
    est = gh.estimate([r for rs in runs.values() for r in rs])
    preset = json.loads(preset_file.read_text())
    for key in GIL_KEYS:
        preset.pop(key, None)
    # The host's speed over these runs first: the fit simulates the benchmark at that speed.
    est["host_speed"] = host_speed.factor(cpu_model_from_dict(preset, preset_file), runs)
    stretched = {**preset, "host_speed_factor": host_speed.preset_field(est["host_speed"], source)}
    try:
        result = gil_fit.fit(cpu_model_from_dict(stretched, preset_file),
                             gil_fit.estimated_handover(est), runs,
                             progress=lambda m: print(m, file=sys.stderr),
                             starter=gh.starter_observations(est))
    except gil_fit.FlatFitError as exc:  # nothing fitted: leave the preset as it was
        print(f"{preset_file}: not written: {exc}", file=sys.stderr)
        return 2
    est["fit"] = gil_fit.summary(result)
    m = samples["machine"]
    fields = gil_fields(est, source, machine_label(m["node"], m["processor"], m["python"]))
    fields = {k: {**v, "source": v["source"] + " (derived by tools/gil_fields_from_samples.py)"}
              for k, v in fields.items()}
    out, placed = {}, False
    for k, v in preset.items():  # keep the preset's order: the GIL fields before callback_us
        if k == "callback_us" and not placed:
            out.update(fields)
            placed = True
        out[k] = v
    if not placed:
        out.update(fields)
    preset_file.write_text(json.dumps(out, indent=1) + "\n")
    fit_file = samples_file.with_name(preset_file.stem + "-gil-fit.json")
    fit_file.write_text(json.dumps({
        "what": "GIL hand-over estimate (kvsim.calibration.gil_handover) and fit "
                "(kvsim.calibration.gil_fit) from the benchmark runs in 'runs_from'",
        "runs_from": source, "runs_by_thread_count": {n: len(r) for n, r in runs.items()},
        "estimate": est}, indent=1, default=list) + "\n")
    print(json.dumps({k: v["value"] for k, v in fields.items() if k != "gil_hold_ms"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
