"""Second half of the experts: y[n, j] = act[n, j] W_down_e^T for each distinct expert e and each
token n that routes to it (j: the token's position among its k experts; the shared expert's at
j = k), and out_n = sum_j y[n, j] summed in the order j = 0..k.

Grid (N·k + 1, ceil(H / BH)) (N·k without the shared expert): program (s, t) with s < N·k takes assignment
s's expert from the ids and runs it where s is that expert's first assignment
(`tiles.assignment_expert`; its [BH, I] tile of down weights read once, for all its tokens at
once), s = N·k is the shared expert. act already carries each routing weight, so a token's k + 1
rows only need summing. Each program that runs an expert stores its rows of y (fp32); then every
program arrives at its column tile's counter (zeroed by the gate_up launch), and the program that
arrives last (N·k + 1 arrivals with the shared expert, N·k without) sums the tile's rows of y and
stores out. The sum's order is fixed, so the result does not depend on the order programs run (no
atomics on the data). Under expert parallelism (experts [first, first + E) held here) the sum
skips the rows of experts held elsewhere; with no expert here and no shared expert the last
arrival stores the empty sum, zeros.

    act [N, k + 1, max(I, Is)]   down [E, H, I]   shared down [H, Is]   y [N, k + 1, H] fp32   out [N, H]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.checks import down_operands
from hybridspec.kernels.moe.tiles import assignment_expert
from hybridspec.kernels.moe.tuning import step_width
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt, last_to_arrive


@triton.jit
def _down_products(p_a, p_d, a_ok, h_ok, I: tl.constexpr, BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                   PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """[BM, BH] fp32 product act W_down^T over the intermediate dimension in steps of BK."""
    o_c = tl.arange(0, BK)
    acc = tl.zeros([BM, BH], dtype=tl.float32)
    for c in range(0, I, BK):
        c_ok = c + o_c < I
        b_a = tl.load(p_a + c, mask=a_ok[:, None] & c_ok[None, :], other=0.0)  # [BM, BK]
        b_d = tl.load(p_d + c, mask=h_ok[:, None] & c_ok[None, :], other=0.0)  # [BH, BK]
        acc = dot_bt(b_a, b_d, acc, PRECISION, WIDEN)
    return acc


@triton.jit
def _moe_down_kernel(act_ptr, d_ptr, sd_ptr, ids_ptr, arrivals_ptr, y_ptr, out_ptr, FIRST, stride_an, stride_ak,
                     stride_de, stride_dh, stride_sdh, stride_yn, stride_yk, stride_on,
                     N, K: tl.constexpr, E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr,
                     BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr, KP: tl.constexpr,
                     PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    # the ids were written two launches back (before the gate_up launch's wait): complete when this kernel
    # starts (`kernels/pdl.py`), so the expert lookup runs before this kernel's own wait
    e, b_kpos, active = assignment_expert(ids_ptr, tl.minimum(i_s, N * K - 1), N, FIRST, E, K, BM, NKP, KP)
    if USE_GDC:
        wait_then_release()
    o_m = tl.arange(0, BM)
    o_h = i_t * BH + tl.arange(0, BH)
    o_c = tl.arange(0, BK)
    h_ok = o_h < H
    m_ok = o_m < N
    if i_s < N * K:
        if active:
            hit = b_kpos >= 0
            p_a = act_ptr + o_m[:, None] * stride_an + b_kpos[:, None] * stride_ak + o_c[None, :]
            p_d = d_ptr + e * stride_de + o_h[:, None] * stride_dh + o_c[None, :]
            acc = _down_products(p_a, p_d, hit, h_ok, I, BM, BH, BK, PRECISION, WIDEN)
            p_y = y_ptr + o_m[:, None] * stride_yn + b_kpos[:, None] * stride_yk + o_h[None, :]
            tl.store(p_y, acc, mask=hit[:, None] & h_ok[None, :])
    else:
        p_a = act_ptr + o_m[:, None] * stride_an + K * stride_ak + o_c[None, :]
        p_d = sd_ptr + o_h[:, None] * stride_sdh + o_c[None, :]
        acc = _down_products(p_a, p_d, m_ok, h_ok, IS, BM, BH, BK, PRECISION, WIDEN)
        tl.store(y_ptr + o_m[:, None] * stride_yn + K * stride_yk + o_h[None, :], acc,
                 mask=m_ok[:, None] & h_ok[None, :])
    if last_to_arrive(arrivals_ptr + i_t, N * K + (IS > 0)):  # the last program of this column tile
        total = tl.zeros([BM, BH], dtype=tl.float32)
        for j in tl.static_range(K + (IS > 0)):
            y_ok = m_ok
            if j < K:  # a routed expert's row: only where this call holds the expert
                b_e = tl.load(ids_ptr + o_m * K + j, mask=m_ok, other=0) - FIRST  # [BM]
                y_ok = m_ok & (b_e >= 0) & (b_e < E)
            total += tl.load(y_ptr + o_m[:, None] * stride_yn + j * stride_yk + o_h[None, :],
                             mask=y_ok[:, None] & h_ok[None, :], other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + o_m[:, None] * stride_on + o_h[None, :], total.to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & h_ok[None, :])


def column_tiles(hidden: int, tuning) -> tuple[int, int]:
    """(BH, number of column tiles) of the down kernel for a hidden size."""
    bh = min(tuning.down_bh, max(16, triton.next_power_of_2(hidden)))
    return bh, triton.cdiv(hidden, bh)


def launch_down(act, down, shared, ids, arrivals, out, block_m: int, tuning, widen: bool,
                first_expert: int = 0) -> None:
    """act [N, k + 1, max(I, Is)] from the gate_up kernel, down [E, H, I] (experts first_expert…
    first_expert + E − 1 of the ids), shared (or None), ids [N, k] (contiguous), arrivals (int32,
    one per column tile, zeroed by the gate_up launch), out [N, H] (written); widen: under the
    interpreter. The ids are read before the PDL wait: they must be written at least two launches
    back (the gate_up launch reads them too)."""
    n, k, e, h, i, i_s, sd = down_operands("launch_down", act, down, shared, ids)
    bh, tiles = column_tiles(h, tuning)
    bk = step_width(tuning.down_bk, max(i, i_s), block_m + bh, act.element_size(), tuning.down_stages)
    y = torch.empty((n, k + 1, h), dtype=torch.float32, device=act.device)  # [N, k + 1, H]
    _moe_down_kernel[(n * k + (shared is not None), tiles)](
        act, down, sd, ids, arrivals, y, out, first_expert,
        act.stride(0), act.stride(1), down.stride(0), down.stride(1), sd.stride(0), y.stride(0), y.stride(1),
        out.stride(0), N=n, K=k, E=e, H=h, I=i, IS=i_s, BM=block_m, BH=bh, BK=bk,
        NKP=triton.next_power_of_2(block_m * k), KP=triton.next_power_of_2(k),
        PRECISION="ieee" if act.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.down_warps, num_stages=tuning.down_stages, **pdl.options(act))
