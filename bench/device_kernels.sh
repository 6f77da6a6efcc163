#!/usr/bin/env bash
# The GDN kernels on the device, within its 10 minutes per command: the side-by-side benchmark and
# the runtime's GPU exactness, both in one call (all, the default) or each in a call of its own.
#   device tool, carry .baselines, timeout 600:   bash bench/device_kernels.sh $OUT [all|bench|exactness]
# Each step has its own time cap so a slow one cannot take the other's results with it; the logs
# print every row as it is measured, so a step stopped by its cap still leaves its numbers
# (`python3 bench/gdn_kernels.py --from-log LOG --out DIR` writes the report from them). The full
# benchmark took about 440 s on 2026-12-02, so the sweeps are separate calls:
# bench/gdn_fold_sweep.py for the fused round the runtime runs, bench/gdn_tuning.py for the verify
# and commit kernels alone (its choice is for the verify without a pending commit).
set -u
OUT=${1:?usage: bash bench/device_kernels.sh OUT [all|bench|exactness]}
STEP=${2:-all}
case "$STEP" in
  all) BENCH_CAP=455 EXACT_CAP=135 ;;  # the full benchmark can just miss its cap here
  bench) BENCH_CAP=590 EXACT_CAP=0 ;;
  exactness) BENCH_CAP=0 EXACT_CAP=590 ;;
  *) echo "device_kernels.sh: step must be all, bench or exactness, not '$STEP'" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ "$BENCH_CAP" -gt 0 ]; then
  timeout "$BENCH_CAP" python3 bench/gdn_kernels.py --out "$OUT" > "$OUT/gdn_kernels.log" 2>&1
  echo "gdn_kernels rc $?"
  [ -f "$OUT/gdn_kernels.md" ] && sed -n '/^## Median/,/^## Verification/p' "$OUT/gdn_kernels.md"
fi
if [ "$EXACT_CAP" -gt 0 ]; then
  timeout "$EXACT_CAP" python3 bench/gpu_exactness.py --prompts 6 --tokens 32 > "$OUT/gpu_exactness.log" 2>&1
  echo "gpu_exactness rc $?"
  tail -7 "$OUT/gpu_exactness.log"
fi
