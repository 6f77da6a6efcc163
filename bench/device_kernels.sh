#!/usr/bin/env bash
# One device call for the GDN kernels, within the device's 10 minutes per command: the launch
# sweep, the side-by-side benchmark with the sweep's choice, and the runtime's GPU exactness.
#   device tool, carry .baselines:   bash bench/device_kernels.sh $OUT
# Each step has its own time cap so a slow one cannot take the others' results with it; the logs
# print every row as it is measured, so a step stopped by its cap still leaves its numbers.
set -u
OUT=${1:?usage: bash bench/device_kernels.sh OUT}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
timeout 180 python3 bench/gdn_tuning.py --out "$OUT" > "$OUT/gdn_tuning.log" 2>&1
echo "gdn_tuning rc $?"
tuning=()
[ -f "$OUT/gdn_tuning.json" ] && tuning=(--tuning "$OUT/gdn_tuning.json")
timeout 330 python3 bench/gdn_kernels.py "${tuning[@]}" --out "$OUT" > "$OUT/gdn_kernels.log" 2>&1
echo "gdn_kernels rc $?"
timeout 70 python3 bench/gpu_exactness.py --prompts 6 --tokens 32 > "$OUT/gpu_exactness.log" 2>&1
echo "gpu_exactness rc $?"
[ -f "$OUT/gdn_tuning.md" ] && sed -n '/^| T | method/,/^$/p' "$OUT/gdn_tuning.md"
[ -f "$OUT/gdn_kernels.md" ] && sed -n '/^## Median/,/^## Verification/p' "$OUT/gdn_kernels.md"
tail -7 "$OUT/gpu_exactness.log"
