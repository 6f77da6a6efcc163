"""Second half of the experts for calls of a few tokens, each program holding [BH, I] slices of
down weights in registers (the form of `kernels/linear/rows.py`).

Grid ceil(H / BH): program t computes out[n, t·BH..t·BH+BH−1] for every token n of the call, as
sum_j act[n, j] · W_down_{e_j}[rows]^T over the token's k experts (e_j = ids[n, j]) plus the shared
expert (act row k), fp32, one rounding to out's dtype. act already carries each routing weight
(`gate_up_rows.py`). A token's experts are distinct, so each expert's slice is read once per token
from memory; tokens that share an expert read it again, from the cache. Under expert parallelism
(experts [first, first + E) held here) the experts held elsewhere add nothing.

Where the call's [N·k, BH, I] slices fit one load (`one_load`), the program reads the ids before
its PDL wait, and when the wait returns, every assignment's slice is one load with its addresses
known, reduced over I and over each token's assignments. The ids must then have been written at
least two launches back (`kernels/pdl.py`): the router's, before the gate_up launch that
`moe_experts` runs just before this one. Larger calls, and experts wider than 512, read one
assignment's id and slice at a time after the wait: there the one load spills registers or is
slower (`one_load`).

    act [N, k + 1, max(I, Is)]   down [E, H, I]   shared down [H, Is]   out [N, H]
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.checks import down_operands
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _row_product(p_d, stride_d, p_a, o_h, h_ok, width, DP: tl.constexpr):
    """[BH] fp32: rows o_h (where h_ok) of a weight at p_d times the act row at p_a, over the first
    `width` columns (0: an expert held elsewhere, whose act row no launch wrote: zeros)."""
    o_c = tl.arange(0, DP)
    c_ok = o_c < width  # [DP] (vector compares: the interpreter's masks need them)
    b_d = tl.load(p_d + o_h[:, None] * stride_d + o_c[None, :], mask=h_ok[:, None] & c_ok[None, :], other=0.0)
    b_a = tl.load(p_a + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [DP]
    return tl.sum(b_d.to(tl.float32) * b_a[None, :], 1)


@triton.jit
def _moe_down_rows_kernel(act_ptr, d_ptr, sd_ptr, ids_ptr, out_ptr, FIRST, stride_an, stride_ak, stride_de,
                          stride_dh, stride_sdh, stride_on, N: tl.constexpr, K: tl.constexpr, E: tl.constexpr,
                          H: tl.constexpr, I: tl.constexpr, IP: tl.constexpr, IS: tl.constexpr, ISP: tl.constexpr,
                          BH: tl.constexpr, AP: tl.constexpr, ONE_LOAD: tl.constexpr, USE_GDC: tl.constexpr):
    o_h = tl.program_id(0) * BH + tl.arange(0, BH)
    h_ok = o_h < H
    if ONE_LOAD:
        o_a = tl.arange(0, AP)  # assignment a = m·K + j: token m's j-th expert
        e = tl.load(ids_ptr + o_a, mask=o_a < N * K, other=0).to(tl.int64) - FIRST  # [AP], before the wait
        held = (o_a < N * K) & (e >= 0) & (e < E)
        e = tl.where(held, e, 0)
    if USE_GDC:
        wait_then_release()
    if ONE_LOAD:
        o_c = tl.arange(0, IP)
        c_ok = o_c < I
        m_of, j_of = o_a // K, o_a % K
        p_d = d_ptr + e[:, None, None] * stride_de + o_h[None, :, None] * stride_dh + o_c[None, None, :]
        b_d = tl.load(p_d, mask=held[:, None, None] & h_ok[None, :, None] & c_ok[None, None, :],
                      other=0.0)  # [AP, BH, IP]
        b_a = tl.load(act_ptr + m_of[:, None] * stride_an + j_of[:, None] * stride_ak + o_c[None, :],
                      mask=held[:, None] & c_ok[None, :], other=0.0).to(tl.float32)  # [AP, IP]
        part = tl.sum(b_d.to(tl.float32) * b_a[:, None, :], 2)  # [AP, BH]
    for m in tl.static_range(N):
        if ONE_LOAD:
            total = tl.sum(tl.where((m_of == m)[:, None], part, 0.0), 0)  # [BH]
        else:  # in the order j = 0..k
            total = tl.zeros([BH], dtype=tl.float32)
            for j in tl.static_range(K):
                e_j = tl.load(ids_ptr + m * K + j).to(tl.int64) - FIRST
                width = tl.where((e_j >= 0) & (e_j < E), I, 0)
                total += _row_product(d_ptr + e_j * stride_de, stride_dh, act_ptr + m * stride_an + j * stride_ak,
                                      o_h, h_ok, width, IP)
        if IS > 0:
            total += _row_product(sd_ptr, stride_sdh, act_ptr + m * stride_an + K * stride_ak, o_h, h_ok, IS, ISP)
        tl.store(out_ptr + m * stride_on + o_h, total.to(out_ptr.dtype.element_ty), mask=h_ok)


ONE_LOAD_ELEMENTS = 16384  # the largest [N·k, BH, I] (each a power of two) read in one load
ONE_LOAD_INTERMEDIATE = 512  # the widest expert (I, a power of two) read in one load


def one_load(n: int, k: int, block_h: int, intermediate: int) -> bool:
    """Whether a call's [N·k, BH, I] slices (each rounded up to a power of two) are read in one load:
    at most ONE_LOAD_ELEMENTS values of experts at most ONE_LOAD_INTERMEDIATE wide, as at the 35B
    shapes at one and two tokens (8·1·512, 16·2·512). The 122B shapes (I = 1024) read one slice at a
    time: at one token the one load is slower there, at two it spills registers."""
    width = triton.next_power_of_2(intermediate)
    return (width <= ONE_LOAD_INTERMEDIATE
            and triton.next_power_of_2(n * k) * block_h * width <= ONE_LOAD_ELEMENTS)


def launch_down_rows(act, down, shared, ids, out, block_h: int, warps: int, first_expert: int = 0) -> None:
    """act [N, k + 1, max(I, Is)] from a gate_up launch, down [E, H, I] (experts first_expert…
    first_expert + E − 1 of the ids), shared (or None), ids [N, k] (contiguous), out [N, H] (written,
    rows contiguous); block_h output columns per program. Where `one_load`, the ids are read before
    the PDL wait: written at least two launches back."""
    n, k, e, h, i, i_s, sd = down_operands("launch_down_rows", act, down, shared, ids)
    _moe_down_rows_kernel[(triton.cdiv(h, block_h),)](
        act, down, sd, ids, out, first_expert, act.stride(0), act.stride(1), down.stride(0), down.stride(1),
        sd.stride(0), out.stride(0), N=n, K=k, E=e, H=h, I=i, IP=triton.next_power_of_2(i), IS=i_s,
        ISP=triton.next_power_of_2(max(i_s, 1)), BH=block_h, AP=triton.next_power_of_2(n * k),
        ONE_LOAD=one_load(n, k, block_h, i), num_warps=warps, **pdl.options(act))
