#!/usr/bin/env bash
# The resident round's open measurements, each step with its own time cap (10 minutes per command):
#   device tool, timeout 600:   bash bench/device_round.sh $OUT [round|ncu|bare|rest|sampled|moe|tests|tp1] [CAP]
# CAP (seconds) replaces a one-part step's own cap where the call has less time (the device's
# budget), so that it ends itself and leaves what it measured.
# round: bench/gpu_round.py on the 35B preset, greedy `ar` and `full`, the variants of $VARIANTS (a comma
#   list of gpu_round.py's VARIANTS; default shipped alone); every row is timed before the profiler's
#   host counts and GPU work per round (gpu_round's second pass).
# ncu: Nsight Compute's view of every kernel of one one-token pass and of one w = 4 pass, a report
#   each (bench/kernels/ncu_pass.py: DRAM throughput, occupancy, stall reasons per kernel); CAP 590.
# sampled: the same for top-k 20 / top-p 0.95 at temperature 1 beside greedy, the kernels against
#   the torch form of the point-mass rule.
# moe: one MoE layer, the shipped launches beside the sweep's rows (moe_kernels.py --sweep).
# tests: the GPU tests of the kernels and of graph exactness.
# tp1: the tensor-parallel code path on one GPU (an NCCL process group of one rank), greedy `ar`
#   and `full`; its exactness rows' token hashes compare with the round step's (no process group).
# bare: what one dependent launch costs in a graph (bench/kernels/launch_chain.py), greedy `ar`
#   shipped, then again in a process whose cuBLAS has no workspace (no split-K with its separate
#   reduce launch), then the MoE GPU tests; CAP 590.
# rest: moe, tests and tp1 in one call, in that order (round and sampled are calls of their own). The logs print
# every row as it is measured, and gpu_round.py rewrites its JSON after each variant.
set -u
OUT=$(realpath -m "${1:?usage: bash bench/device_round.sh OUT [round|ncu|bare|rest|sampled|moe|tests|tp1] [CAP]}")
STEP=${2:-round}
CAP=${3:-590}
MOE_LENGTHS=1,2,4,16 LAUNCH_CAP=0 BARE_CAP=0 MOE_TESTS_CAP=0 ROUND_CAP=0 NCU_CAP=0 SAMPLED_CAP=0
MOE_CAP=0 TESTS_CAP=0 TP1_CAP=0
case "$STEP" in
  round) ROUND_CAP="$CAP" ;;
  ncu) NCU_CAP="$CAP" ;;
  rest) TESTS_CAP=300 MOE_CAP=120 TP1_CAP=150 ;;
  bare) LAUNCH_CAP=$((CAP * 12 / 100)) BARE_CAP=$((CAP * 55 / 100)) MOE_TESTS_CAP=$((CAP * 30 / 100)) ;;
  tp1) TP1_CAP="$CAP" ;;
  sampled) SAMPLED_CAP="$CAP" ;;
  moe) MOE_CAP="$CAP" ;;
  tests) TESTS_CAP="$CAP" ;;
  *) echo "device_round.sh: step must be round, ncu, bare, rest, sampled, moe, tests or tp1, not '$STEP'" >&2
    exit 2 ;;
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
if [ "$MOE_CAP" -gt 0 ]; then
  mkdir -p "$OUT/moe"
  (cd bench/kernels && timeout "$MOE_CAP" python3 moe_kernels.py --out "$OUT/moe" --models 35b --sweep --no-runtime \
    --no-sglang --quick --lengths "$MOE_LENGTHS" > "$OUT/moe.log" 2>&1)
  echo "moe_kernels rc $?"
  [ -f "$OUT/moe/moe_kernels.md" ] && sed -n '/random routing/,/^## η/p' "$OUT/moe/moe_kernels.md"
fi
if [ "$ROUND_CAP" -gt 0 ]; then
  round round "$ROUND_CAP" --variants "${VARIANTS:-shipped}"
