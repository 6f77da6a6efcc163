"""Launch shapes of the fused round (commit folded into the next verify) on one GPU.

    python bench/gdn_fold_sweep.py [--widths 2,4,8,16] [--out DIR]

Same setting, inputs, rotation and timing as bench/gdn_kernels.py's `hybridspec` rows (30 GDN layers
of Qwen3.6-35B-A3B, bf16 inputs, fp32 states, m = w): per w and verify tuning, the median us per
round of 30 fused verify launches. Prints a table, fastest first per w; writes gdn_fold_sweep.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gdn_kernels as gk  # noqa: E402

from hybridspec.kernels.gdn import triton as gdn  # noqa: E402

SPLIT = gdn.VerifyTuning(block_v=32, num_warps=4, num_stages=1, method="split", split=2, fence=True, pdl=True)
RECURRENT = gdn.VerifyTuning(block_v=8, num_warps=1, num_stages=1, method="recurrent", prefetch=True, pdl=True)


def variants(w: int) -> list[gdn.VerifyTuning]:
    """The shapes the seventh session measured (bench/results/gdn_fold_sweep.md): program rows and
    warps of the split kernel, its bf16 pieces of S_0, the recurrent kernel's rows up to 4 tokens."""
    split = [dataclasses.replace(SPLIT, block_v=bv, num_warps=nw, split=pieces)
             for bv, nw, pieces in ((32, 4, 2), (32, 4, 3), (16, 2, 2), (32, 8, 2), (64, 4, 2))]
    recurrent = [dataclasses.replace(RECURRENT, block_v=bv) for bv in (4, 8, 16)]
    return recurrent + split[:1] if w <= 4 else split


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="2,4,8,16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    gk.require_gpu()
    rows = []
    for w in map(int, args.widths.split(",")):
        problems = [gk.make_problem(gk.QWEN36, w, torch.bfloat16, seed=1000 + r, device="cuda")
                    for r in range(gk.ROTATIONS)]
        shipped = gdn.VERIFY_TUNING[w]
        for tuning in variants(w):
            gdn.VERIFY_TUNING[w] = tuning
            us = gk.time_impl("hybridspec", problems, w, w, args.samples, 10)
            rows.append(dict(w=w, us=round(us, 2), **dataclasses.asdict(tuning)))
            print(f"w={w:2d} {tuning.method:9s} bv={tuning.block_v:2d} warps={tuning.num_warps} "
                  f"split={tuning.split}  {us:7.1f} us", flush=True)
        gdn.VERIFY_TUNING[w] = shipped
        us = gk.time_impl("hybridspec_commit", problems, w, w, args.samples, 10)  # the round with its own commit
        rows.append(dict(w=w, us=round(us, 2), impl="hybridspec_commit", **dataclasses.asdict(shipped)))
        print(f"w={w:2d} verify + separate commit (shipped tuning)  {us:7.1f} us", flush=True)
    print("\nfastest per w:")
    for w in sorted({r["w"] for r in rows}):
        best = sorted((r for r in rows if r["w"] == w), key=lambda r: r["us"])[:3]
        print(f"  w={w:2d}: " + "; ".join(f"{r['method']} bv={r['block_v']} warps={r['num_warps']} {r['us']:.1f}"
                                         for r in best))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gdn_fold_sweep.json").write_text(json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
