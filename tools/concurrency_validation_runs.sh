#!/usr/bin/env bash
# The hardware side of issue 23's concurrency validation, in ONE device command
# (reports/validation-h200/concurrency/PROTOCOL.md): the CPU calibration first (as calls E and F,
# tools/interleaved_runs.sh), then rounds of every case of kvsim/calibration/concurrency_judge.py
# (the four bug scenarios with each variant, probe_during_resize at 2 lock policies x 2 thread
# counts x 3 probe intervals), each round in its own seeded order, cut into chunks of CHUNK cases
# (one process each), with one run of the GIL hand-over benchmark with 4 and one with 12 threads
# after every chunk (tools/gil_bench_runs.py, alternating which first), until the deadline.
#
# Usage, from the repository root (python3 -m kvsim must work):
#   tools/concurrency_validation_runs.sh [--dry-run | --no-gpu] OUT
#     (default)  executor hw with real copies: the measurement (GPU machine, CuPy)
#     --dry-run  executor sim stands in for hw (no GPU): exercises everything here
#     --no-gpu   executor hw with hw.copier=none: real threads and lock, no copies
# Environment (all optional):
#   BUDGET_S   seconds from the start to the end of this script (default 470): no run starts
#              after BUDGET_S-45, a run still going at BUDGET_S-25 is cut (not judged), the rest
#              is packing
#   ROUNDS     at most this many rounds (default: as many as the budget allows)
#   ORDER_SEED seeds the rounds' case orders with the round number (default 0: the round alone,
#              the same orders in every call, as calls 4-11 ran; give each call its own)
#   CHUNK      cases per process (default 5); CASES: only these cases (default: all)
#   CALIBRATE  0: skip the calibration (the dry run then simulates the shipped preset)
#   GIL_BENCH  0: skip the GIL benchmark runs; GIL_BENCH_EVERY=K: a pair after every K-th chunk
#              only (default 1; at 4000 probes a pair is ~0.3 MB packed, so 16 pairs would not
#              fit reports/); GIL_PROBES: probes per thread (default: gil_bench_runs.py's);
#   SPEED_PROBE  set (to anything): each run's process times the churn loop before and after the
#              run, into the run's speed.json (measure --speed-probe; the judge's --run-speed)
#   PYTHON     the interpreter (default python3)
# Writes OUT/manifest.json, OUT/machine.txt, OUT/log.txt, OUT/calib/ (the CPU preset and its
# samples, packed), OUT/v/CASE/rN/results.json.xz (slim, packed), OUT/runs.jsonl (one line per
# run), OUT/gil-bench.jsonl.xz, OUT/sizes.txt. 3-4 MB in all on the H200 (3-5 rounds: a
# probe_during_resize run 23-53 KB, a bug run 4-51 KB, a GIL benchmark pair ~35 KB, the samples
# ~170 KB; the dry run's 16 rounds here made 8.1 MiB), every file far under the device tool's
# 16 MiB return limit.
set -euo pipefail
mode=hw
case "${1:-}" in
  --dry-run) mode=dry-run; shift ;;
  --no-gpu) mode=no-gpu; shift ;;
esac
out=${1:?usage: tools/concurrency_validation_runs.sh [--dry-run | --no-gpu] OUT}
py=${PYTHON:-python3}
budget=${BUDGET_S:-470}
chunk=${CHUNK:-5}
every=${GIL_BENCH_EVERY:-1}
probes=()
if [[ -n "${GIL_PROBES:-}" ]]; then probes=(--probes "$GIL_PROBES"); fi
whole() {  # NAME VALUE: refused (exit 2, before any work) unless a whole number >= 1
  if ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then echo "$1 must be a whole number >= 1, got '$2'" >&2; exit 2; fi
}
whole GIL_BENCH_EVERY "$every"
if [[ -n "${GIL_PROBES:-}" ]]; then whole GIL_PROBES "$GIL_PROBES"; fi
t0=$(date +%s)
runs_until=$(( t0 + budget - 45 ))
hard_end=$(( t0 + budget - 25 ))
name=kvsim-python-h200host
judge=(env PYTHONUNBUFFERED=1 "$py" -m kvsim.calibration.concurrency_judge)
# First, before anything is measured: the cases as the committed code defines them (an OUT
# holding an earlier call is refused).
"${judge[@]}" manifest "$out" --mode "$mode" --budget-s "$budget"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/log.txt" >&2; }

