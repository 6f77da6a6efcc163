"""Both halves of an expert in one program, for calls of a few tokens: program (s, t) computes
columns t·BN..t·BN+BN−1 of the weighted activation act = w · silu(x W_gate^T) * (x W_up^T) of
distinct expert slot_expert[s] (the shared expert's, scaled by sigmoid(x · gate_weight), for
s = N·k), then that slice's share of the output, act[:, cols] W_down[:, cols]^T, over every hidden
column, and stores it as the partial row y[n, j, t] (j: the token's position among its k experts,
k for the shared expert). The down weights are split by intermediate columns instead of by hidden
rows, so no program waits for a whole activation row and no second launch reads act back;
`partial_sum` adds each token's rows in a fixed order.

Grid (N·k + 1, ceil(max(I, Is) / BN)) as the gate_up kernel's; s in count..N·k−1 return at once,
and a program whose columns lie beyond its expert's width stores nothing (`partial_sum` skips
those rows). act is rounded to the weights' dtype before the down product, as the two-launch path
stores it.

    x [N, H]   gate_up [E, 2I, H]   down [E, H, I]   shared gate / up [Is, H], down [H, Is]
    y [N, k + 1, ceil(max(I, Is) / BN), H] fp32
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.gate_up import gated_products, shared_gate
from hybridspec.kernels.moe.tiles import dot_bt
from hybridspec.kernels.moe.tuning import step_width
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _store_down_share(y_ptr, b_act, d_ptr, stride_dh, o_n, n_ok, b_kpos, hit, o_m, i_t, stride_yn, stride_yk,
                      stride_yt, H: tl.constexpr, BM: tl.constexpr, BH: tl.constexpr, PRECISION: tl.constexpr,
                      WIDEN: tl.constexpr):
    """y[n, kpos_n, t, :] = b_act [BM, BN] W_down[:, o_n]^T for the rows in `hit`, BH hidden
    columns per step (d_ptr: the expert's [H, I] down weights)."""
    o_h = tl.arange(0, BH)
    p_y = y_ptr + o_m[:, None] * stride_yn + b_kpos[:, None] * stride_yk + i_t * stride_yt + o_h[None, :]
    p_d = d_ptr + o_h[:, None] * stride_dh + o_n[None, :]
    for h in range(0, H, BH):
        h_ok = h + o_h < H
        b_d = tl.load(p_d + h * stride_dh, mask=h_ok[:, None] & n_ok[None, :], other=0.0)  # [BH, BN]
        acc = dot_bt(b_act, b_d, tl.zeros([BM, BH], dtype=tl.float32), PRECISION, WIDEN)  # [BM, BH]
        tl.store(p_y + h, acc, mask=hit[:, None] & h_ok[None, :])


@triton.jit
def _moe_one_pass_kernel(x_ptr, rw_ptr, gu_ptr, d_ptr, sg_ptr, su_ptr, sd_ptr, sgw_ptr, slot_expert_ptr,
                         slot_kpos_ptr, count_ptr, y_ptr, stride_xn, stride_ge, stride_gn, stride_de, stride_dh,
                         stride_sgn, stride_sun, stride_sdh, stride_yn, stride_yk, stride_yt,
                         N, K: tl.constexpr, H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr,
                         PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_n = i_t * BN + tl.arange(0, BN)
    o_c = tl.arange(0, BK)
    p_x = x_ptr + o_m[:, None] * stride_xn + o_c[None, :]
    if i_s < N * K:
        if (i_s < tl.load(count_ptr)) & (i_t * BN < I):
            e = tl.load(slot_expert_ptr + i_s).to(tl.int64)
            b_kpos = tl.load(slot_kpos_ptr + i_s * BM + o_m)  # [BM] position among the token's k, or -1
            hit = b_kpos >= 0
            n_ok = o_n < I
            p_g = gu_ptr + e * stride_ge + o_n[:, None] * stride_gn + o_c[None, :]
            acc_g, acc_u = gated_products(p_x, p_g, p_g + I * stride_gn, hit, n_ok, H, BM, BN, BK, PRECISION, WIDEN)
            b_w = tl.load(rw_ptr + o_m * K + b_kpos, mask=hit, other=0.0).to(tl.float32)  # [BM]
            b_act = (acc_g * tl.sigmoid(acc_g) * acc_u * b_w[:, None]).to(d_ptr.dtype.element_ty)  # [BM, BN]
            _store_down_share(y_ptr, b_act, d_ptr + e * stride_de, stride_dh, o_n, n_ok, b_kpos, hit, o_m, i_t,
                              stride_yn, stride_yk, stride_yt, H, BM, BH, PRECISION, WIDEN)
    elif i_t * BN < IS:
        m_ok = o_m < N
        n_ok = o_n < IS
        p_g = sg_ptr + o_n[:, None] * stride_sgn + o_c[None, :]
        p_u = su_ptr + o_n[:, None] * stride_sun + o_c[None, :]
        acc_g, acc_u = gated_products(p_x, p_g, p_u, m_ok, n_ok, H, BM, BN, BK, PRECISION, WIDEN)
        scale = shared_gate(p_x, sgw_ptr, m_ok, H, BM, BK)  # [BM]
        b_act = (acc_g * tl.sigmoid(acc_g) * acc_u * scale[:, None]).to(d_ptr.dtype.element_ty)  # [BM, BN]
        b_kpos = tl.full([BM], K, dtype=tl.int32)
        _store_down_share(y_ptr, b_act, sd_ptr, stride_sdh, o_n, n_ok, b_kpos, m_ok, o_m, i_t,
                          stride_yn, stride_yk, stride_yt, H, BM, BH, PRECISION, WIDEN)


def launch_one_pass(x, weights, gate_up, down, shared, slots, y, block_m: int, tuning, widen: bool) -> None:
    """x [N, H], weights [N, k], gate_up [E, 2I, H], down [E, H, I], shared (SharedExpert or None),
    slots from `routing.expert_slots`, y [N, k + 1, tiles, H] fp32 (its rows written where an
    expert of the call covers the tile); widen: under the interpreter."""
    n, k = weights.shape
    h = x.shape[1]
    i = gate_up.shape[1] // 2
    i_s = shared.gate.shape[0] if shared is not None else 0
    bn = tuning.gate_up_bn
    if tuple(y.shape) != (n, k + 1, triton.cdiv(max(i, i_s), bn), h) or y.dtype != torch.float32 or y.stride(3) != 1:
        raise ValueError(f"launch_one_pass: y must be fp32 [N, k + 1, tiles, H] = "
                         f"{(n, k + 1, triton.cdiv(max(i, i_s), bn), h)} with unit last stride, got {y.dtype} "
                         f"{tuple(y.shape)} with strides {y.stride()}")
    slot_expert, slot_kpos, count, _ = slots
    sg, su, sd, sgw = ((shared.gate, shared.up, shared.down, shared.gate_weight) if shared is not None
                       else (gate_up[0], gate_up[0], down[0], gate_up[0]))
    bk = step_width(tuning.gate_up_bk, h, block_m + 2 * bn, x.element_size(), tuning.gate_up_stages)
    bh = min(tuning.down_bh, max(16, triton.next_power_of_2(h)))
    _moe_one_pass_kernel[(n * k + (shared is not None), y.shape[2])](
        x, weights, gate_up, down, sg, su, sd, sgw, slot_expert, slot_kpos, count, y,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), down.stride(0), down.stride(1),
        sg.stride(0), su.stride(0), sd.stride(0), y.stride(0), y.stride(1), y.stride(2),
        N=n, K=k, H=h, I=i, IS=i_s, BM=block_m, BN=bn, BK=bk, BH=bh,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.gate_up_warps, num_stages=tuning.gate_up_stages, **pdl.options(x))