fi
if [ "$LAUNCH_CAP" -gt 0 ]; then
  (cd bench/kernels && timeout "$LAUNCH_CAP" python3 launch_chain.py --out "$OUT/launch" > "$OUT/launch_chain.log" 2>&1)
  echo "launch_chain rc $?"
  tail -10 "$OUT/launch_chain.log"
fi
if [ "$BARE_CAP" -gt 0 ]; then  # torch reads both sizes (KiB) when it first makes a cuBLAS handle
  round shipped-ar $((BARE_CAP / 2)) --variants shipped,shipped --policies ar --no-verification --no-exactness
  CUBLAS_WORKSPACE_CONFIG=:0:1 CUBLASLT_WORKSPACE_SIZE=0 round bare-cublas $((BARE_CAP / 2)) --variants \
    shipped,shipped --policies ar --no-verification --no-exactness
fi
if [ "$MOE_TESTS_CAP" -gt 0 ]; then
  timeout "$MOE_TESTS_CAP" python3 -m pytest -m gpu tests/gpu/test_moe.py -p no:cacheprovider \
    > "$OUT/gpu_tests_moe.log" 2>&1
  echo "gpu tests (MoE) rc $?"
  tail -6 "$OUT/gpu_tests_moe.log"
fi
if [ "$NCU_CAP" -gt 0 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -z "$NCU" ]; then
    echo "ncu step: no ncu on PATH, under /opt/nvidia/nsight-compute or in /usr/local/cuda/bin"
  else
    METRICS=dram__bytes_read.sum,dram__bytes_write.sum
    for R in long_scoreboard short_scoreboard wait barrier membar mio_throttle lg_throttle math_pipe_throttle \
      no_instruction branch_resolving dispatch_stall drain imc_miss not_selected sleeping tex_throttle misc; do
      METRICS="$METRICS,smsp__average_warps_issue_stalled_${R}_per_issue_active.ratio"
    done
    for W in 1 4; do  # one report per width, each profile capped so that its export and summary still run
      timeout $((NCU_CAP / 2 - 30)) "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        --metrics "$METRICS" -o "$OUT/pass_w$W" -f python3 bench/kernels/ncu_pass.py run --width "$W" \
        > "$OUT/ncu_w$W.log" 2>&1
      echo "ncu w=$W rc $?"
      tail -3 "$OUT/ncu_w$W.log"
      [ -f "$OUT/pass_w$W.ncu-rep" ] || continue
      "$NCU" -i "$OUT/pass_w$W.ncu-rep" --page details --csv > "$OUT/pass_w$W.csv" 2>> "$OUT/ncu_w$W.log"
      "$NCU" -i "$OUT/pass_w$W.ncu-rep" --page raw --csv > "$OUT/pass_w${W}_raw.csv" 2>> "$OUT/ncu_w$W.log"
      python3 bench/kernels/ncu_pass.py summary "$OUT/pass_w$W.csv" --raw "$OUT/pass_w${W}_raw.csv" \
        --out "$OUT/ncu_w$W.json" > "$OUT/ncu_w$W.md"
      head -25 "$OUT/ncu_w$W.md" | cut -c1-300
    done
  fi
fi
if [ "$TESTS_CAP" -gt 0 ]; then
  timeout "$TESTS_CAP" python3 -m pytest -m gpu tests/gpu/test_linear.py tests/gpu/test_moe.py tests/gpu/test_norm.py \
    tests/gpu/test_router.py tests/gpu/test_pdl.py tests/gpu/test_graph_exactness.py tests/gpu/test_exactness.py \
    tests/gpu/test_sampling.py \
    -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc $?"
  tail -12 "$OUT/gpu_tests.log"
fi
if [ "$TP1_CAP" -gt 0 ]; then
  round tp1 "$TP1_CAP" --tp 1 --no-verification
fi
if [ "$SAMPLED_CAP" -gt 0 ]; then
  round sampled "$SAMPLED_CAP" --variants shipped,torch-sampling --temperatures 0,1 --top-k 20 \
    --top-p 0.95 --no-verification --no-exactness
fi
