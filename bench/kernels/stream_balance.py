"""How the split of a one-token product over the SMs sets its time: y = W x for the rows of the
MoE gate_up call at T = 1 (9 experts × 1,024 rows of 2,048 bf16 values, 37.7 MB), the same bytes
split G ways.

Program p takes rows [p·R/G, (p+1)·R/G) in tiles of BN rows, each tile over the hidden dimension
in steps of BK (x padded to 16 rows for `tl.dot`, as the MoE kernels do). G = 144 with 64-row
tiles is the shipped gate_up's grid at T = 1 (9 × 16 programs of 32 gate + 32 up rows): 12 SMs of
132 hold two programs. The other rows split the same bytes into one program per SM (equal shares,
the last tile of each masked), or into many small programs the hardware hands out as SMs free up.
Every launch reads its own copy of the weights (four copies, 151 MB, past the L2), timed as a
CUDA graph.

    python3 bench/kernels/stream_balance.py --out OUT

Prints a table and writes OUT/stream_balance.json (`{"device", "date", "versions",
"copy_bandwidth_GBps", "rows": [{"grid", "bn", "rows_per_program", "us", "floor_us", "ratio"}]}`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybridspec.kernels.tiles import dot_bt  # noqa: E402

ROWS, HIDDEN = 9 * 1024, 2048
BK, WARPS, STAGES = 256, 4, 3  # the shipped gate_up's step, warps and stages (`kernels/moe/tuning.py`)
SPLITS = [(144, 64), (72, 128), (288, 32), (576, 16), (132, 16), (132, 32), (264, 32), (528, 16)]  # (G, BN)


@triton.jit
def _rows_kernel(w_ptr, x_ptr, y_ptr, R, G, H: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """y[r] = sum_c W[r, c] x[c] for this program's share of the R rows, BN rows at a time."""
    pid = tl.program_id(0)
    lo = pid * R // G
    hi = (pid + 1) * R // G
    o_m = tl.arange(0, 16)
    o_c = tl.arange(0, BK)
    for r0 in range(lo, hi, BN):
        o_n = r0 + tl.arange(0, BN)
        n_ok = o_n < hi
        acc = tl.zeros([16, BN], dtype=tl.float32)
        for c in range(0, H, BK):
            c_ok = c + o_c < H
            b_x = tl.load(x_ptr + o_m[:, None] * 0 + c + o_c[None, :], mask=(o_m == 0)[:, None] & c_ok[None, :],
                          other=0.0)  # [16, BK], row 0 the token
            b_w = tl.load(w_ptr + o_n[:, None] * H + c + o_c[None, :], mask=n_ok[:, None] & c_ok[None, :],
                          other=0.0)  # [BN, BK]
            acc = dot_bt(b_x, b_w, acc, PRECISION, WIDEN)
        tl.store(y_ptr + o_n + o_m[:, None] * 0, acc, mask=(o_m == 0)[:, None] & n_ok[None, :])


def product(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, grid: int, bn: int, widen: bool = False) -> None:
    """y [R] fp32 = w [R, H] @ x [H], split over `grid` programs in tiles of `bn` rows."""
    rows, hidden = w.shape
    _rows_kernel[(grid,)](w, x, y, rows, grid, H=hidden, BN=bn, BK=min(BK, triton.next_power_of_2(hidden)),
                          PRECISION="ieee" if w.dtype == torch.float32 else "tf32", WIDEN=widen,
                          num_warps=WARPS, num_stages=STAGES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from cuda_timing import gpu_run, graph_us, max_relative_error, write_result

    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0
    if (run := gpu_run("stream_balance.py", argv, sms=sms)) is None:
        return 2
    bandwidth, result = run
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(ROWS, HIDDEN, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4)]
    x = torch.randn(HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    ys = [torch.empty(ROWS, device="cuda") for _ in weights]
    want = weights[0].float() @ x.float()
    floor = ROWS * HIDDEN * 2 / bandwidth * 1e6
    print("| grid | BN | rows per program | µs | floor µs | × floor |\n|---|---|---|---|---|---|")
    for grid, bn in SPLITS:
        ys[0].zero_()
        product(weights[0], x, ys[0], grid, bn)
        if (err := max_relative_error(ys[0], want)) > 1e-2:
            print(f"grid {grid}, BN {bn}: relative error {err:.2e}")
            return 1
        us = graph_us([lambda w=w, y=y: product(w, x, y, grid, bn) for w, y in zip(weights, ys)], samples=15,
                      replays=10)
        row = dict(grid=grid, bn=bn, rows_per_program=round(ROWS / grid, 1), us=round(us, 2),
                   floor_us=round(floor, 2), ratio=round(us / floor, 3))
        result["rows"].append(row)
        print(f"| {grid} | {bn} | {ROWS / grid:.1f} | {us:.2f} | {floor:.2f} | {us / floor:.2f} |", flush=True)
    write_result(args.out, "stream_balance.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
