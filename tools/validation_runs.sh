#!/usr/bin/env bash
# The hardware side of reports/validation-h200, in one go (one device call: the CPU calibration
# is only compared with runs made in the same call, see that README). Usage, on the GPU machine
# from the repository root: tools/validation_runs.sh OUT_DIR [PRESET_NAME]
# Writes OUT_DIR/calib (the CPU preset + samples, the GIL hand-over by shape), OUT_DIR/v/{burst1-5,burstcold1-3,probe1-5},
# and OUT_DIR/calib-end (a second, short calibration: how far the machine drifted meanwhile).
set -euo pipefail
out=${1:?usage: tools/validation_runs.sh OUT_DIR [PRESET_NAME]}
name=${2:-kvsim-python-h200host}
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
say "calibrate"
python3 -m kvsim calibrate --out "$out/calib" --repeats 15 --name "$name" --quiet
say "GIL hand-over by shape"
python3 tools/gil_handover_shapes.py "$out/calib/gil-handover-shapes.json" --runs 3
for i in 1 2 3 4 5; do
  say "burst $i"; python3 -m kvsim run scenarios/hw/h200_burst_resize.yaml --out "$out/v/burst$i" --quiet
done
for i in 1 2 3; do
  say "burst cold $i"
  python3 -m kvsim run scenarios/hw/h200_burst_resize.yaml --set hw.warmup_runs=0 --out "$out/v/burstcold$i" --quiet
done
for i in 1 2 3 4 5; do
  say "probe $i"
  python3 -m kvsim run scenarios/validation/h200_probe_during_resize.yaml --out "$out/v/probe$i" --quiet
done
say "calibrate again (drift)"
python3 -m kvsim calibrate --out "$out/calib-end" --repeats 3 --name "$name-end" --quiet
say "done"
