"""The accepted state of every GDN layer by Eq. 7, one launch for all L layers (`reference.gdn_commit`).

Grid (L * B * HV, dv / BV): each program reads m = accepted[b] on the device (no host
synchronisation) and rewrites BV rows of one state in place,

    S_m = e^{g_m} S_0 + sum_{j <= m} e^{g_m - g_j} z_j k_j^T,

either by m rank-1 updates (no work for the rejected tokens, one load latency per token; short
windows) or as one [BV, 16] x [16, dk] tf32x3 tensor-core product of all tokens' factors with the
rejected ones masked to zero, every load issued at once (`CommitTuning.method`). g_m - g_j <= 0
for j <= m, so no exponent is positive; accumulation is fp32.
"""

import triton
import triton.language as tl

from hybridspec.kernels.gdn.launch import BLOCK_T, key_block
from hybridspec.kernels.gdn.tuning import CommitTuning


@triton.jit
def gdn_commit_kernel(
    states, z, k, g_cum, accepted, batch,
    stride_s_l, stride_s_b, stride_s_h, stride_s_v,
    stride_z_l, stride_z_b, stride_z_t, stride_z_h,
    stride_k_l, stride_k_b, stride_k_t, stride_k_h,
    stride_gc_l, stride_gc_b, stride_gc_t,
    HV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr, BT: tl.constexpr,
):
    """BV rows of one layer's state for one sequence. DOT: the m rank-1 updates as one
    [BV, BT] x [BT, BK] product of the weighted z columns and the k rows (tokens >= m masked to
    zero, BT the window rounded up to a power of two, at least 16); else a loop over the m tokens."""
    i_lbh, i_v = tl.program_id(0), tl.program_id(1)
    i_l, i_b, i_h = (i_lbh // (batch * HV)).to(tl.int64), (i_lbh // HV % batch).to(tl.int64), i_lbh % HV
    i_hk = i_h // GROUP
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV

    p_s = (states + i_l * stride_s_l + i_b * stride_s_b + i_h * stride_s_h
           + o_v[:, None] * stride_s_v + o_k[None, :])
    m_s = m_v[:, None] & m_k[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0)  # S_0 rows [BV, BK]

    b_m = tl.load(accepted + i_b).to(tl.int32)  # m, committed tokens of this sequence (1 <= m <= T)
    p_gc = g_cum + i_l * stride_gc_l + i_b * stride_gc_b + i_h
    p_z = z + i_l * stride_z_l + i_b * stride_z_b + i_h * stride_z_h + o_v
    p_k = k + i_l * stride_k_l + i_b * stride_k_b + i_hk * stride_k_h + o_k
    b_gm = tl.load(p_gc + (b_m - 1) * stride_gc_t)  # g_m

    # Eq. 7 on rows o_v, in place
    b_s = tl.exp(b_gm) * b_s
    if DOT:
        o_t = tl.arange(0, BT)
        m_j = o_t < b_m  # committed tokens j < m
        b_w = tl.where(m_j, tl.exp(b_gm - tl.load(p_gc + o_t * stride_gc_t, mask=m_j, other=0)), 0.0)  # [BT]
        b_wz = tl.load(p_z[:, None] + o_t[None, :] * stride_z_t, mask=m_v[:, None] & m_j[None, :],
                       other=0).to(tl.float32) * b_w[None, :]  # e^{g_m - g_j} z_j as columns [BV, BT]
        b_kt = tl.load(p_k[None, :] + o_t[:, None] * stride_k_t, mask=m_j[:, None] & m_k[None, :],
                       other=0).to(tl.float32)  # k_j as rows [BT, BK]
        b_s = tl.dot(b_wz, b_kt, acc=b_s, input_precision="tf32x3")
    else:
        for j in range(0, b_m):
            b_wz = tl.load(p_z + j * stride_z_t, mask=m_v, other=0).to(tl.float32) * tl.exp(
                b_gm - tl.load(p_gc + j * stride_gc_t))  # e^{g_m - g_j} z_j [BV]
            b_kj = tl.load(p_k + j * stride_k_t, mask=m_k, other=0).to(tl.float32)  # k_j [BK]
            b_s += b_wz[:, None] * b_kj[None, :]
    tl.store(p_s, b_s, mask=m_s)


def launch_commit(states, z, k, g_cum, accepted, tuning: CommitTuning) -> None:
    """One launch of `gdn_commit_kernel` on arguments that `triton.gdn_commit` has validated:
    states [L, B, HV, dv, dk], z [L, B, T, HV, dv], k [L, B, T, HK, dk], g_cum [L, B, T, HV],
    accepted [B]."""
    L, B, HV, dv, dk = states.shape
    grid = (L * B * HV, triton.cdiv(dv, tuning.block_v))
    gdn_commit_kernel[grid](
        states, z, k, g_cum, accepted, B,
        *states.stride()[:4], *z.stride()[:4], *k.stride()[:4], *g_cum.stride()[:3],
        HV=HV, GROUP=HV // k.shape[3], DK=dk, DV=dv, BK=key_block(dk), BV=tuning.block_v,
        DOT=tuning.method == "dot", BT=max(BLOCK_T, triton.next_power_of_2(z.shape[2])), num_warps=tuning.num_warps,
    )
