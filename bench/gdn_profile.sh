#!/usr/bin/env bash
# Nsight Compute on one verify launch per case (stall reasons, occupancy, speed of light), for the
# notes in bench/results/gdn_kernels_notes.md.   device tool:   bash bench/gdn_profile.sh $OUT
set -u
OUT=${1:?usage: bash bench/gdn_profile.sh OUT}
mkdir -p "$OUT"
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section MemoryWorkloadAnalysis)
for case in "16 blocked" "16 recurrent" "2 shipped" "8 shipped"; do
  set -- $case
  timeout 90 ncu --clock-control none --kernel-name regex:gdn_verify --launch-skip 60 --launch-count 1 \
    "${SECTIONS[@]}" python3 bench/gdn_profile_one.py --T "$1" --method "$2" > "$OUT/ncu_T$1_$2.txt" 2>&1
  echo "T=$1 $2 rc $?"
done
for f in "$OUT"/ncu_*.txt; do
  echo "== $f"; grep -E "^T=|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Memory Throughput|Stall|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Block Size|Grid Size|L2 Hit|DRAM Throughput" "$f" | head -30
done
