"""GDN verification by the blocked form (Eqs. 3, 10), ordered for latency: the kernel shipped from
five tokens on (`tuning.SHIPPED`). Maths and layouts as `reference.gdn_verify` / `gdn_verify_gated`.

One launch per layer over a grid (B * HV, dv / BV). A program owns one value head and BV rows of
S_0: K S_0^T, Q S_0^T, Z and O restricted to those value rows need only those rows of S_0, so the
small T x T matrices (K K^T, Q K^T, decays, the inverse of H) are recomputed by each of the dv / BV
programs of a head. Tokens are padded to BT = 16 (the smallest tl.dot tile); T is a compile-time
constant, so each length gets its own specialised kernel.

Eq. 3 is solved exactly with 16 x 16 matrix products only. H = I + A with A strictly lower
triangular; split A = D + E into its 4 x 4 diagonal blocks D and the part E below them. Then
D^4 = 0 and M = (I + D)^-1 E satisfies M^4 = 0 (four block rows), so

    H^-1 = (I + M)^-1 (I + D)^-1 = (I - M)(I + M^2) (I - D)(I + D^2)

with the factors a length needs (T <= 2: I - D; <= 4: (I + D)^-1; <= 8: (I - M)(I + D)^-1).
The plain series H^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8) is exact too, but powers of A grow
like binomial coefficients when keys align (beta ~ 1, decay ~ 1) and cancel in fp32; the blocked
form (no power above the third) stays as accurate as a triangular solve.

Latency: S_0's rows, q, k, v and the gates are all loaded at the top and (FENCE) held in flight
together: each tile's first use goes through an opaque register move that also takes the
last-loaded value (`after`), since Triton otherwise converts each tile's layout (through shared
memory and a barrier) before issuing the next load, one round trip to memory per tile. The
state-independent part (K K^T, Q K^T, gates, the inverse of H) comes before K S_0^T and Q S_0^T,
and every dk-long product is one tl.dot over the whole key dimension.

Numerics: with bf16 q and k (the model's projections) the dk-long products are bf16 tensor-core
products: q and k are exact in bf16, and S_0 enters as two bf16 pieces S_0 = S_1 + S_2 (to 2^-18 of
it relative when rounding to nearest), each piece's product exact in fp32; fp32 inputs take tf32x3
products (about fp32 accuracy). The 16 x 16 products of the solve are `ieee` fp32. Decay exponents
g_i - g_j are masked to -inf before `exp` wherever j > i.
"""

import torch
import triton
import triton.language as tl

