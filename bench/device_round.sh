#!/usr/bin/env bash
# The resident round's open measurements, each step with its own time cap (10 minutes per command):
#   device tool, timeout 600:   bash bench/device_round.sh $OUT [moe-first|round|round2|rest|sampled|moe|tests|linear|tp1] [CAP]
# CAP (seconds) replaces a one-part step's own cap where the call has less time (the device's
# budget), so that it ends itself and leaves what it measured.
# round: bench/gpu_round.py on the 35B preset, greedy `ar` and `full`, shipped first, then the
#   variants written and not yet measured; every row is timed before the profiler's host counts and
#   GPU work per round (gpu_round's second pass).
# round2: shipped, the shared expert beside the router in verification passes, the router's early
#   weight read, the input projections on kernels/linear, and the kernel variants all at once.
# sampled: the same for top-k 20 / top-p 0.95 at temperature 1 beside greedy, the kernels against
#   the torch form of the point-mass rule.
# moe: one MoE layer, the shipped launches beside the sweep's variants (moe_kernels.py --sweep).
# tests: the GPU tests of the kernels those variants change and of graph exactness.
# linear: the out-projection + residual add + norm in two launches beside the library product and
#   the norm (bench/kernels/out_add_norm.py); the round step runs it in whole passes (`out-add-norm`).
# tp1: the tensor-parallel code path on one GPU (an NCCL process group of one rank), greedy `ar`
#   and `full`; its exactness rows' token hashes compare with the round step's (no process group).
# moe-first: the MoE tuning switches' GPU tests (bit for bit against the shipped launches), the MoE
#   sweep at T = 1, 2, 4, then the round with the three MoE changes alone and together (each checked
#   graph against host path), in one call (CAP of at least 360: the round gets CAP - 240).
# rest: tests, linear, moe and tp1 in one call (round, round2 and sampled are calls of their own). The logs print every
# row as it is measured, and gpu_round.py rewrites its JSON after each variant.
set -u
OUT=$(realpath -m "${1:?usage: bash bench/device_round.sh OUT [moe-first|round|round2|rest|sampled|moe|tests|linear|tp1] [CAP]}")
STEP=${2:-round}
CAP=${3:-590}
LINEAR_MODELS=35b,122b MOE_LENGTHS=1,2,4,16 MOE_FIRST_CAP=0 TESTS= TESTS_K= MOE_ROWS= ROUND_CAP=0 ROUND2_CAP=0 SAMPLED_CAP=0 MOE_CAP=0 TESTS_CAP=0 TP1_CAP=0 LINEAR_CAP=0
case "$STEP" in
  round) ROUND_CAP="$CAP" ;;
  round2) ROUND2_CAP="$CAP" ;;
  rest) TESTS_CAP=150 LINEAR_CAP=60 LINEAR_MODELS=35b MOE_CAP=150 TP1_CAP=150 ;;
  moe-first) [ "$CAP" -ge 360 ] || { echo "device_round.sh: moe-first needs a CAP of at least 360 s" >&2; exit 2; }
    TESTS_CAP=120 TESTS=tests/gpu/test_moe.py TESTS_K=tuning_switches MOE_CAP=110 MOE_LENGTHS=1,2,4
    MOE_FIRST_CAP=$((CAP - 240))
    MOE_ROWS="down columns T<=2,down columns k128 T<=2,gate_up k128 s5,down s4,shared early"
    MOE_ROWS="$MOE_ROWS,shared early + gate_up k128 s5 + down columns T<=2"
    MOE_ROWS="$MOE_ROWS,all: inline slots + shared early + gate_up k128 s5 + down columns T<=2" ;;
  linear) LINEAR_CAP="$CAP" ;;
  tp1) TP1_CAP="$CAP" ;;
  sampled) SAMPLED_CAP="$CAP" ;;
  moe) MOE_CAP="$CAP" ;;
  tests) TESTS_CAP="$CAP" ;;
  *) echo "device_round.sh: step must be round, round2, rest, moe-first, sampled, moe, tests, linear or tp1, not '$STEP'" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0  # compiled kernels (tests/conftest.py would ask for the interpreter)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
round() {  # name cap extra-arguments...
  local name=$1 cap=$2
  shift 2
  mkdir -p "$OUT/$name"
  timeout "$cap" python3 bench/gpu_round.py --out "$OUT/$name" --models qwen3.6-35b-a3b --policies ar,full \
    --eager-tokens 1 "$@" > "$OUT/$name.log" 2>&1
  echo "gpu_round $name rc $?"
  grep -E "^  (decode .*graph|verify|round|counts .*graph|exactness)" "$OUT/$name.log" | cut -c1-220
}
gpu_tests() {  # cap
  timeout "$1" python3 -m pytest -m gpu ${TESTS:-tests/gpu/test_moe.py tests/gpu/test_gdn_early_fold.py \
    tests/gpu/test_linear.py tests/gpu/test_norm.py tests/gpu/test_router.py tests/gpu/test_pdl.py tests/gpu/test_graph_exactness.py \
    tests/gpu/test_sampling.py} ${TESTS_K:+-k "$TESTS_K"} -q -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $?"
  tail -12 "$OUT/gpu_tests.log"
}
if [ "$ROUND_CAP" -gt 0 ]; then
  round round "$ROUND_CAP" --variants shipped,moe-down-columns,out-add-norm-gated,moe-gate-up-deep,gdn-early-fold,moe-inline-slots
fi
if [ "$ROUND2_CAP" -gt 0 ]; then
  round round2 "$ROUND2_CAP" --variants shipped,shared-beside-spec,router-early,in-proj,out-add-norm-gated+moe-inline-down-early+gdn-early-fold+in-proj+router-early
fi
if [ "$TESTS_CAP" -gt 0 ]; then
  gpu_tests "$TESTS_CAP"
fi
if [ "$LINEAR_CAP" -gt 0 ]; then
  mkdir -p "$OUT/linear"
  (cd bench/kernels && timeout "$LINEAR_CAP" python3 out_add_norm.py --out "$OUT/linear" --models "$LINEAR_MODELS" > "$OUT/linear.log" 2>&1)
  echo "out_add_norm rc $?"
  cut -c1-260 "$OUT/linear.log"
fi
if [ "$MOE_CAP" -gt 0 ]; then
  mkdir -p "$OUT/moe"
  (cd bench/kernels && timeout "$MOE_CAP" python3 moe_kernels.py --out "$OUT/moe" --models 35b --sweep --no-runtime \
    --no-sglang --quick --lengths "$MOE_LENGTHS" ${MOE_ROWS:+--sweep-rows "$MOE_ROWS"} > "$OUT/moe.log" 2>&1)
  echo "moe_kernels rc $?"
  [ -f "$OUT/moe/moe_kernels.md" ] && sed -n '/random routing/,/^## η/p' "$OUT/moe/moe_kernels.md"
fi
if [ "$MOE_FIRST_CAP" -gt 0 ]; then
  round moe-first "$MOE_FIRST_CAP" --variants shipped,moe-all,moe-columns-deep-shared,moe-down-columns,moe-shared-early,moe-gate-up-deep
fi
if [ "$TP1_CAP" -gt 0 ]; then
  round tp1 "$TP1_CAP" --tp 1 --no-verification
fi
if [ "$SAMPLED_CAP" -gt 0 ]; then
  round sampled "$SAMPLED_CAP" --variants shipped,torch-sampling --temperatures 0,1 --top-k 20 \
    --top-p 0.95 --no-verification --no-exactness
fi
