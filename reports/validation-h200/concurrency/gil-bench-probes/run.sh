#!/bin/bash
# GIL benchmark A/B on the device: 4000 (new default) against 400 probes per thread, then the fit of each.
set -u
D=$OUT/gil-4000
mkdir -p $D
C=reports/validation-h200/concurrency/measured-4/calib
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -V; nproc; lscpu | grep -E "Model name|^CPU\(s\)"; sha256sum kvsim/calibration/gil_handover.py kvsim/calibration/gil_fit.py tools/gil_bench_runs.py tools/gil_fields_from_samples.py kvsim/manager/*.py | sha256sum; sha256sum kvsim/calibration/gil_handover.py kvsim/calibration/gil_fit.py tools/gil_bench_runs.py; } > $D/machine.txt 2>&1
for r in 1 2; do
  t0=$(date +%s.%N); python3 tools/gil_bench_runs.py $D/gil-bench-4000.jsonl 4 12 || exit 3
  t1=$(date +%s.%N); python3 tools/gil_bench_runs.py $D/gil-bench-400.jsonl 4 12 --probes 400 || exit 3
  t2=$(date +%s.%N); echo "round $r: 4000-probe runs $(python3 -c "print(round($t1-$t0,1))") s, 400-probe runs $(python3 -c "print(round($t2-$t1,1))") s" >> $D/log.txt
done
python3 -c "from kvsim.calibration.packed import read_json; import json; json.dump(read_json('$C/kvsim-python-h200host-samples.json.xz'), open('$D/samples.json','w'))"
for p in 4000 400; do
  cp $C/p4-A.json $D/p4-A-bench$p.json
  ( time python3 tools/gil_fields_from_samples.py $D/samples.json $D/p4-A-bench$p.json $D/gil-bench-$p.jsonl ) > $D/fit-$p.log 2>&1
  echo "fit $p rc=$?" >> $D/log.txt
done
rm $D/samples.json
cat $D/log.txt; tail -3 $D/fit-*.log; ls -la $D
