"""`@triton.jit` helpers shared by the GDN kernels (inlined into each kernel that calls them).

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
def dot_bt(b_a, b_b, WIDEN: tl.constexpr):
    """A B^T of two bf16 tiles, fp32 sums of exact products: a bf16 tensor-core product, or (WIDEN,
    under the interpreter, whose tl.dot multiplies bf16 tiles as raw 16-bit integers in triton 3.9)
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
