#!/usr/bin/env bash
# Many measured runs of the probe validation scenario, for a p99 whose run-to-run spread is
# known (one run's p99 moves 5x between identical runs), with the GIL hand-over benchmark every
# CHECK runs to show how far the machine drifts meanwhile. Usage, on the GPU machine from the
# repository root: tools/probe_runs_many.sh OUT_DIR RUNS [CHECK]
# Writes OUT_DIR/calib (CPU preset, as tools/validation_runs.sh), OUT_DIR/v/probeN (results.json
# and calls.csv only) and OUT_DIR/gil-drift.jsonl (one estimate per check).
set -euo pipefail
out=${1:?usage: tools/probe_runs_many.sh OUT_DIR RUNS [CHECK]}
runs=${2:?RUNS}
check=${3:-10}
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
drift() {
  python3 - "$1" >> "$out/gil-drift.jsonl" <<'PY'
import json, sys
from kvsim.calibration import gil_handover as gh
e = gh.estimate(gh.measure(3))
print(json.dumps({"after_run": int(sys.argv[1]), "worker_takeover_per_s": e["worker_takeover_per_s"],
                  "worker_takeovers": e["worker_takeovers"],
                  "starter_takeover_per_s": e["starter_takeover_per_s"],
                  "starter_takeovers": e["starter_takeovers"]}))
PY
}
say "calibrate"
python3 -m kvsim calibrate --out "$out/calib" --repeats 15 --name kvsim-python-h200host --quiet
for i in $(seq 1 "$runs"); do
  python3 -m kvsim run scenarios/validation/h200_probe_during_resize.yaml --out "$out/v/probe$i" --quiet
  rm -f "$out/v/probe$i"/*.png "$out/v/probe$i/report.md"
  if (( i % check == 0 )); then say "run $i"; drift "$i"; fi
done
say "done"