{ date -u; nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv 2>/dev/null || echo "no nvidia-smi";
  "$py" -c 'import sys; print(sys.version)'
  "$py" -c 'import cupy, cupy.cuda.runtime as r; print("cupy", cupy.__version__, r.runtimeGetVersion())' 2>/dev/null || echo "no cupy"
  nproc; git rev-parse HEAD 2>/dev/null || echo "git: no commit"; } > "$out/machine.txt"

cpu=$name
if [[ "${CALIBRATE:-1}" != 0 ]]; then
  say "calibrate"
  if timeout $(( runs_until - $(date +%s) )) "$py" -m kvsim calibrate --out "$out/calib" --repeats 15 \
       --gil-runs 2 --no-gil-fit --name "$name" --quiet >> "$out/log.txt" 2>&1; then
    cpu=$out/calib/$name.json
  else
    say "calibration FAILED (rc $?): the call is not judged (PROTOCOL.md); runs go on as diagnostics"
  fi
fi

if [[ -n "${CASES:-}" ]]; then read -r -a only <<< "$CASES"; fi
round=0
bench=0
chunks=0
while (( $(date +%s) < runs_until )); do
  round=$(( round + 1 ))
  if [[ -n "${ROUNDS:-}" ]] && (( round > ROUNDS )); then break; fi
  mapfile -t order < <("${judge[@]}" order "$round" --call-seed "${ORDER_SEED:-0}")
  if [[ -n "${CASES:-}" ]]; then
    keep=()
    for c in "${order[@]}"; do for o in "${only[@]}"; do [[ "$c" == "$o" ]] && keep+=("$c"); done; done
    order=("${keep[@]}")
  fi
  if (( ${#order[@]} == 0 )); then say "round $round: no case to run"; break; fi
  say "round $round: ${#order[@]} cases (order seed ${ORDER_SEED:-0})"
  for (( i = 0; i < ${#order[@]}; i += chunk )); do
    now=$(date +%s)
    if (( now >= runs_until )); then break; fi
    # The process ends itself at the hard end (a run still going is cut); timeout is a backstop.
    rc=0
    timeout $(( hard_end - now + 10 )) "${judge[@]}" measure "$out" --mode "$mode" --cpu-model "$cpu" \
      --round "$round" --until "$runs_until" --hard-end "$hard_end" ${SPEED_PROBE:+--speed-probe} "${order[@]:i:chunk}" \
      2>> "$out/log.txt" || rc=$?
    if (( rc == 2 )); then say "measure refused (exit 2, see log.txt): stopping"; break 2; fi
    if (( rc != 0 )); then
      say "round $round chunk $(( i / chunk + 1 )): exit $rc"
      # A run the process left without a result or marker (killed by the backstop timeout or a
      # crash): killed.json, listed by the judge, not judged.
      for d in "$out"/v/*/r"$round"; do
        if [[ -d "$d" ]] && ! ls "$d" | grep -qv '\.part$'; then
          echo "{\"status\": \"killed\", \"exit\": $rc}" > "$d/killed.json"
          say "$d: no result (exit $rc): killed.json"
        fi
      done
    fi
    chunks=$(( chunks + 1 ))
    if [[ "${GIL_BENCH:-1}" != 0 ]] && (( chunks % every == 0 )) && (( $(date +%s) < runs_until )); then
      bench=$(( bench + 1 ))
      if (( bench % 2 )); then counts="4 12"; else counts="12 4"; fi
      "$py" tools/gil_bench_runs.py "$out/gil-bench.jsonl" $counts ${probes[@]+"${probes[@]}"} \
        2>> "$out/log.txt" \
        || say "GIL benchmark pair $bench: exit $?"
    fi
  done
done
touch "$out/runs.jsonl"
say "runs done: $(grep -c '"status": "ok"' "$out/runs.jsonl" || true) ok of $(wc -l < "$out/runs.jsonl") runs; $bench GIL benchmark pairs"

pack=()
[[ -f "$out/gil-bench.jsonl" ]] && pack+=("$out/gil-bench.jsonl")
[[ -f "$out/calib/$name-samples.json" ]] && pack+=("$out/calib/$name-samples.json")
if (( ${#pack[@]} )); then
  "$py" tools/pack_measurements.py "${pack[@]}" >> "$out/log.txt" 2>&1 || say "packing failed: exit $?"
fi
{ du -sb "$out" | cut -f1 | awk '{printf "total %.2f MiB\n", $1 / 1048576}'
  find "$out" -type f -size +4M -printf "large: %s bytes %p\n"; } > "$out/sizes.txt"
say "done in $(( $(date +%s) - t0 )) s: $(head -1 "$out/sizes.txt")"
