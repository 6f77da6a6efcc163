"""Launch shapes of the fused round (commit folded into the next verify) on one GPU.

    python bench/kernels/gdn_fold_sweep.py [--widths 2,4,8,16] [--out DIR] [--samples N]

Same setting, inputs, rotation and timing as bench/kernels/gdn_kernels.py's `hybridspec` rows (30 GDN layers
of Qwen3.6-35B-A3B, bf16 inputs, fp32 states, m = w): per w and verify tuning, the median us per
round of 30 fused verify launches, after each variant's errors against the float64 oracle (two
rounds, `gdn_kernels.check_one`; bf16 and fp32 inputs, m = ceil(w / 2)). Prints a table, fastest
first per w; writes gdn_fold_sweep.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

from gdn_impls import HybridSpec  # this script's folder, bench/kernels, is on sys.path
import gdn_kernels as gk
from gdn_problems import QWEN36, ROTATIONS, TOLERANCE, make_problem, oracle
import torch

from hybridspec.kernels.gdn import triton as gdn
from hybridspec.kernels.gdn.tuning import RECURRENT, SPLIT


def variants(w: int) -> list[tuple[gdn.VerifyTuning, bool]]:
    """(tuning, raw keys) pairs: the shipped kernel of each length with raw bf16 keys in the round
    buffers and with normalised fp32 keys, and the recurrent kernel with 4 and 8 rows up to 4
    tokens. With raw keys, the split kernel also with k's copy to the round buffer after the
    outputs (`late_keys`)."""
    if w <= 4:
        return [(dataclasses.replace(RECURRENT, block_v=bv), raw) for bv in (4, 8) for raw in (False, True)]
    return [(SPLIT, False), (SPLIT, True), (dataclasses.replace(SPLIT, late_keys=True), True)]


@torch.no_grad()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="2,4,8,16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=1, help="time each variant this many times")
    args = parser.parse_args()
    gk.require_gpu()
    rows = []
    for w in map(int, args.widths.split(",")):
        problems = [make_problem(QWEN36, w, torch.bfloat16, seed=1000 + r, device="cuda")
                    for r in range(ROTATIONS)]
        m_check = (w + 1) // 2
        checks = {}
        for dtype in (torch.bfloat16, torch.float32):
            p = make_problem(QWEN36, w, dtype, seed=w, device="cuda")
            checks[dtype] = (p, *oracle(p, m_check))
        shipped = gdn.SHIPPED.verify[w]
        for tuning, raw in variants(w):
            make = functools.partial(HybridSpec, tuning=gdn.SHIPPED.replace(verify={w: tuning}), raw_keys=raw)
            errors = {str(dtype).removeprefix("torch."): gk.check_one(make, p, w, m_check, o_ref, s_ref)
                      for dtype, (p, o_ref, s_ref) in checks.items()}
            passed = all(max(e.values()) < TOLERANCE[getattr(torch, d)] for d, e in errors.items())
            times = [gk.time_impl(make, problems, w, w, args.samples, 10) for _ in range(args.repeat)]
            us = min(times)
            rows.append(dict(w=w, us=round(us, 2), times=[round(t, 2) for t in times], raw_keys=raw,
                             errors=errors, passed=passed,
                             **dataclasses.asdict(tuning)))
            error_text = " ".join(f"{d} {e['o_err']:.1e}/{e['state_err']:.1e}" for d, e in errors.items())
            keys = "raw" if raw else "normalised"
            print(f"w={w:2d} {tuning.method:9s} bv={tuning.block_v:2d} warps={tuning.num_warps} "
                  f"late_keys={int(tuning.late_keys)} keys={keys:10s} {' '.join(f'{t:6.1f}' for t in times)} us  "
                  f"errors o/S {error_text} {'ok' if passed else 'FAILED'}", flush=True)
        us = gk.time_impl("hybridspec_commit", problems, w, w, args.samples, 10)  # the round with its own commit
        rows.append(dict(w=w, us=round(us, 2), impl="hybridspec_commit", **dataclasses.asdict(shipped)))
        print(f"w={w:2d} verify + separate commit (shipped tuning)  {us:7.1f} us", flush=True)
    print("\nfastest per w:")
    for w in sorted({r["w"] for r in rows}):
        best = sorted((r for r in rows if r["w"] == w), key=lambda r: r["us"])[:3]
        print(f"  w={w:2d}: " + "; ".join(f"{r['method']} bv={r['block_v']} late_keys={r['late_keys']} "
                                         f"raw={r.get('raw_keys')} {r['us']:.1f}" for r in best))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(device=torch.cuda.get_device_name(), rows=rows)
        (args.out / "gdn_fold_sweep.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
