"""First half of the experts: act = w · silu(x W_gate^T) * (x W_up^T) for each distinct expert.

Grid (N·k, plus 1 with a shared expert; ceil(max(I, Is) / BN)), fixed by N and k. Program (s, t) with s < N·k takes
assignment s's expert from the ids and runs it only where s is that expert's first assignment
(`tiles.assignment_expert`), on the tokens that route to it (at most one row per token, N <= BM, so
every expert's tokens fit one [BM, BK] tile and its weights are read once), columns t·BN..t·BN+BN−1
of its intermediate width; the other rows of s < N·k return at once. Program s = N·k runs the shared
expert on every token and scales it by sigmoid(x · gate_weight). Program (0, 0) also zeroes the down
kernel's arrival counters, before the down launch passes its wait.
Each result row is scaled by its routing weight and stored at act[n, j] (j: the token's position
among its k experts; the shared expert's at j = k), in the weights' dtype, for the down kernel to
sum.

    x [N, H]   gate_up [E, 2I, H]   shared gate / up [Is, H], gate_weight [1, H]
    act [N, k + 1, max(I, Is)]   arrivals [tiles] int32 (zeroed)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.checks import gate_up_operands
from hybridspec.kernels.moe.tiles import assignment_expert
from hybridspec.kernels.moe.tuning import step_width
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt


@triton.jit
def gated_products(p_x, p_g, p_u, x_ok, n_ok, H: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """[BM, BN] fp32 products x W_gate^T and x W_up^T over the hidden dimension in steps of BK."""
    o_c = tl.arange(0, BK)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for c in range(0, H, BK):
        c_ok = c + o_c < H
        b_x = tl.load(p_x + c, mask=x_ok[:, None] & c_ok[None, :], other=0.0)  # [BM, BK]
        b_g = tl.load(p_g + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
        b_u = tl.load(p_u + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
        acc_g = dot_bt(b_x, b_g, acc_g, PRECISION, WIDEN)
        acc_u = dot_bt(b_x, b_u, acc_u, PRECISION, WIDEN)
    return acc_g, acc_u


@triton.jit
def shared_gate(p_x, sgw_ptr, x_ok, H: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """[BM] sigmoid(x · gate_weight): the shared expert's output scale for each row of x."""
    o_c = tl.arange(0, BK)
    acc = tl.zeros([BM], dtype=tl.float32)
    for c in range(0, H, BK):
        c_ok = c + o_c < H
        b_x = tl.load(p_x + c, mask=x_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(b_x * tl.load(sgw_ptr + c + o_c, mask=c_ok, other=0.0).to(tl.float32)[None, :], 1)
    return tl.sigmoid(acc)


@triton.jit
def _store_act(act_ptr, acc_g, acc_u, scale, o_m, b_kpos, m_ok, o_n, n_ok, stride_an, stride_ak):
    b_act = acc_g * tl.sigmoid(acc_g) * acc_u * scale[:, None]  # [BM, BN] silu(gate) * up, weighted
    p_a = act_ptr + o_m[:, None] * stride_an + b_kpos[:, None] * stride_ak + o_n[None, :]
    tl.store(p_a, b_act.to(act_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _shared_products(p_x, sg_ptr, su_ptr, sgw_ptr, o_n, o_c, m_ok, stride_sgn, stride_sun, H: tl.constexpr,
                     IS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """The shared expert's [BM, BN] gate and up products for every token and its [BM] output scale."""
    p_g = sg_ptr + o_n[:, None] * stride_sgn + o_c[None, :]
    p_u = su_ptr + o_n[:, None] * stride_sun + o_c[None, :]
    acc_g, acc_u = gated_products(p_x, p_g, p_u, m_ok, o_n < IS, H, BM, BN, BK, PRECISION, WIDEN)
    return acc_g, acc_u, shared_gate(p_x, sgw_ptr, m_ok, H, BM, BK)


@triton.jit
def _moe_gate_up_kernel(x_ptr, rw_ptr, gu_ptr, sg_ptr, su_ptr, sgw_ptr, ids_ptr, arrivals_ptr, act_ptr, FIRST,
                        stride_xn, stride_ge, stride_gn, stride_sgn, stride_sun, stride_an, stride_ak, N, TILES,
                        E: tl.constexpr, K: tl.constexpr, H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr, KP: tl.constexpr,
                        TP: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_n = i_t * BN + tl.arange(0, BN)
    o_c = tl.arange(0, BK)
    m_ok = o_m < N
    p_x = x_ptr + o_m[:, None] * stride_xn + o_c[None, :]
    if USE_GDC:
        wait_then_release()  # nothing is read or stored before this point
    if (i_s == 0) & (i_t == 0):  # the down kernel's arrival counters, zeroed before it starts
        o_r = tl.arange(0, TP)
        tl.store(arrivals_ptr + o_r, tl.zeros([TP], tl.int32), mask=o_r < TILES)
    if i_s < N * K:
        e, b_kpos, active = assignment_expert(ids_ptr, i_s, N, FIRST, E, K, BM, NKP, KP)
        if active:
            hit = b_kpos >= 0
            n_ok = o_n < I
            p_g = gu_ptr + e * stride_ge + o_n[:, None] * stride_gn + o_c[None, :]
            acc_g, acc_u = gated_products(p_x, p_g, p_g + I * stride_gn, hit, n_ok, H, BM, BN, BK,
                                          PRECISION, WIDEN)
            b_w = tl.load(rw_ptr + o_m * K + b_kpos, mask=hit, other=0.0).to(tl.float32)  # [BM]
            _store_act(act_ptr, acc_g, acc_u, b_w, o_m, b_kpos, hit, o_n, n_ok, stride_an, stride_ak)
    else:
        s_g, s_u, s_scale = _shared_products(p_x, sg_ptr, su_ptr, sgw_ptr, o_n, o_c, m_ok, stride_sgn,
                                             stride_sun, H, IS, BM, BN, BK, PRECISION, WIDEN)
        b_kpos = tl.full([BM], K, dtype=tl.int32)
        _store_act(act_ptr, s_g, s_u, s_scale, o_m, b_kpos, m_ok, o_n, o_n < IS, stride_an, stride_ak)


def launch_gate_up(x, ids, weights, gate_up, shared, arrivals, act, block_m: int, tuning, widen: bool,
                   first_expert: int = 0) -> None:
    """x [N, H], ids / weights [N, k] (both contiguous; experts first_expert… first_expert + E − 1 of
    them held in gate_up [E, 2I, H]), shared (SharedExpert or None), arrivals (int32, one per column
    tile of the down kernel; this launch zeroes them), act [N, k + 1, max(I, Is)] (written); widen:
    under the interpreter."""
    n, k, i, i_s, (sg, su, sgw) = gate_up_operands("launch_gate_up", ids, weights, gate_up, shared)
    bn = min(tuning.gate_up_bn, max(16, triton.next_power_of_2(max(i, i_s))))
    bk = step_width(tuning.gate_up_bk, x.shape[1], block_m + 2 * bn, x.element_size(), tuning.gate_up_stages)
    grid = (n * k + (shared is not None), triton.cdiv(max(i, i_s), bn))
    _moe_gate_up_kernel[grid](
        x, weights, gate_up, sg, su, sgw, ids, arrivals, act, first_expert,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), sg.stride(0), su.stride(0), act.stride(0), act.stride(1),
        N=n, TILES=arrivals.numel(), E=gate_up.shape[0], K=k, H=x.shape[1], I=i, IS=i_s, BM=block_m, BN=bn, BK=bk,
        NKP=triton.next_power_of_2(block_m * k), KP=triton.next_power_of_2(k),
        TP=max(2, triton.next_power_of_2(arrivals.numel())),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.gate_up_warps, num_stages=tuning.gate_up_stages, **pdl.options(x))