from hybridspec.kernels.gdn.launch import BLOCK_T, launch_options, verify_arguments
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.gdn.tiles import (
    dot_bt_bf16,
    log_decay,
    pending_tiles,
    pending_weights,
    split_bf16,
)
from hybridspec.kernels.gdn.tuning import VerifyTuning
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def inverse_unit_lower(b_a, T: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 for strictly lower triangular A [BT, BT] (rows >= T zero), by products only.

    A = D + E with D its 4 x 4 diagonal blocks: D^4 = 0, so (I + D)^-1 = (I - D)(I + D^2);
    M = (I + D)^-1 E is strictly lower by blocks, M^4 = 0, so
    (I + A)^-1 = (I + M)^-1 (I + D)^-1 = (I - M)(I + M^2)(I + D)^-1.
    """
    o_t = tl.arange(0, BT)
    b_eye = (o_t[:, None] == o_t[None, :]).to(tl.float32)
    m_block = (o_t[:, None] // 4) == (o_t[None, :] // 4)
    b_d = tl.where(m_block, b_a, 0.0)  # D [BT, BT]
    b_inv = b_eye - b_d  # exact while D^2 = 0 (T <= 2)
    if T > 2:
        b_inv = tl.dot(b_inv, b_eye + tl.dot(b_d, b_d, input_precision=PREC),
                       input_precision=PREC)  # (I + D)^-1
    if T > 4:
        b_m = tl.dot(b_inv, tl.where(m_block, 0.0, b_a), input_precision=PREC)  # M
        b_inv_m = b_eye - b_m  # exact while M^2 = 0 (T <= 8: two blocks)
        if T > 8:
            b_inv_m = tl.dot(b_inv_m, b_eye + tl.dot(b_m, b_m, input_precision=PREC),
                             input_precision=PREC)  # (I + M)^-1
        b_inv = tl.dot(b_inv_m, b_inv, input_precision=PREC)
    return b_inv


@triton.jit
def after(b_x, dep, BF16: tl.constexpr):
    """b_x unchanged, through an opaque register move that also takes dep (the value loaded last) as
    an operand, so that it and everything using its result come after the last load in program
    order: each tile's layout conversion (shared memory and a barrier, which no later load is moved
    above) then waits for its own load with every load already in flight, one round trip to memory
    instead of one per tile."""
    if BF16:  # two bf16 in one 32-bit register; the fp32 dep then comes as two registers
        b_out = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r", [b_x, dep], dtype=tl.bfloat16,
                                          is_pure=False, pack=2)
    else:
        b_out = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [b_x, dep], dtype=tl.float32,
                                          is_pure=False, pack=1)
    return b_out


@triton.jit
def decays(b_gc, b_beta, b_kk, o_t):
    """From the cumulative log decays g [BT]: H - I = diag(beta) (strictly lower e^{g_i - g_j}) . K K^T,
    Gamma (lower e^{g_i - g_j}) [BT, BT] and e^{g_i} [BT, 1]; the exponent is masked to -inf before
    exp where j > i (or j = i), so a positive difference is never exponentiated."""
    b_diff = b_gc[:, None] - b_gc[None, :]  # [BT, BT]
    b_a = b_beta[:, None] * tl.exp(tl.where(o_t[:, None] > o_t[None, :], b_diff, float("-inf"))) * b_kk
    b_gamma = tl.exp(tl.where(o_t[:, None] >= o_t[None, :], b_diff, float("-inf")))
    return b_a, b_gamma, tl.exp(b_gc)[:, None]


@triton.jit
def store_outputs(p_o, p_z, p_gc, b_o, b_z, b_gc, o_t, o_v, m_t, m_tv, first_block,
                  stride_o_t, stride_z_t, stride_gc_t):
    """o [BT, BV] (in o's dtype) and z [BT, BV] (fp32) at token rows o_t, value columns o_v of one
    head; g_cum [BT] by the program of the first value block only."""
    p_o = p_o + o_t[:, None] * stride_o_t + o_v[None, :]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_tv)
    tl.store(p_z + o_t[:, None] * stride_z_t + o_v[None, :], b_z, mask=m_tv)
    if first_block:
        tl.store(p_gc + o_t * stride_gc_t, b_gc, mask=m_t)


@triton.jit
def split_dot(b_a, b_s1, b_s2, WIDEN: tl.constexpr):
    """A S^T for bf16 A [BT, BK] (exact in bf16) and S = S_1 + S_2 [BV, BK] in bf16 pieces
    (`split_bf16`): each piece's product with A is exact in fp32, and the two products are
    independent (no accumulator chain between them)."""
    return dot_bt_bf16(b_a, b_s1, WIDEN) + dot_bt_bf16(b_a, b_s2, WIDEN)


@triton.jit
def fold_tiles(b_s, b_decay, b_wz, b_pk, PIECES: tl.constexpr, WIDEN: tl.constexpr):
    """Eq. 7 on this program's BV rows of the state, the previous round's commit: S_m = e^{g_m} S +
    sum_{j < m} e^{g_m - g_j} z_j k_j^T as one [BV, BJ] x [BJ, BK] product of the weighted z
    (`pending_weights`) and the k rows. PIECES (bf16 inputs, whose tolerance is that of bf16): the
    weighted z in two bf16 pieces (`split_bf16`); k exact in bf16 (its raw rows, `raw_keys`) takes
    two exact bf16 tensor-core products, z_1 k + z_2 k, fp32 k two pieces as well and three
    products, z_1 k_1 + z_1 k_2 + z_2 k_1 (the dropped terms and the pieces' remainders are about
    2^-18 of each term); else tf32x3."""
    if PIECES:
        b_z1, b_z2 = split_bf16(b_wz)
        if b_pk.dtype == tl.bfloat16:
            if WIDEN:  # the interpreter: the same exact products, widened (`dot_bt_bf16`)
                return b_decay * b_s + (dot_bt_bf16(b_z1, tl.trans(b_pk), WIDEN)
                                        + dot_bt_bf16(b_z2, tl.trans(b_pk), WIDEN))
            return tl.dot(b_z2, b_pk, acc=tl.dot(b_z1, b_pk, acc=b_decay * b_s))
        b_k1, b_k2 = split_bf16(b_pk)
        if WIDEN:
            return b_decay * b_s + (dot_bt_bf16(b_z1, tl.trans(b_k1), WIDEN) + dot_bt_bf16(b_z1, tl.trans(b_k2), WIDEN)
                                    + dot_bt_bf16(b_z2, tl.trans(b_k1), WIDEN))
        # one accumulator chain: no adds outside the tensor cores (each warp has 8 tiles in flight)
        return tl.dot(b_z2, b_k1, acc=tl.dot(b_z1, b_k2, acc=tl.dot(b_z1, b_k1, acc=b_decay * b_s)))
    return tl.dot(b_wz, b_pk.to(tl.float32), acc=b_decay * b_s, input_precision="tf32x3")


@triton.jit
def gdn_verify_split_kernel(
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
    GATED: tl.constexpr, WRITE_K: tl.constexpr, EPS: tl.constexpr, USE_GDC: tl.constexpr,
    PIECES: tl.constexpr, WIDEN: tl.constexpr, FENCE: tl.constexpr,
    FOLD: tl.constexpr, BJ: tl.constexpr, RAW_KEYS: tl.constexpr, LATE_KEYS: tl.constexpr,
    EARLY_STATE: tl.constexpr,
):
    """Eqs. 3, 10 for BV value rows of one head: every input loaded at the top (FENCE: every tile's
    first use after the last load, `after`), the state-independent part first, then K S_0^T and
    Q S_0^T, each one tl.dot over the whole key dimension. PIECES (bf16 q and k): K K^T and Q K^T
    are bf16 tensor-core products (exact products, fp32 sums) and S_0 enters in two bf16 pieces
    (`split_dot`); else tf32x3 products. The scale of q and the row norms (GATED) multiply the
    products' rows and columns afterwards.

    GATED: q, k are raw (normalised through their row norms, |k_i|^2 the diagonal of K K^T), g and
    beta hold the raw a and b (gates formed here from A_log, dt_bias). WRITE_K: the normalised k
    goes to k_out (by the dv block 0 program of the first value head of each key head); RAW_KEYS:
    k as loaded goes there instead, after the outputs if LATE_KEYS, and z is stored as z_i / |k_i|.
    FOLD: the previous round's commit (Eq. 7) on these rows first (`fold_tiles`), stored in place
    and verified from. USE_GDC: launched with programmatic dependent launch; EARLY_STATE: S_0, the
    pending factors and the gate weights loaded before its wait (as `verify_recurrent`). WIDEN:
    interpreted (`dot_bt_bf16`)."""
    if USE_GDC and not EARLY_STATE:
        wait_then_release()
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // HV).to(tl.int64), i_bh % HV
    i_hk = i_h // GROUP
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_k, m_v = o_t < T, o_k < DK, o_v < DV
    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]

    # S_0 rows [BV, BK] first (without FENCE they arrive while the state-independent part runs)
    p_s = state + i_b * stride_s_b + i_h * stride_s_h + o_v[:, None] * stride_s_v + o_k[None, :]
    b_s = tl.load(p_s, mask=m_v[:, None] & m_k[None, :], other=0)
    if FOLD:  # the previous round's factors of these rows and its m (its commit, applied below)
        b_pz, b_pk, b_pg, b_m = pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                                              stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t,
                                              stride_pk_h, stride_pg_b, stride_pg_t, BJ)
    if GATED:  # the gate weights (raw a, b -> g, beta below; padded tokens keep g = beta = 0)
        a_log, dt = tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32)
    if USE_GDC and EARLY_STATE:
        wait_then_release()
    p_k = k + i_b * stride_k_b + o_t[:, None] * stride_k_t + i_hk * stride_k_h + o_k[None, :]
    p_q = q + i_b * stride_q_b + o_t[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :]
    b_k = tl.load(p_k, mask=m_tk, other=0)  # [BT, BK], input dtype
    b_q = tl.load(p_q, mask=m_tk, other=0)
    if not PIECES:
        b_k, b_q = b_k.to(tl.float32), b_q.to(tl.float32)
    p_v = v + i_b * stride_v_b + o_t[:, None] * stride_v_t + i_h * stride_v_h + o_v[None, :]
    b_v = tl.load(p_v, mask=m_tv, other=0)  # [BT, BV], input dtype
    b_g = tl.load(g + i_b * stride_g_b + o_t * stride_g_t + i_h, mask=m_t, other=0)
    b_beta = tl.load(beta + i_b * stride_beta_b + o_t * stride_beta_t + i_h, mask=m_t, other=0)
    if FENCE:  # every tile's first use after the last load, so that all loads are in flight at once
        dep = tl.load(beta + i_b * stride_beta_b + i_h).to(tl.float32)
        b_s = after(b_s, dep, False)
        b_v = after(b_v, dep, b_v.dtype == tl.bfloat16)
        b_k = after(b_k, dep, b_k.dtype == tl.bfloat16)
        b_q = after(b_q, dep, b_q.dtype == tl.bfloat16)
        b_g = after(b_g, dep, b_g.dtype == tl.bfloat16)
        b_beta = after(b_beta, dep, b_beta.dtype == tl.bfloat16)
        if FOLD:
            b_pz, b_pg = after(b_pz, dep, False), after(b_pg, dep, False)
            b_pk = after(b_pk, dep, b_pk.dtype == tl.bfloat16)
            b_m = after(b_m.to(tl.float32, bitcast=True), dep, False).to(tl.int32, bitcast=True)
    b_v, b_g, b_beta = b_v.to(tl.float32), b_g.to(tl.float32), b_beta.to(tl.float32)
    if GATED:
        b_g = tl.where(m_t, log_decay(b_g, a_log, dt), 0.0)
        b_beta = tl.where(m_t, tl.sigmoid(b_beta), 0.0)
    b_gc = tl.cumsum(b_g, axis=0)

    # state-independent: K K^T, Q K^T [BT, BT]
    if PIECES:
        b_kk = dot_bt_bf16(b_k, b_k, WIDEN)
        b_qk = dot_bt_bf16(b_q, b_k, WIDEN)
    else:
        b_kk = tl.dot(b_k, tl.trans(b_k), input_precision="tf32x3")
        b_qk = tl.dot(b_q, tl.trans(b_k), input_precision="tf32x3")
    if GATED:  # q_i -> scale q_i / |q_i|, k_i -> k_i / |k_i|; |k_i|^2 is the diagonal of K K^T
        b_qf = b_q.to(tl.float32)
        r_q = scale * tl.rsqrt(tl.sum(b_qf * b_qf, axis=1) + EPS)  # [BT]
        b_k2 = tl.sum(tl.where(o_t[:, None] == o_t[None, :], b_kk, 0.0), axis=1)
        r_k = tl.rsqrt(b_k2 + EPS)
    else:
        r_q = tl.full([BT], scale, tl.float32)
        r_k = tl.full([BT], 1.0, tl.float32)
    b_kk = b_kk * (r_k[:, None] * r_k[None, :])
    b_qk = b_qk * (r_q[:, None] * r_k[None, :])
    b_a, b_gamma, b_decay0 = decays(b_gc, b_beta, b_kk, o_t)
    b_inv = inverse_unit_lower(b_a, T, BT, "ieee")
    b_gqk = b_gamma * b_qk  # Gamma . Q K^T
    if WRITE_K:
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + o_t[:, None] * stride_ko_t + i_hk * stride_ko_h + o_k[None, :]
            if RAW_KEYS:
                if not LATE_KEYS:
                    tl.store(p_ko, b_k.to(p_ko.dtype.element_ty), mask=m_tk)
            else:
                tl.store(p_ko, (b_k.to(tl.float32) * r_k[:, None]).to(p_ko.dtype.element_ty), mask=m_tk)

    if FOLD:  # the previous round's commit (Eq. 7) on these rows, stored in place: S_0 of this round
        b_pdecay, b_pw = pending_weights(b_pg, b_m, BJ)
        b_s = fold_tiles(b_s, b_pdecay, b_pz * b_pw[None, :], b_pk, PIECES, WIDEN)
        tl.store(p_s, b_s, mask=m_v[:, None] & m_k[None, :])

    # K S_0^T, Q S_0^T [BT, BV]
    if PIECES:
        b_s1, b_s2 = split_bf16(b_s)
        b_ks = split_dot(b_k, b_s1, b_s2, WIDEN)
        b_qs = split_dot(b_q, b_s1, b_s2, WIDEN)
    else:
        b_ks = tl.dot(b_k, tl.trans(b_s), input_precision="tf32x3")
        b_qs = tl.dot(b_q, tl.trans(b_s), input_precision="tf32x3")
    b_ks = b_ks * r_k[:, None]
    b_qs = b_qs * r_q[:, None]

    # Eq. 3: Z = H^-1 diag(beta) (V - diag(e^g) K S_0^T); Eq. 10: O = diag(e^g) Q S_0^T + (Gamma . Q K^T) Z
    b_z = tl.dot(b_inv, b_beta[:, None] * (b_v - b_decay0 * b_ks), input_precision="ieee")
    b_o = b_decay0 * b_qs + tl.dot(b_gqk, b_z, input_precision="ieee")

    if RAW_KEYS:  # the pair (z_i / |k_i|, k_i) has the outer product z_i k_i^T / |k_i|
        b_z = b_z * r_k[:, None]
    store_outputs(o + i_b * stride_o_b + i_h * stride_o_h, z + i_b * stride_z_b + i_h * stride_z_h,
                  g_cum + i_b * stride_gc_b + i_h, b_o, b_z, b_gc, o_t, o_v, m_t, m_tv, i_v == 0,
                  stride_o_t, stride_z_t, stride_gc_t)
    if WRITE_K and RAW_KEYS and LATE_KEYS:
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + o_t[:, None] * stride_ko_t + i_hk * stride_ko_h + o_k[None, :]
            tl.store(p_ko, b_k.to(p_ko.dtype.element_ty), mask=m_tk)


def launch_verify_split(q, k, v, g, beta, state, scale, o, z, g_cum, tuning: VerifyTuning, *, gates=None,
                        k_out=None, pending=None, raw_keys=False) -> None:
    """One launch of `gdn_verify_split_kernel`, arguments as `launch.verify_arguments`; the tokens
    padded to one tl.dot tile (BLOCK_T), bf16 q and k as bf16 pieces, interpreted: widened products."""
    grid, args, shape, pt = verify_arguments(q, k, v, g, beta, state, scale, o, z, g_cum, tuning, "split",
                                             gates=gates, k_out=k_out, pending=pending, raw_keys=raw_keys)
    gdn_verify_split_kernel[grid](*args, **shape, BT=BLOCK_T, BJ=max(BLOCK_T, triton.next_power_of_2(pt)),
                                  LATE_KEYS=tuning.late_keys, EARLY_STATE=tuning.early_state,
                                  PIECES=q.dtype == k.dtype == torch.bfloat16, WIDEN=interpreted(),
                                  FENCE=not interpreted(), num_warps=tuning.num_warps, num_stages=1,
                                  **launch_options(tuning.pdl, state))
