"""One verify of the 30 layers with a chosen tuning, for a profiler to look at (no timing here).

    ncu --clock-control none --kernel-name regex:gdn_verify --launch-skip 60 --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
        python3 bench/kernels/gdn_profile_one.py --T 16 --method split

Runs the verify of bench/kernels/gdn_tuning.py (gated, bf16 inputs, the setting of
bench/kernels/gdn_kernels.py) three times with the shipped tuning of that length, with --method
recurrent / split (the shipped parameters of that method at the nearest length that uses it), or
with --tuning.
"""

from __future__ import annotations

import argparse
import json
import sys

import gdn_tuning as gt  # this script's folder, bench/kernels, is on sys.path
import torch

from hybridspec.kernels.gdn import triton as gdn


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--T", type=int, default=16)
    parser.add_argument("--method", choices=("shipped", "recurrent", "split"), default="shipped")
    parser.add_argument("--tuning", type=json.loads, default=None,
                        help="VerifyTuning fields as JSON (instead of --method), e.g. '{\"method\": \"split\"}'")
    args = parser.parse_args(argv)
    shipped = gdn.SHIPPED.verify
    tuning = shipped[args.T]
    if args.tuning is not None:
        tuning = gdn.VerifyTuning(**args.tuning)
    elif args.method != "shipped" and tuning.method != args.method:
        lengths = sorted(shipped, key=lambda t: abs(t - args.T))
        tuning = next(shipped[t] for t in lengths if shipped[t].method == args.method)
    print(f"T={args.T} {tuning}", flush=True)
    b = gt.buffers(args.T, torch.bfloat16, seed=1)
    for _ in range(3):
        gt.verify_all(b, args.T, tuning)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
