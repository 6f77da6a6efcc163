"""The GDN layer between its input and output projections in one launch, for the lengths whose
verification runs `verify_recurrent`: the causal conv + SiLU of the projected q, k, v channels
(`conv.causal_conv_silu`'s roundings), the gated verification with raw keys and the previous
round's commit folded in (`verify_recurrent`'s maths), and the gated RMS norm of the outputs
(`norm.reference.gated_rms_norm`'s roundings), where the layer otherwise launches those three.
Maths and layouts as `reference.gdn_mixer`.

Grid (B * HV, dv / BV), as `verify_recurrent`. A program convolves the channels it reads (its key
head's q and k, its BV rows of v), verifies its rows of the state, stores its rows of o (rounded
to the activation dtype), z and g_cum, and arrives at its head's counter; the last of the head's
dv / BV programs to arrive reads the head's o rows back, normalises and gates them in place, and
resets the counter for the next call. The projections go to the round buffer `conv_out` (the
commit advances the conv window from it): the v channels by every program, the q and k channels,
with the raw keys, by the dv block 0 program of the first value head of each key head.
"""

import torch
import triton
import triton.language as tl

from hybridspec.kernels.gdn.launch import fold_args, key_block, launch_options
from hybridspec.kernels.gdn.reference import L2_EPS
from hybridspec.kernels.gdn.tiles import conv_silu_tile, fold_rows, log_decay, pending_tiles, recurrent_steps
from hybridspec.kernels.gdn.tuning import VerifyTuning
from hybridspec.kernels.pdl import wait_then_release

MAX_HEADS = 8192  # B * HV of one call: one arrival counter each


