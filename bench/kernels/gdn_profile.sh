#!/usr/bin/env bash
# Nsight Compute on one verify launch per case (stall reasons, occupancy, speed of light, and the
# warp-state samples per SASS instruction), for the notes in bench/results/gdn_kernels_notes.md.
#   device tool:   bash bench/kernels/gdn_profile.sh $OUT             the shipped tuning at T = 2, 8, 16
#                  bash bench/kernels/gdn_profile.sh $OUT '16 {"method": "split", "block_v": 32, "num_warps": 4}'
# Each case is "T" (shipped tuning) or "T JSON" (VerifyTuning fields); per case it writes
# ncu_<n>.txt (the details page) and sass_<n>.csv (samples per instruction) under OUT.
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # run from the repository root
OUT=${1:?usage: bash bench/kernels/gdn_profile.sh OUT [CASE ...]}
shift
mkdir -p "$OUT"
[ $# -eq 0 ] && set -- 2 8 16
ncu --version | tail -1
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters)
n=0
for case in "$@"; do
  n=$((n + 1))
  T=${case%% *}
  args=(--T "$T")
  [ "$case" != "$T" ] && args+=(--tuning "${case#* }")
  timeout 120 ncu --clock-control none --kernel-name regex:gdn_verify --launch-skip 60 --launch-count 1 \
    "${SECTIONS[@]}" --import-source no -f -o "$OUT/ncu_$n" \
    python3 bench/kernels/gdn_profile_one.py "${args[@]}" > "$OUT/ncu_$n.log" 2>&1
  echo "case $n ($case): rc $?"
  ncu -i "$OUT/ncu_$n.ncu-rep" --print-details all > "$OUT/ncu_$n.txt" 2>&1
  ncu -i "$OUT/ncu_$n.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$n.csv" 2>&1
  rm -f "$OUT/ncu_$n.log" "$OUT/ncu_$n.ncu-rep"
  grep -E "Duration|Elapsed Cycles|Issued Warp Per|Warp Cycles Per Issued|Stall (Long|Wait|Short|Barrier|IMC)|Achieved Occ|Registers Per|Grid Size|Block Size" \
    "$OUT/ncu_$n.txt" | head -16
done
