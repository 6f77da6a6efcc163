#!/usr/bin/env bash
# One device call for the GDN kernels, within the device's 10 minutes per command: a short sweep of
# the fused round's launch shapes (bench/gdn_fold_sweep.py, for the record; the shipped VERIFY_TUNING
# is what the benchmark runs), the side-by-side benchmark, and the runtime's GPU exactness.
#   device tool, carry .baselines:   bash bench/device_kernels.sh $OUT
# Each step has its own time cap so a slow one cannot take the others' results with it; the logs
# print every row as it is measured, so a step stopped by its cap still leaves its numbers.
# (bench/gdn_tuning.py sweeps the verify and commit kernels alone, a separate call: its choice is
# for the verify without a pending commit, not for the round the runtime runs.)
set -u
OUT=${1:?usage: bash bench/device_kernels.sh OUT}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
timeout 60 python3 bench/gdn_fold_sweep.py --widths 4,16 --samples 10 --out "$OUT" > "$OUT/gdn_fold_sweep.log" 2>&1
echo "gdn_fold_sweep rc $?"
timeout 420 python3 bench/gdn_kernels.py --out "$OUT" > "$OUT/gdn_kernels.log" 2>&1
echo "gdn_kernels rc $?"
timeout 110 python3 bench/gpu_exactness.py --prompts 6 --tokens 32 > "$OUT/gpu_exactness.log" 2>&1
echo "gpu_exactness rc $?"
sed -n '/^fastest per w/,$p' "$OUT/gdn_fold_sweep.log"
[ -f "$OUT/gdn_kernels.md" ] && sed -n '/^## Median/,/^## Verification/p' "$OUT/gdn_kernels.md"
tail -7 "$OUT/gpu_exactness.log"
