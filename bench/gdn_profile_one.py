"""One verify of the 30 layers with a chosen tuning, for a profiler to look at (no timing here).

    ncu --clock-control none --kernel-name regex:gdn_verify --launch-skip 60 --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
        python3 bench/gdn_profile_one.py --T 16 --method blocked

Runs the verify of bench/gdn_tuning.py (gated, bf16 inputs, the setting of bench/gdn_kernels.py)
three times with the shipped tuning of that length, with --method blocked / recurrent / split (the
shipped parameters of that method at the nearest length that uses it), or with --tuning.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gdn_tuning as gt  # noqa: E402

from hybridspec.kernels.gdn import triton as gdn  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--T", type=int, default=16)
    parser.add_argument("--method", choices=("shipped", "blocked", "recurrent", "split"), default="shipped")
    parser.add_argument("--tuning", type=json.loads, default=None,
                        help="VerifyTuning fields as JSON (instead of --method), e.g. '{\"method\": \"split\"}'")
    args = parser.parse_args(argv)
    tuning = gdn.VERIFY_TUNING[args.T]
    if args.tuning is not None:
        tuning = gdn.VerifyTuning(**args.tuning)
    elif args.method != "shipped" and tuning.method != args.method:
        lengths = sorted(gdn.VERIFY_TUNING, key=lambda t: abs(t - args.T))
        tuning = next(gdn.VERIFY_TUNING[t] for t in lengths if gdn.VERIFY_TUNING[t].method == args.method)
    print(f"T={args.T} {tuning}", flush=True)
    b = gt.buffers(args.T, torch.bfloat16, seed=1)
    for _ in range(3):
        gt.verify_all(b, args.T, tuning)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
