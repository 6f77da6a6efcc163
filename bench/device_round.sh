#!/usr/bin/env bash
# The resident round's open measurements in one device call (10 minutes per command):
#   device tool, timeout 600:   bash bench/device_round.sh $OUT [all|round|moe|tests]
# round: bench/gpu_round.py on the 35B preset, shipped listed first and last around the shared
# expert beside the verification passes and the MoE with no slots launch (the spread between the
# two shipped runs bounds the order effect), greedy and top-k sampled, then the host counts, the GPU
# work per decode round and a kernel-time profile of each variant (gpu_round's second pass).
# moe: one MoE layer, the shipped launches beside the sweep's variants (moe_kernels.py --sweep).
# tests: the GPU tests of the MoE, sampling and graph-exactness paths. Each step has its own time
# cap so a slow one cannot take the other's results with it; the logs print every row as it is measured.
set -u
OUT=${1:?usage: bash bench/device_round.sh OUT [all|round|moe|tests]}
STEP=${2:-all}
case "$STEP" in
  all) ROUND_CAP=360 MOE_CAP=90 TESTS_CAP=130 ;;  # round may not finish its second pass: run it alone
  round) ROUND_CAP=590 MOE_CAP=0 TESTS_CAP=0 ;;
  moe) ROUND_CAP=0 MOE_CAP=590 TESTS_CAP=0 ;;
  tests) ROUND_CAP=0 MOE_CAP=0 TESTS_CAP=590 ;;
  *) echo "device_round.sh: step must be all, round, moe or tests, not '$STEP'" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0  # compiled kernels (tests/conftest.py would ask for the interpreter)
mkdir -p "$OUT/round"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ "$ROUND_CAP" -gt 0 ]; then
  timeout "$ROUND_CAP" python3 bench/gpu_round.py --out "$OUT/round" --models qwen3.6-35b-a3b \
    --variants shipped,shared-beside-spec,moe-inline-slots,shipped --policies ar,full --temperatures 0,1 \
    --top-k 20 --top-p 0.95 --eager-tokens 1 --profile > "$OUT/round.log" 2>&1
  echo "gpu_round rc $?"
  grep -E "^  (decode .*graph|verify|round)" "$OUT/round.log" | cut -c1-200
fi
if [ "$MOE_CAP" -gt 0 ]; then
  mkdir -p "$OUT/moe"
  (cd bench/kernels && timeout "$MOE_CAP" python3 moe_kernels.py --out "$OUT/moe" --models 35b --sweep --no-runtime \
    --no-sglang --quick --lengths 1,2,4,16 > "$OUT/moe.log" 2>&1)
  echo "moe_kernels rc $?"
  [ -f "$OUT/moe/moe_kernels.md" ] && sed -n '/random routing/,/^## η/p' "$OUT/moe/moe_kernels.md"
fi
if [ "$TESTS_CAP" -gt 0 ]; then
  timeout "$TESTS_CAP" python3 -m pytest -m gpu tests/gpu/test_moe.py tests/gpu/test_sampling.py \
    tests/gpu/test_graph_exactness.py -q -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $?"
  tail -12 "$OUT/gpu_tests.log"
fi
