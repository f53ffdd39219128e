"""Re-derive a CPU preset's GIL hand-over fields from the raw benchmark runs its calibration
samples keep (``gil_handover.raw_runs``), with this version's estimator. For calibrations made
before the estimator gained a field (the takeover-delay distribution), so no machine is needed.

    python3 tools/gil_fields_from_samples.py SAMPLES.json PRESET.json   (rewrites PRESET.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvsim.calibration import gil_handover as gh
from kvsim.calibration.cpu_fit import gil_fields, machine_label


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    samples_file, preset_file = map(Path, argv)
    samples = json.loads(samples_file.read_text())
    raw = samples["gil_handover"]["raw_runs"]
    runs = [gh.HandoverRun([tuple(c) for c in r["calls"]],
                           {t: tuple(v) for t, v in r["thread_starts"].items()}) for r in raw]
    est = gh.estimate(runs)
    m = samples["machine"]
    machine = machine_label(m["node"], m["processor"], m["python"])
    preset = json.loads(preset_file.read_text())
    for key in ("gil_takeover_per_s", "gil_starter_takeover_per_s", "gil_takeover_delay_ms"):
        preset.pop(key, None)
    fields = gil_fields(est, str(samples_file), machine)
    fields = {k: {**v, "source": v["source"] + " (re-derived by tools/gil_fields_from_samples.py)"}
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
    print(json.dumps({k: v["value"] for k, v in fields.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