@triton.jit
def gdn_mixer_kernel(
    x, conv_state, conv_weight, conv_out, a, b, A_log, dt_bias, state, gate, norm_weight,
    o, z, g_cum, k_out, counters, scale, norm_eps,
    stride_x_b, stride_x_t,
    stride_cs_b, stride_cs_c, stride_cs_k,
    stride_cw_c, stride_cw_k,
    stride_co_b, stride_co_t,
    stride_a_b, stride_a_t,
    stride_b_b, stride_b_t,
    stride_s_b, stride_s_h, stride_s_v,
    stride_gate_b, stride_gate_t, stride_gate_h,
    stride_o_b, stride_o_t, stride_o_h,
    stride_z_b, stride_z_t, stride_z_h,
    stride_gc_b, stride_gc_t,
    stride_ko_b, stride_ko_t, stride_ko_h,
    pz, pk, pg, accepted, PT,
    stride_pz_b, stride_pz_t, stride_pz_h,
    stride_pk_b, stride_pk_t, stride_pk_h,
    stride_pg_b, stride_pg_t,
    T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    KEY_DIM: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr, CONV_K: tl.constexpr,
    EPS: tl.constexpr, FOLD: tl.constexpr, BJ: tl.constexpr, USE_GDC: tl.constexpr,
):
    """x [B, T, C] the projected channels (q of every key head, then k, then v; C = 2 HK DK + HV DV),
    conv_state [B, C, CONV_K - 1], conv_weight [C, 1, CONV_K] (KEY_DIM = HK DK); a, b [B, T, HV] raw gate inputs; gate
    [B, T, HV, DV] the norm's gate. Per token i of BV rows of S (S_{i-1} in registers):
    z_i = beta_i (v_i - e^{gamma_i} S_{i-1} k_i), S_i = e^{gamma_i} S_{i-1} + z_i k_i^T,
    o_i = S_i q_i (Eq. 1) from the convolved q, k (L2-normalised here), v; stored: z_i / |k_i|,
    g_cum, the raw k, and o normalised and gated in place. FOLD: the previous round's commit
    (Eq. 7) on these rows first, stored in place and verified from. USE_GDC: programmatic
    dependent launch."""
    if USE_GDC:
        wait_then_release()
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // HV).to(tl.int64), i_bh % HV
    i_hk = i_h // GROUP
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    m_k, m_v, m_t = o_k < DK, o_v < DV, o_t < T
    m_vk = m_v[:, None] & m_k[None, :]
    m_tk = m_t[:, None] & m_k[None, :]

    p_s = state + i_b * stride_s_b + i_h * stride_s_h + o_v[:, None] * stride_s_v + o_k[None, :]
    b_s = tl.load(p_s, mask=m_vk, other=0)  # rows of S_0 [BV, BK]
    if FOLD:  # the previous round's factors of these rows and its m (its commit, applied below)
        b_pz, b_pk, b_pg, b_m = pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                                              stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t,
                                              stride_pk_h, stride_pg_b, stride_pg_t, BJ)
    # the conv of this program's channels: [BT, BK] of q and k, [BT, BV] of v, and their inputs
    p_x, p_cs = x + i_b * stride_x_b, conv_state + i_b * stride_cs_b
    c_q, c_v = i_hk * DK + o_k, 2 * KEY_DIM + i_h * DV + o_v
    b_Q, x_q = conv_silu_tile(p_x, p_cs, conv_weight, o_t, c_q, m_t, m_k, stride_x_t, stride_cs_c, stride_cs_k,
                              stride_cw_c, stride_cw_k, CONV_K)
    b_K, x_k = conv_silu_tile(p_x, p_cs, conv_weight, o_t, KEY_DIM + c_q, m_t, m_k, stride_x_t, stride_cs_c,
                              stride_cs_k, stride_cw_c, stride_cw_k, CONV_K)
    b_Vt, x_v = conv_silu_tile(p_x, p_cs, conv_weight, o_t, c_v, m_t, m_v, stride_x_t, stride_cs_c, stride_cs_k,
                               stride_cw_c, stride_cw_k, CONV_K)
    b_V = tl.trans(b_Vt)  # [BV, BT]
    p_co = conv_out + i_b * stride_co_b + o_t[:, None] * stride_co_t
    tl.store(p_co + c_v[None, :], x_v, mask=m_t[:, None] & m_v[None, :])
    if (i_v == 0) & (i_h % GROUP == 0):  # the key head's q and k inputs, and its raw keys
        tl.store(p_co + c_q[None, :], x_q, mask=m_tk)
        tl.store(p_co + KEY_DIM + c_q[None, :], x_k, mask=m_tk)
        p_ko = k_out + i_b * stride_ko_b + i_hk * stride_ko_h + o_k[None, :] + o_t[:, None] * stride_ko_t
        tl.store(p_ko, b_K.to(p_ko.dtype.element_ty), mask=m_tk)
    b_G = tl.load(a + i_b * stride_a_b + o_t * stride_a_t + i_h, mask=m_t, other=0).to(tl.float32)
    b_B = tl.load(b + i_b * stride_b_b + o_t * stride_b_t + i_h, mask=m_t, other=0).to(tl.float32)
    a_log, dt = tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32)

    r_K = tl.rsqrt(tl.sum(b_K * b_K, axis=1) + EPS)  # 1 / |k_i| [BT]
    b_K = b_K * r_K[:, None]
    b_Q = b_Q * (scale * tl.rsqrt(tl.sum(b_Q * b_Q, axis=1) + EPS))[:, None]
    b_G = log_decay(b_G, a_log, dt)
    b_B = tl.sigmoid(b_B)
    if FOLD:  # the previous round's commit (Eq. 7) on these rows, stored in place: S_0 of this round
        b_s = fold_rows(b_s, b_pz, b_pk, b_pg, b_m, BJ)
        tl.store(p_s, b_s, mask=m_vk)
    b_o, b_z, b_gc = recurrent_steps(b_s, b_Q, b_K, b_V, b_G, b_B, T, BT)

    m_vt = m_v[:, None] & m_t[None, :]
    p_o = o + i_b * stride_o_b + i_h * stride_o_h
    p_z = z + i_b * stride_z_b + o_t[None, :] * stride_z_t + i_h * stride_z_h + o_v[:, None]
    tl.store(p_o + o_t[None, :] * stride_o_t + o_v[:, None], b_o.to(p_o.dtype.element_ty), mask=m_vt)
    tl.store(p_z, b_z * r_K[None, :], mask=m_vt)  # the pair (z_i / |k_i|, k_i): z_i k_i^T / |k_i|
    if i_v == 0:
        tl.store(g_cum + i_b * stride_gc_b + o_t * stride_gc_t + i_h, b_gc, mask=m_t)

    tl.debug_barrier()  # every thread's rows of o stored before the release below
    arrived = tl.atomic_add(counters + i_bh, 1, sem="acq_rel")
    if arrived == tl.num_programs(1) - 1:  # the head's last program: the gated norm of its o rows
        dtype = p_o.dtype.element_ty
        o_d = tl.arange(0, BD)
        m_td = m_t[:, None] & (o_d < DV)[None, :]
        p_oh = p_o + o_t[:, None] * stride_o_t + o_d[None, :]
        b_x = tl.load(p_oh, mask=m_td, other=0.0, cache_modifier=".cg").to(tl.float32)  # [BT, BD]
        b_n = b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=1) / DV + norm_eps)[:, None]
        b_w = tl.load(norm_weight + o_d, mask=o_d < DV, other=0.0).to(tl.float32)
        b_y = (b_w[None, :] * b_n.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        p_g = gate + i_b * stride_gate_b + i_h * stride_gate_h + o_t[:, None] * stride_gate_t + o_d[None, :]
        b_g = tl.load(p_g, mask=m_td, other=0.0).to(tl.float32)
        tl.store(p_oh, (b_y * (b_g / (1.0 + tl.exp(-b_g)))).to(dtype), mask=m_td)
        tl.atomic_xchg(counters + i_bh, 0)  # every program of the head has arrived: ready for the next call


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """The per-head arrival counters of a device (zero between calls: each head's last program
    resets its own). Calls on one device run one after another on its stream, so one set serves
    every layer."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_HEADS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def launch_mixer(x, conv_state, conv_weight, a, b, A_log, dt_bias, state, scale, gate, norm_weight, norm_eps, o,
                 conv_out, z, g_cum, k_out, pending, tuning: VerifyTuning) -> None:
    """One launch of `gdn_mixer_kernel` on arguments `triton.gdn_mixer` has validated (o [B, T, HV, dv]
    the output, in x's dtype); the tokens padded to BT = T rounded up to a power of two, the
    pending ones to BJ likewise."""
    if tuning.method != "recurrent":
        raise ValueError(f"launch_mixer: tuning.method={tuning.method!r}, expected recurrent")
    B, T, HV, dv = o.shape
    HK, dk = k_out.shape[2], k_out.shape[3]
    if B * HV > MAX_HEADS:
        raise ValueError(f"gdn_mixer: B * HV = {B * HV} heads, at most {MAX_HEADS}")
    pt = pending[0].shape[1] if pending is not None else 0
    args = (x, conv_state, conv_weight, conv_out, a, b, A_log, dt_bias, state, gate,
            norm_weight, o, z, g_cum, k_out, _counters(x.device), float(scale), float(norm_eps),
            *x.stride()[:2], *conv_state.stride(), conv_weight.stride(0), conv_weight.stride(2),
            *conv_out.stride()[:2], *a.stride()[:2], *b.stride()[:2], *state.stride()[:3], *gate.stride()[:3],
            *o.stride()[:3], *z.stride()[:3], *g_cum.stride()[:2], *k_out.stride()[:3], *fold_args(state, pending))
    gdn_mixer_kernel[(B * HV, triton.cdiv(dv, tuning.block_v))](
        *args, T=T, HV=HV, GROUP=HV // HK, DK=dk, DV=dv, KEY_DIM=HK * dk, BT=triton.next_power_of_2(T), BK=key_block(dk),
        BV=tuning.block_v, BD=triton.next_power_of_2(dv), CONV_K=conv_weight.shape[-1], EPS=L2_EPS,
        FOLD=pending is not None, BJ=triton.next_power_of_2(max(pt, 1)), num_warps=tuning.num_warps, num_stages=1,
        **launch_options(tuning.pdl, state))
