"""GDN verification by forward substitution in state space (Eq. 1 per token, the same z, o and
g_cum as Eqs. 3, 10): the kernel shipped for up to four tokens (`tuning.SHIPPED`). Maths and
layouts as `reference.gdn_verify` / `gdn_verify_gated`.

One launch per layer over a grid (B * HV, dv / BV). A program keeps BV rows of the running state
in registers and walks the T tokens, two dk-long reductions per token, no T x T algebra and no
padding to 16 tokens; the running state is never written back (only z, o and g_cum). Every
token's q, k, v and gates are loaded as [BT, .] tiles before the token loop, and the norms and
gates of all tokens formed at once, so the loop's chain is the state arithmetic alone.
"""

import triton
import triton.language as tl

from hybridspec.kernels.gdn.launch import launch_options, verify_arguments
from hybridspec.kernels.gdn.tiles import fold_rows, log_decay, pending_tiles, recurrent_steps
from hybridspec.kernels.gdn.tuning import VerifyTuning
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def gdn_verify_recurrent_kernel(
    q, k, v, g, beta, state, o, z, g_cum, scale, A_log, dt_bias, k_out,
    stride_q_b, stride_q_t, stride_q_h,
    stride_k_b, stride_k_t, stride_k_h,
    stride_v_b, stride_v_t, stride_v_h,
    stride_g_b, stride_g_t,
    stride_beta_b, stride_beta_t,
    stride_s_b, stride_s_h, stride_s_v,
    stride_o_b, stride_o_t, stride_o_h,
    stride_z_b, stride_z_t, stride_z_h,
    stride_gc_b, stride_gc_t,
    stride_ko_b, stride_ko_t, stride_ko_h,
    pz, pk, pg, accepted, PT,
    stride_pz_b, stride_pz_t, stride_pz_h,
    stride_pk_b, stride_pk_t, stride_pk_h,
    stride_pg_b, stride_pg_t,
    T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr,
    DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATED: tl.constexpr, WRITE_K: tl.constexpr, EPS: tl.constexpr,
    USE_GDC: tl.constexpr, FOLD: tl.constexpr, BJ: tl.constexpr, RAW_KEYS: tl.constexpr,
    EARLY_STATE: tl.constexpr,
):
    """Per token i of BV rows of S (S_{i-1} in registers): z_i = beta_i (v_i - e^{gamma_i} S_{i-1} k_i),
    S_i = e^{gamma_i} S_{i-1} + z_i k_i^T, o_i = S_i q_i; the outputs are gathered into [BV, BT]
    tiles (BT = T rounded up to a power of two) and stored once after the token loop.

    GATED: q, k are raw (normalised here), g and beta hold the raw a and b (gates formed here from
    A_log, dt_bias). WRITE_K: the normalised k goes to k_out (by the dv block 0 program of the first
    value head of each key head); RAW_KEYS: k as given goes there instead, as soon as it arrives,
    and z is stored as z_i / |k_i|. FOLD: the previous round's commit (Eq. 7) on these rows first
    (`fold_rows`), stored in place and verified from. USE_GDC: programmatic dependent launch.
    EARLY_STATE: the state rows, the pending factors and the gate weights are loaded before the PDL
    wait (the previous launch never writes them: this layer's own launch of the previous pass did,
    `kernels/pdl.py`), so their reads overlap the previous kernel's tail."""
    if USE_GDC and not EARLY_STATE:
        wait_then_release()
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // HV).to(tl.int64), i_bh % HV
    i_hk = i_h // GROUP
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    m_k, m_v, m_t = o_k < DK, o_v < DV, o_t < T
    m_vk = m_v[:, None] & m_k[None, :]

    p_s = state + i_b * stride_s_b + i_h * stride_s_h + o_v[:, None] * stride_s_v + o_k[None, :]
    b_s = tl.load(p_s, mask=m_vk, other=0)  # rows of S_0 [BV, BK]
    if FOLD:  # the previous round's factors of these rows and its m (its commit, applied below)
        b_pz, b_pk, b_pg, b_m = pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                                              stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t,
                                              stride_pk_h, stride_pg_b, stride_pg_t, BJ)
    p_q = q + i_b * stride_q_b + i_hk * stride_q_h + o_k
    p_k = k + i_b * stride_k_b + i_hk * stride_k_h + o_k
    p_v = v + i_b * stride_v_b + i_h * stride_v_h + o_v
    p_g = g + i_b * stride_g_b + i_h
    p_beta = beta + i_b * stride_beta_b + i_h

    r_K = tl.full([BT], 1.0, tl.float32)  # 1 / |k_i| (GATED)
    if GATED:
        a_log, dt = tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32)
    if USE_GDC and EARLY_STATE:
        wait_then_release()
    m_tk = m_t[:, None] & m_k[None, :]
    # every token's inputs at once: [BT, BK] rows of q, k; [BV, BT] of v; [BT] gates
    b_K = tl.load(p_k + o_t[:, None] * stride_k_t, mask=m_tk, other=0).to(tl.float32)
    b_Q = tl.load(p_q + o_t[:, None] * stride_q_t, mask=m_tk, other=0).to(tl.float32)
    b_V = tl.load(p_v[:, None] + o_t[None, :] * stride_v_t, mask=m_v[:, None] & m_t[None, :],
                  other=0).to(tl.float32)
    b_G = tl.load(p_g + o_t * stride_g_t, mask=m_t, other=0).to(tl.float32)
    b_B = tl.load(p_beta + o_t * stride_beta_t, mask=m_t, other=0).to(tl.float32)
    if WRITE_K and RAW_KEYS:  # k as given, as soon as it arrives
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + i_hk * stride_ko_h + o_k + o_t[:, None] * stride_ko_t
            tl.store(p_ko, b_K.to(p_ko.dtype.element_ty), mask=m_tk)
    if GATED:
        r_K = tl.rsqrt(tl.sum(b_K * b_K, axis=1) + EPS)
        b_K = b_K * r_K[:, None]
        b_Q = b_Q * (scale * tl.rsqrt(tl.sum(b_Q * b_Q, axis=1) + EPS))[:, None]
        b_G = log_decay(b_G, a_log, dt)
        b_B = tl.sigmoid(b_B)
    else:
        b_Q = b_Q * scale
    if FOLD:  # the previous round's commit (Eq. 7) on these rows, stored in place: S_0 of this round
        b_s = fold_rows(b_s, b_pz, b_pk, b_pg, b_m, BJ)
        tl.store(p_s, b_s, mask=m_vk)
    b_o, b_z, b_gc = recurrent_steps(b_s, b_Q, b_K, b_V, b_G, b_B, T, BT)

    m_vt = m_v[:, None] & m_t[None, :]
    p_o = o + i_b * stride_o_b + o_t[None, :] * stride_o_t + i_h * stride_o_h + o_v[:, None]
    p_z = z + i_b * stride_z_b + o_t[None, :] * stride_z_t + i_h * stride_z_h + o_v[:, None]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_vt)
    if RAW_KEYS:  # the pair (z_i / |k_i|, k_i) has the outer product z_i k_i^T / |k_i|
        b_z = b_z * r_K[None, :]
    tl.store(p_z, b_z, mask=m_vt)
    if i_v == 0:
        tl.store(g_cum + i_b * stride_gc_b + o_t * stride_gc_t + i_h, b_gc, mask=m_t)
    if WRITE_K and not RAW_KEYS:  # the normalised k
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + i_hk * stride_ko_h + o_k
            tl.store(p_ko + o_t[:, None] * stride_ko_t, b_K.to(p_ko.dtype.element_ty), mask=m_tk)


def launch_verify_recurrent(q, k, v, g, beta, state, scale, o, z, g_cum, tuning: VerifyTuning, *, gates=None,
                            k_out=None, pending=None, raw_keys=False) -> None:
    """One launch of `gdn_verify_recurrent_kernel`, arguments as `launch.verify_arguments`; the
    tokens padded to BT = T rounded up to a power of two, the pending ones to BJ likewise."""
    grid, args, shape, pt = verify_arguments(q, k, v, g, beta, state, scale, o, z, g_cum, tuning, "recurrent",
                                             gates=gates, k_out=k_out, pending=pending, raw_keys=raw_keys)
    gdn_verify_recurrent_kernel[grid](*args, **shape, BT=triton.next_power_of_2(q.shape[1]),
                                      BJ=triton.next_power_of_2(max(pt, 1)), num_warps=tuning.num_warps,
                                      EARLY_STATE=tuning.early_state, num_stages=1,
                                      **launch_options(tuning.pdl, state))
