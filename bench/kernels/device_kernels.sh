#!/usr/bin/env bash
# The GDN kernels on the device, within its 10 minutes per command: the side-by-side benchmark and
# the GPU tests (tests/gpu: Triton against PyTorch, every policy's tokens equal to ar's), both in
# one call (all, the default) or each in a call of its own.
#   device tool, carry .baselines, timeout 600:   bash bench/kernels/device_kernels.sh $OUT [all|bench|exactness]
# Run from the repository root; the package is imported from it (PYTHONPATH). Each step has its own
# time cap so a slow one cannot take the other's results with it; the benchmark's log prints every
# row as it is measured, so a step stopped by its cap still leaves its numbers
# (`python3 bench/kernels/gdn_kernels.py --from-log LOG --out DIR` writes the report from them).
# The sweeps are calls of their own: bench/kernels/gdn_fold_sweep.py for the fused round the
# runtime runs, bench/kernels/gdn_tuning.py for the verify and commit kernels alone.
set -u
OUT=${1:?usage: bash bench/kernels/device_kernels.sh OUT [all|bench|exactness]}
STEP=${2:-all}
case "$STEP" in
  all) BENCH_CAP=455 EXACT_CAP=135 ;;  # the full benchmark can just miss its cap here
  bench) BENCH_CAP=590 EXACT_CAP=0 ;;
  exactness) BENCH_CAP=0 EXACT_CAP=590 ;;
  *) echo "device_kernels.sh: step must be all, bench or exactness, not '$STEP'" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0  # compiled kernels (tests/conftest.py would ask for the interpreter)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ "$BENCH_CAP" -gt 0 ]; then
  timeout "$BENCH_CAP" python3 bench/kernels/gdn_kernels.py --out "$OUT" > "$OUT/gdn_kernels.log" 2>&1
  echo "gdn_kernels rc $?"
  [ -f "$OUT/gdn_kernels.md" ] && sed -n '/^## Median/,/^## Verification/p' "$OUT/gdn_kernels.md"
fi
if [ "$EXACT_CAP" -gt 0 ]; then
  timeout "$EXACT_CAP" python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider > "$OUT/gpu_exactness.log" 2>&1
  echo "gpu tests rc $?"
  tail -12 "$OUT/gpu_exactness.log"
fi
