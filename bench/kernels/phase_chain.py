"""Whether two dependent one-token products cost less as one persistent launch than as two: the
question behind running a decoder layer's chain (norm → projections → router → experts) inside one
kernel instead of about eleven.

Phase A: y1 = W_A x (8,192 rows × 2,048, 33.5 MB: the routed experts' gate_up of a layer at T = 1).
Phase B: y2 = W_B y1[:4096] (2,048 rows × 4,096, 16.8 MB: an out-projection's size). G = 128
programs (one per SM, all resident), each one tile of each phase: 64 rows of A, 16 rows of B.
- `two launches`: A, then B with programmatic dependent launch (B's programs wait for A to finish).
- `one launch`: each program runs its A tile, stores it, arrives at a grid barrier (an atomic
  counter) and waits for every program's arrival before it reads y1 for its B tile.
- `one launch, B prefetched`: the same, each program loading its first step of W_B (no phase
  writes it) before it waits at the barrier, so that B's stream starts while A drains.
- `rows A/B before|after the wait`: both phases as register products (`_rows_kernel`: each program
  loads its whole [BN, K] slice of W into registers, no tensor cores, no shared-memory pipeline),
  two PDL launches; `before`: each program loads its slice before its PDL wait, so a kernel whose
  programs fit beside its predecessor's streams its weights while the predecessor runs, and only
  the activation's read and the sum wait. `dot A, rows B ...`: phase A as in `two launches`.
Every launch reads its own copy of the weights (four copies rotated, past the L2), CUDA-graph timed.

    python3 bench/kernels/phase_chain.py --out OUT

Prints a table and writes OUT/phase_chain.json (`{"device", "date", "versions",
"copy_bandwidth_GBps", "rows": [{"form", "us", "floor_us", "ratio"}], "registers": [{"bn", "k", "warps",
"regs", "spills"}]}`: the register kernel's registers and spills at each slice shape).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybridspec.kernels.pdl import wait_then_release  # noqa: E402
from hybridspec.kernels.tiles import dot_bt  # noqa: E402

GRID, ROWS_A, HIDDEN, ROWS_B, DEPTH_B = 128, 8192, 2048, 2048, 4096
BK, WARPS, STAGES = 256, 4, 3


@triton.jit
def _tile(w_ptr, x_ptr, r0, stride_w, K, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
          WIDEN: tl.constexpr):
    """[16, BN] fp32: row 0 holds W[r0 : r0 + BN] · x over K columns (x read through the L2)."""
    o_m = tl.arange(0, 16)
    o_n = r0 + tl.arange(0, BN)
    o_c = tl.arange(0, BK)
    acc = tl.zeros([16, BN], dtype=tl.float32)
    for c in range(0, K, BK):
        b_x = tl.load(x_ptr + o_m[:, None] * 0 + c + o_c[None, :], mask=(o_m == 0)[:, None], other=0.0,
                      cache_modifier=".cg")  # [16, BK], row 0 the token
        b_w = tl.load(w_ptr + o_n[:, None] * stride_w + c + o_c[None, :])  # [BN, BK]
        acc = dot_bt(b_x, b_w, acc, PRECISION, WIDEN)
    return acc


@triton.jit
def _store_row(y_ptr, acc, r0, BN: tl.constexpr, DTYPE: tl.constexpr):
    o_m = tl.arange(0, 16)
    o_n = r0 + tl.arange(0, BN)
    tl.store(y_ptr + o_n[None, :] + o_m[:, None] * 0, acc.to(DTYPE), mask=(o_m == 0)[:, None])


@triton.jit
def _phase_kernel(w_ptr, x_ptr, y_ptr, stride_w, K, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                  WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    """One phase as its own launch: y[p·BN : (p + 1)·BN] = W[those rows] · x."""
    r0 = tl.program_id(0) * BN
    if USE_GDC:
        wait_then_release()
    acc = _tile(w_ptr, x_ptr, r0, stride_w, K, BN, BK, PRECISION, WIDEN)
    _store_row(y_ptr, acc, r0, BN, y_ptr.dtype.element_ty)


@triton.jit
def _chain_kernel(wa_ptr, x_ptr, y1_ptr, wb_ptr, y2_ptr, bar_ptr, stride_a, stride_b, KA, KB,
                  BN_A: tl.constexpr, BN_B: tl.constexpr, BK: tl.constexpr, PREFETCH: tl.constexpr,
                  PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """Both phases in one launch, a grid barrier between them. bar_ptr: two int32 counters, arrivals
    and departures, zero before the launch and zero again after it (the last program to leave the
    barrier resets both, so a graph replays the launch alone, with no reset of its own)."""
    pid = tl.program_id(0)
    acc = _tile(wa_ptr, x_ptr, pid * BN_A, stride_a, KA, BN_A, BK, PRECISION, WIDEN)
    _store_row(y1_ptr, acc, pid * BN_A, BN_A, y1_ptr.dtype.element_ty)
    o_n = pid * BN_B + tl.arange(0, BN_B)
    o_c = tl.arange(0, BK)
    if PREFETCH:  # no phase writes W_B: its first step may load before the barrier
        first = tl.load(wb_ptr + o_n[:, None] * stride_b + o_c[None, :])
    tl.debug_barrier()  # every thread's y1 stored before the arrival
    tl.atomic_add(bar_ptr, 1, sem="release")
    while tl.atomic_add(bar_ptr, 0, sem="acquire") < tl.num_programs(0):
        pass
    if tl.atomic_add(bar_ptr + 1, 1, sem="relaxed") == tl.num_programs(0) - 1:  # every program has left
        tl.atomic_xchg(bar_ptr, 0)
        tl.atomic_xchg(bar_ptr + 1, 0)
    o_m = tl.arange(0, 16)
    acc = tl.zeros([16, BN_B], dtype=tl.float32)
    start = 0
    if PREFETCH:
        b_x = tl.load(y1_ptr + o_m[:, None] * 0 + o_c[None, :], mask=(o_m == 0)[:, None], other=0.0,
                      cache_modifier=".cg")
        acc = dot_bt(b_x, first, acc, PRECISION, WIDEN)
        start = BK
    for c in range(start, KB, BK):
        b_x = tl.load(y1_ptr + o_m[:, None] * 0 + c + o_c[None, :], mask=(o_m == 0)[:, None], other=0.0,
                      cache_modifier=".cg")
        b_w = tl.load(wb_ptr + o_n[:, None] * stride_b + c + o_c[None, :])
        acc = dot_bt(b_x, b_w, acc, PRECISION, WIDEN)
    _store_row(y2_ptr, acc, pid * BN_B, BN_B, y2_ptr.dtype.element_ty)


@triton.jit
def _rows_kernel(w_ptr, x_ptr, y_ptr, stride_w, K: tl.constexpr, BN: tl.constexpr, EARLY: tl.constexpr,
                 USE_GDC: tl.constexpr):
    """y[p·BN : (p + 1)·BN] = W[those rows] · x, the [BN, K] slice held in registers; EARLY: the
    slice loads before the PDL wait (no kernel writes W)."""
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_c = tl.arange(0, K)
    p_w = w_ptr + o_n[:, None] * stride_w + o_c[None, :]
    if EARLY:
        b_w = tl.load(p_w)  # [BN, K]
        if USE_GDC:
            wait_then_release()
    else:
        if USE_GDC:
            wait_then_release()
        b_w = tl.load(p_w)
    b_x = tl.load(x_ptr + o_c, cache_modifier=".cg").to(tl.float32)  # [K]
    acc = tl.sum(b_w.to(tl.float32) * b_x[None, :], 1)  # [BN]
    tl.store(y_ptr + o_n, acc.to(y_ptr.dtype.element_ty))


def rows_launch(w, x, y, bn: int, early: bool, warps: int, pdl: bool = True):
    """y = w @ x[:w.shape[1]] by `_rows_kernel`, w.shape[0] / bn programs; returns the compiled kernel
    (its n_regs and n_spills say whether the slice stayed in registers)."""
    if w.shape[0] % bn or w.shape[1] & (w.shape[1] - 1):  # the kernel has no masks
        raise ValueError(f"rows_launch: {tuple(w.shape)} needs rows a multiple of {bn} and K a power of two")
    options = dict(USE_GDC=True, launch_pdl=True) if pdl else dict(USE_GDC=False)
    return _rows_kernel[(w.shape[0] // bn,)](w, x, y, w.stride(0), K=w.shape[1], BN=bn, EARLY=early,
                                             num_warps=warps, **options)


def two_launches(wa, x, y1, wb, y2, grid: int, pdl: bool, widen: bool = False) -> None:
    """y1 = wa @ x, then y2 = wb @ y1[:wb.shape[1]], one launch each (grid programs of one tile)."""
    prec = "ieee" if wa.dtype == torch.float32 else "tf32"
    options = dict(USE_GDC=True, launch_pdl=True) if pdl else dict(USE_GDC=False)
    _phase_kernel[(grid,)](wa, x, y1, wa.stride(0), wa.shape[1], BN=wa.shape[0] // grid,
                           BK=min(BK, wa.shape[1]), PRECISION=prec, WIDEN=widen, num_warps=WARPS,
                           num_stages=STAGES, **options)
    _phase_kernel[(grid,)](wb, y1, y2, wb.stride(0), wb.shape[1], BN=wb.shape[0] // grid,
                           BK=min(BK, wb.shape[1]), PRECISION=prec, WIDEN=widen, num_warps=WARPS,
                           num_stages=STAGES, **options)


def _dot_a(wa, x, y1):
    """Phase A alone as in `two_launches` (PDL)."""
    _phase_kernel[(GRID,)](wa, x, y1, wa.stride(0), wa.shape[1], BN=wa.shape[0] // GRID, BK=min(BK, wa.shape[1]),
                           PRECISION="tf32", WIDEN=False, num_warps=WARPS, num_stages=STAGES, USE_GDC=True,
                           launch_pdl=True)


def one_launch(wa, x, y1, wb, y2, barrier, grid: int, prefetch: bool, widen: bool = False) -> None:
    """The same two products in one launch of `grid` programs, all of which must be resident at
    once (the grid barrier waits for every one); barrier: two int32 counters, zero (the launch
    leaves them so)."""
    bk = min(BK, wa.shape[1], wb.shape[1])
    _chain_kernel[(grid,)](wa, x, y1, wb, y2, barrier, wa.stride(0), wb.stride(0), wa.shape[1], wb.shape[1],
                           BN_A=wa.shape[0] // grid, BN_B=wb.shape[0] // grid, BK=bk, PREFETCH=prefetch,
                           PRECISION="ieee" if wa.dtype == torch.float32 else "tf32", WIDEN=widen,
                           num_warps=WARPS, num_stages=STAGES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from cuda_timing import gpu_run, graph_us, max_relative_error, write_result

    if (run := gpu_run("phase_chain.py", argv)) is None:
        return 2
    bandwidth, result = run
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(4):
        wa = (torch.randn(ROWS_A, HIDDEN, device="cuda", generator=g) / HIDDEN ** 0.5).to(torch.bfloat16)
        wb = (torch.randn(ROWS_B, DEPTH_B, device="cuda", generator=g) / DEPTH_B ** 0.5).to(torch.bfloat16)
        sets.append((wa, wb, torch.empty(ROWS_A, device="cuda", dtype=torch.bfloat16),
                     torch.empty(ROWS_B, device="cuda", dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int32,
                                                                                            device="cuda")))
    x = torch.randn(HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    wa, wb = sets[0][:2]
    want = (wb.float() @ (wa.float() @ x.float()).to(torch.bfloat16).float()[:DEPTH_B])
    floor = (ROWS_A * HIDDEN + ROWS_B * DEPTH_B) * 2 / bandwidth * 1e6
    forms = {
        "dot A, rows B (8 × 4096, 8 warps) after the wait": lambda s: (
            _dot_a(s[0], x, s[2]), rows_launch(s[1], s[2], s[3], 8, False, 8)),
        "dot A, rows B (8 × 4096, 8 warps) before the wait": lambda s: (
            _dot_a(s[0], x, s[2]), rows_launch(s[1], s[2], s[3], 8, True, 8)),
        "dot A, rows B (4 × 4096, 4 warps) before the wait": lambda s: (
            _dot_a(s[0], x, s[2]), rows_launch(s[1], s[2], s[3], 4, True, 4)),
        "rows A (16 × 2048) / B (8 × 4096), 8 warps, after the wait": lambda s: (
            rows_launch(s[0], x, s[2], 16, False, 8), rows_launch(s[1], s[2], s[3], 8, False, 8)),
        "rows A (16 × 2048) / B (8 × 4096), 8 warps, before the wait": lambda s: (
            rows_launch(s[0], x, s[2], 16, True, 8), rows_launch(s[1], s[2], s[3], 8, True, 8)),
        "rows A (8 × 2048) / B (4 × 4096), 4 warps, before the wait": lambda s: (
            rows_launch(s[0], x, s[2], 8, True, 4), rows_launch(s[1], s[2], s[3], 4, True, 4)),
        "rows A (32 × 2048) / B (16 × 4096), 8 warps, before the wait": lambda s: (
            rows_launch(s[0], x, s[2], 32, True, 8), rows_launch(s[1], s[2], s[3], 16, True, 8)),
        "two launches, PDL": lambda s: two_launches(s[0], x, s[2], s[1], s[3], GRID, True),
        "two launches, no PDL": lambda s: two_launches(s[0], x, s[2], s[1], s[3], GRID, False),
        "one launch": lambda s: one_launch(s[0], x, s[2], s[1], s[3], s[4], GRID, False),
        "one launch, B prefetched": lambda s: one_launch(s[0], x, s[2], s[1], s[3], s[4], GRID, True),
    }
    print("| form | µs | floor µs | × floor |\n|---|---|---|---|")
    for name, form in forms.items():
        sets[0][3].zero_()
        form(sets[0])
        if (err := max_relative_error(sets[0][3], want)) > 2e-2:
            print(f"{name}: relative error {err:.2e}")
            return 1
        us = graph_us([lambda s=s: form(s) for s in sets], samples=15, replays=10)
        result["rows"].append(dict(form=name, us=round(us, 2), floor_us=round(floor, 2), ratio=round(us / floor, 3)))
        print(f"| {name} | {us:.2f} | {floor:.2f} | {us / floor:.2f} |", flush=True)
    for bn, k, warps in ((4, DEPTH_B, 4), (8, DEPTH_B, 8), (16, DEPTH_B, 8), (8, HIDDEN, 4), (16, HIDDEN, 8),
                         (32, HIDDEN, 8)):
        w = sets[0][1] if k == DEPTH_B else sets[0][0]
        kernel = rows_launch(w, sets[0][2], torch.empty(w.shape[0], device="cuda"), bn, True, warps)
        result.setdefault("registers", []).append(dict(bn=bn, k=k, warps=warps, regs=kernel.n_regs,
                                                       spills=kernel.n_spills))
        print(f"rows kernel {bn} × {k}, {warps} warps: {kernel.n_regs} registers, {kernel.n_spills} spilled")
    write_result(args.out, "phase_chain.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
