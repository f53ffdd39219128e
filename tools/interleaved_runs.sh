#!/usr/bin/env bash
# Probe validation runs with the GIL model's fit set measured between them: after each run of
# the validation scenario, one run of the GIL hand-over benchmark with 4 and one with 12 threads
# (alternating which first). The machine's GIL hand-over drifts within minutes
# (reports/validation-h200/README.md), so a benchmark made only before the runs does not see
# the state they saw; interleaved, both sample the same minutes. The scenario (8 probe threads and
# a resize) lies between the two thread counts it is fitted on.
# Usage, on the GPU machine from the repository root:
#   tools/interleaved_runs.sh OUT_DIR FIRST LAST [calibrate]
# Writes OUT_DIR/calib (with "calibrate": the CPU preset, as tools/validation_runs.sh),
# OUT_DIR/v/probeN (results.json.gz, slim: tools/slim_results.py) and OUT_DIR/gil-bench.jsonl
# (tools/gil_bench_runs.py). Full results stay in OUT_DIR/full. With RUNS_UNTIL set (a Unix
# time), no run starts after it: a command limit then ends the call between runs, never in one.
set -euo pipefail
out=${1:?usage: tools/interleaved_runs.sh OUT_DIR FIRST LAST [calibrate]}
first=${2:?FIRST}
last=${3:?LAST}
say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
mkdir -p "$out/v"
if [[ "${4:-}" == calibrate ]]; then
  say "calibrate"
  python3 -m kvsim calibrate --out "$out/calib" --repeats 15 --gil-runs 2 --no-gil-fit --name kvsim-python-h200host --quiet
fi
for i in $(seq "$first" "$last"); do
  if [[ -n "${RUNS_UNTIL:-}" ]] && (( $(date +%s) >= RUNS_UNTIL )); then
    say "RUNS_UNTIL reached: stopping before run $i"
    break
  fi
  python3 -m kvsim run scenarios/validation/h200_probe_during_resize.yaml --out "$out/full/probe$i" --quiet
  python3 tools/slim_results.py "$out/v" "$out/full/probe$i"
  if (( i % 2 )); then counts="4 12"; else counts="12 4"; fi
  python3 tools/gil_bench_runs.py "$out/gil-bench.jsonl" $counts
  say "run $i"
done
say "done"
