"""The GDN kernels' `@triton.jit` helpers (inlined into each kernel that calls them): the gates,
the pending commit's tiles and fold, the token-by-token recurrence, the conv tile, and the split
kernel's bf16 products.

Tiles follow fla's prefixes: `p_` pointers, `b_` block values, `o_` offsets, `m_` masks, `i_`
program ids; compile-time constants are UPPERCASE. BJ is the previous round's length rounded up
to a power of two (at least 16 where the tile enters tl.dot).
"""

import triton
import triton.language as tl


@triton.jit
def log1p(y):
    """log(1 + y), accurate for small y (the rounding of 1 + y cancels in log(u) y / (u - 1))."""
    u = 1.0 + y
    d = u - 1.0
    return tl.where(d == 0.0, y, tl.log(u) * (y / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def log_decay(a, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias), softplus(x) = x above SOFTPLUS_THRESHOLD (= 20)."""
    x = a + dt_bias
    return -tl.exp(A_log) * tl.where(x > 20.0, x, log1p(tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                  stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t, stride_pk_h,
                  stride_pg_b, stride_pg_t, BJ: tl.constexpr):
    """The previous round's factors of this program's rows (value head i_h, key head i_hk), tokens
    j < PT (<= BJ) loaded at once: z_j as columns [BV, BJ] (fp32), k_j as rows [BJ, BK] (its dtype),
    g_j [BJ], and its m = accepted[b]; none of the loads depends on m."""
    o_j = tl.arange(0, BJ)
    m_j = o_j < PT
    p_pz = pz + i_b * stride_pz_b + i_h * stride_pz_h + o_v[:, None] + o_j[None, :] * stride_pz_t
    p_pk = pk + i_b * stride_pk_b + i_hk * stride_pk_h + o_k[None, :] + o_j[:, None] * stride_pk_t
    b_pz = tl.load(p_pz, mask=m_v[:, None] & m_j[None, :], other=0)
    b_pk = tl.load(p_pk, mask=m_j[:, None] & m_k[None, :], other=0)
    b_pg = tl.load(pg + i_b * stride_pg_b + i_h + o_j * stride_pg_t, mask=m_j, other=0)
    b_m = tl.load(accepted + i_b).to(tl.int32)
    return b_pz.to(tl.float32), b_pk, b_pg, b_m


@triton.jit
def pending_weights(b_pg, b_m, BJ: tl.constexpr):
    """e^{g_m} and the weights e^{g_m - g_j} [BJ] of Eq. 7 from the previous round's g_cum [BJ] and m:
    g_m picked out of the tile (no load that waits for m), the exponent masked to -inf before exp
    for the rejected tokens j >= m, whose weight is then exactly 0."""
    o_j = tl.arange(0, BJ)
    b_gm = tl.sum(tl.where(o_j == b_m - 1, b_pg, 0.0), axis=0)
    return tl.exp(b_gm), tl.exp(tl.where(o_j < b_m, b_gm - b_pg, float("-inf")))


@triton.jit
def fold_rows(b_s, b_pz, b_pk, b_pg, b_m, BJ: tl.constexpr):
    """Eq. 7 on this program's BV rows of the state, the previous round's commit, S_m = e^{g_m} S +
    sum_{j < m} e^{g_m - g_j} z_j k_j^T, by BJ rank-1 updates (programs of fewer than 16 rows, tl.dot's
    smallest tile); token j's z and k rows are picked out of the tiles (sums of one value and
    zeros, exact), BJ = the previous round's length rounded up to a power of two."""
    o_j = tl.arange(0, BJ)
    b_decay, b_w = pending_weights(b_pg, b_m, BJ)
    b_wz = b_pz * b_w[None, :]
    b_pk = b_pk.to(tl.float32)
    b_s = b_decay * b_s
    for j in tl.static_range(BJ):
        b_zj = tl.sum(tl.where(o_j[None, :] == j, b_wz, 0.0), axis=1)  # [BV]
        b_kj = tl.sum(tl.where(o_j[:, None] == j, b_pk, 0.0), axis=0)  # [BK]
        b_s += b_zj[:, None] * b_kj[None, :]
    return b_s


@triton.jit
def recurrent_steps(b_s, b_Q, b_K, b_V, b_G, b_B, T: tl.constexpr, BT: tl.constexpr):
    """Eq. 1 token by token on BV rows of the state, S_0 = b_s [BV, BK] in registers: per token i,
    z_i = beta_i (v_i - e^{gamma_i} S_{i-1} k_i), S_i = e^{gamma_i} S_{i-1} + z_i k_i^T, o_i = S_i q_i,
    from every token's normalised q, k rows [BT, BK], v columns [BV, BT], log decays gamma and write
    strengths beta [BT] loaded before the loop (so its chain is the state arithmetic alone). Returns
    o and z as columns [BV, BT] and the cumulative log decays g_cum [BT], all fp32; the final state
    is not returned (no kernel writes it)."""
    o_t = tl.arange(0, BT)
    b_o = tl.zeros([b_s.shape[0], BT], dtype=tl.float32)  # column i: o_i restricted to these rows
    b_z = tl.zeros([b_s.shape[0], BT], dtype=tl.float32)
    b_gc = tl.zeros([BT], dtype=tl.float32)
    g_i = 0.0
    for i in tl.static_range(T):
        # row i of the tiles (sums of one value and zeros: exact)
        b_k = tl.sum(tl.where(o_t[:, None] == i, b_K, 0.0), axis=0)  # k_i [BK]
        b_q = tl.sum(tl.where(o_t[:, None] == i, b_Q, 0.0), axis=0)
        b_vi = tl.sum(tl.where(o_t[None, :] == i, b_V, 0.0), axis=1)  # v_i [BV]
        gamma = tl.sum(tl.where(o_t == i, b_G, 0.0), axis=0)
        b_beta = tl.sum(tl.where(o_t == i, b_B, 0.0), axis=0)
        g_i += gamma
        b_s = b_s * tl.exp(gamma)
        b_zi = b_beta * (b_vi - tl.sum(b_s * b_k[None, :], axis=1))  # [BV]
        b_s += b_zi[:, None] * b_k[None, :]
        b_oi = tl.sum(b_s * b_q[None, :], axis=1)  # [BV]
        b_z = tl.where(o_t[None, :] == i, b_zi[:, None], b_z)
        b_o = tl.where(o_t[None, :] == i, b_oi[:, None], b_o)
        b_gc = tl.where(o_t == i, g_i, b_gc)
    return b_o, b_z, b_gc


@triton.jit
def conv_silu_tile(p_x, p_cs, p_cw, o_t, o_c, m_t, m_c, stride_x_t, stride_cs_c, stride_cs_k, stride_cw_c,
                   stride_cw_k, K: tl.constexpr):
    """The causal depthwise conv + SiLU of channels o_c [BC] at tokens o_t [BT] of one sequence:
    tap j of token t reads x[t + j - (K - 1)] (p_x: [T, C] rows) or, before the first token, the
    window's column K - 1 + t + j - (K - 1) (p_cs: [C, K - 1]); the K products with the weights
    (p_cw: [C, K]) summed in tap order in fp32, rounded to x's dtype, the SiLU, rounded again.
    Returns that [BT, BC] (widened to fp32, exact) and x at (o_t, o_c) [BT, BC] in x's dtype (the
    last tap's input), both zero where masked."""
    acc = tl.zeros([o_t.shape[0], o_c.shape[0]], dtype=tl.float32)
    for j in tl.static_range(K):
        s = o_t + (j - (K - 1))  # the input this tap reads: x[s], or window column K - 1 + s before x
        in_x = s >= 0
        b_x = tl.load(p_x + s[:, None] * stride_x_t + o_c[None, :], mask=(in_x & m_t)[:, None] & m_c[None, :],
                      other=0.0)
        b_c = tl.load(p_cs + o_c[None, :] * stride_cs_c + (s + (K - 1))[:, None] * stride_cs_k,
                      mask=((s < 0) & m_t)[:, None] & m_c[None, :], other=0.0)
        b_w = tl.load(p_cw + o_c * stride_cw_c + j * stride_cw_k, mask=m_c, other=0.0).to(tl.float32)
        acc += tl.where(in_x[:, None], b_x, b_c).to(tl.float32) * b_w[None, :]
    dtype = p_x.dtype.element_ty
    b_a = acc.to(dtype).to(tl.float32)
    return (b_a / (1.0 + tl.exp(-b_a))).to(dtype).to(tl.float32), b_x


@triton.jit
def dot_bt_bf16(b_a, b_b, WIDEN: tl.constexpr):
    """A B^T of two bf16 tiles, fp32 sums of exact products: a bf16 tensor-core product, or (WIDEN,
    under the interpreter, whose tl.dot multiplies bf16 tiles as raw 16-bit integers)
    the same product of the values widened to fp32, exact as well."""
    if WIDEN:
        return tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), input_precision="ieee")
    return tl.dot(b_a, tl.trans(b_b))


@triton.jit
def split_bf16(b_s):
    """fp32 S = S_1 + S_2 in two bf16 pieces, up to 2^-18 |S| when the narrowing rounds to nearest
    as on GPUs (2^-16 where it truncates, as the interpreter does); the remainder is exact in fp32."""
    b_s1 = b_s.to(tl.bfloat16)
    b_r = b_s - b_s1.to(tl.float32)
    return b_s1, b_r.to(tl.bfloat16)
