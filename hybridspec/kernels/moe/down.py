"""Second half of the experts: y[n, j] = act[n, j] W_down_e^T for each distinct expert e and each
token n that routes to it (j: the token's position among its k experts; the shared expert's at
j = k), then out_n = sum_j y[n, j] in a fixed order.

Grid (N·k + 1, ceil(H / BH)), as the gate_up kernel's: program (s, t) with s < count runs distinct
expert slot_expert[s] (its [BH, I] tile of down weights read once, for all its tokens at once),
s in count..N·k−1 return at once, s = N·k is the shared expert. act already carries each routing
weight, so the k + 1 rows of a token only need summing; they are stored in fp32 and summed by the
launcher in order j = 0..k (no atomics: the result does not depend on the order programs run).

    act [N, k + 1, max(I, Is)]   down [E, H, I]   shared down [H, Is]   y [N, k + 1, H] fp32
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels.moe.tiles import dot_bt


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
def _moe_down_kernel(act_ptr, d_ptr, sd_ptr, slot_expert_ptr, slot_kpos_ptr, count_ptr, y_ptr,
                     stride_an, stride_ak, stride_de, stride_dh, stride_sdh, stride_yn, stride_yk,
                     N, K: tl.constexpr, H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr,
                     BM: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                     WIDEN: tl.constexpr):
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_h = i_t * BH + tl.arange(0, BH)
    o_c = tl.arange(0, BK)
    h_ok = o_h < H
    if i_s < N * K:
        if i_s < tl.load(count_ptr):
            e = tl.load(slot_expert_ptr + i_s).to(tl.int64)
            b_kpos = tl.load(slot_kpos_ptr + i_s * BM + o_m)  # [BM] position among the token's k, or -1
            hit = b_kpos >= 0
            p_a = act_ptr + o_m[:, None] * stride_an + b_kpos[:, None] * stride_ak + o_c[None, :]
            p_d = d_ptr + e * stride_de + o_h[:, None] * stride_dh + o_c[None, :]
            acc = _down_products(p_a, p_d, hit, h_ok, I, BM, BH, BK, PRECISION, WIDEN)
            p_y = y_ptr + o_m[:, None] * stride_yn + b_kpos[:, None] * stride_yk + o_h[None, :]
            tl.store(p_y, acc, mask=hit[:, None] & h_ok[None, :])
    else:
        m_ok = o_m < N
        p_a = act_ptr + o_m[:, None] * stride_an + K * stride_ak + o_c[None, :]
        p_d = sd_ptr + o_h[:, None] * stride_sdh + o_c[None, :]
        acc = _down_products(p_a, p_d, m_ok, h_ok, IS, BM, BH, BK, PRECISION, WIDEN)
        tl.store(y_ptr + o_m[:, None] * stride_yn + K * stride_yk + o_h[None, :], acc,
                 mask=m_ok[:, None] & h_ok[None, :])


def launch_down(act, down, shared, slots, out, block_m: int, tuning, widen: bool) -> None:
    """act [N, k + 1, max(I, Is)] from the gate_up kernel, down [E, H, I], shared (or None),
    slots from `routing.expert_slots`, out [N, H] (written); widen: under the interpreter."""
    n, k1 = act.shape[:2]
    e, h, i = down.shape
    i_s = shared.down.shape[1] if shared is not None else 0
    sd = shared.down if shared is not None else down[0]
    slot_expert, slot_kpos, count = slots
    bh = min(tuning.down_bh, max(16, triton.next_power_of_2(h)))
    bk = min(tuning.down_bk, max(16, triton.next_power_of_2(max(i, i_s))))
    y = torch.empty((n, k1 if shared is not None else k1 - 1, h), dtype=torch.float32, device=act.device)
    grid = (n * (k1 - 1) + (shared is not None), triton.cdiv(h, bh))
    _moe_down_kernel[grid](
        act, down, sd, slot_expert, slot_kpos, count, y,
        act.stride(0), act.stride(1), down.stride(0), down.stride(1), sd.stride(0), y.stride(0), y.stride(1),
        N=n, K=k1 - 1, H=h, I=i, IS=i_s, BM=block_m, BH=bh, BK=bk,
        PRECISION="ieee" if act.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.down_warps, num_stages=tuning.down_stages)
    torch.sum(y, dim=1, out=out) if out.dtype == torch.float32 else out.copy_(y.sum(dim=1))
