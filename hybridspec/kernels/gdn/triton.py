"""Triton kernels for GDN verification (Eqs. 3, 10) and the all-layer commit (Eq. 7), DESIGN A.7.

Same signatures, layouts and semantics as `reference.py` (read its docstring for the maths):

    q, k   [B, T, HK, dk]      v, o, z   [B, T, HV, dv]      g, beta, g_cum   [B, T, HV]
    state  [B, HV, dv, dk] fp32 (o_i = S_i (scale q_i));  value head h reads key head h // (HV // HK)

`gdn_verify` is one launch per layer over a grid (B * HV, dv / BV). A program owns one value head
and a block of BV rows of S_0: K S_0^T, Q S_0^T, Z and O restricted to those value rows need only
those rows of S_0, so the small T x T matrices (K K^T, Q K^T, decays, the inverse of H) are simply
recomputed by each of the dv / BV programs of a head. The dk-long products are accumulated over
dk chunks of BKC in a software-pipelined loop (its loads are what the kernel waits on: 1 stage
→ 4 stages took the 30-layer verify from 380 us to 226 us on the H200). Tokens are padded to
BT = 16 (the smallest `tl.dot` tile) and T is a compile-time constant, so each length gets its own
specialised kernel; `VERIFY_TUNING` holds the measured launch parameters per length.

Eq. 3 is solved exactly with 16 x 16 matrix products only. H = I + A with A strictly lower
triangular; split A = D + E into its 4 x 4 diagonal blocks D and the part E below them. Then
D^4 = 0 and M = (I + D)^-1 E satisfies M^4 = 0 (four block rows), so

    H^-1 = (I + M)^-1 (I + D)^-1 = (I - M)(I + M^2) (I - D)(I + D^2)

with the factors a length needs (T <= 2: I - D; <= 4: (I + D)^-1; <= 8: (I - M)(I + D)^-1).
The plain series H^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8) is exact too, but powers of A grow
like binomial coefficients when keys align (beta ~ 1, decay ~ 1) and cancel: it loses 5e-5..1e-4
at T = 16 in fp32, where the blocked form (no power above the third) stays near 1e-7, like a
triangular solve.

`VerifyTuning(method="recurrent")` launches `_gdn_verify_recurrent_kernel` instead, over the same
grid: Eq. 3 by forward substitution in state space. A program keeps BV rows of the running state in
registers and walks the T tokens, two dk-long reductions per token, no T x T algebra and no padding
to 16 tokens; the running state is never written back (only z, o and g_cum, as above). It is the
short-window candidate: at T = 2 the blocked kernel spends most of its time in a chain of 16-token
tiles that the recurrence does not have.

`VerifyTuning(method="split")` launches `_gdn_verify_split_kernel`, the shipped choice from five
tokens on: the same blocked algebra ordered for latency. S_0's rows, q, k, v and the gates are all
loaded at the top and (`fence`) held in flight together: each tile's first use goes through an
opaque register move that also takes the last-loaded value (`_after`), so it follows the last load,
since Triton otherwise converts each tile's layout (through shared memory and a barrier) before
issuing the next load, one round trip to memory per tile (five or six on the H200; 182 -> 147 us
for 30 layers at T = 16). The state-independent part
(K K^T, Q K^T, gates, the inverse of H) comes before K S_0^T and Q S_0^T, and every dk-long
product is one tl.dot over the whole key dimension. With bf16 q and k (the model's projections)
those products are bf16 tensor-core products: q and k are exact in bf16, and S_0 enters split into
`split` bf16 pieces, S_0 = S_1 + S_2 (+ S_3) to 2^-18 (2^-27) of it relative when rounding to
nearest, each piece's product exact in fp32; fp32 inputs take tf32x3 products instead.

`gdn_verify_gated(pending=(z, k, g_cum, accepted))` folds the previous round's commit of the layer
into the same launch (what the runtime does every round, `TargetCache.defer_commit`): before it
verifies, each program of the split and recurrent kernels applies Eq. 7 to the BV rows of S it has
loaded anyway, S_m = e^{g_m} S + sum_{j<m} e^{g_m - g_j} z_j k_j^T (the previous round's factors
loaded with the other inputs, none of the loads waiting for m), stores them in place and verifies
from them; the round then has no commit launch and no second read of the states (30 layers at
w = 16 on the H200: 181 -> 167 us per round). The split kernel forms the update as one [BV, 16] x
[16, dk] product, with bf16 inputs from two bf16 pieces of the weighted z and of k (three chained
tensor-core products, each term to about 2^-18), with fp32 inputs in tf32x3; the recurrent kernel
by rank-1 updates. The blocked kernel takes a one-layer `gdn_commit` launch first.

`raw_keys=True` (what the runtime passes) keeps the factors (z_i / |k_i|, k_i) instead: k_out
receives the raw keys in their own dtype, exact, and z is stored scaled. The outer products are
the same, so the commit and the fold take them unchanged, but with bf16 projections the fold's keys
are exact bf16, two tensor-core products instead of three and half the bytes of the key tile
(30 layers at w = 16: 167 -> 158.5 us per round, at w = 12 181 -> 159).

`gdn_commit` is one launch for all L layers over a grid (L * B * HV, dv / BV): each program reads
m = accepted[b] on the device and rewrites BV rows of one state in place,
S_m = e^{g_m} S_0 + sum_{j <= m} e^{g_m - g_j} z_j k_j^T, either by m rank-1 updates (no work for
the rejected tokens, one load latency per token) or, for longer windows, as one [BV, 16] x [16, dk]
tensor-core product of all tokens' factors with the rejected ones masked to zero
(`COMMIT_TUNING` per window length).

Numerics: the four dk-long products (K S_0^T, Q S_0^T, K K^T, Q K^T) use `input_precision="tf32x3"`
by default (three TF32 tensor-core passes, about fp32 accuracy: 2.5e-7 relative error on the H200
against float64), the 16 x 16 products of the solve `ieee` fp32 (or tf32x3: `VerifyTuning.solve_dot`);
inputs (bf16 or fp32) are widened to fp32 on load, and decay exponents g_i - g_j are masked to -inf
before `exp` wherever j > i, so a positive difference is never exponentiated.
Only explicit pointer arithmetic is used (triton >= 3.9 removed block pointers; the GPU has 3.6).
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.gdn.reference import (
    L2_EPS,
    _check_commit_inputs,
    _check_factor_outputs,
    _check_gated_inputs,
    _check_raw_keys,
    _check_step_inputs,
    check_pending,
)
from hybridspec.kernels.gdn.reference import gdn_commit as reference_commit

MAX_TOKENS = 16  # the verification window W; longer prefill chunks use the reference
MAX_KEY_DIM = 256  # one [BT, BK] key tile per program
BLOCK_T = 16  # tokens padded to the smallest tl.dot tile
INPUT_DTYPES = (torch.bfloat16, torch.float32)

# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _inverse_unit_lower(b_a, T: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
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
def _grid_dependency():
    """Programmatic dependent launch: wait until the previous kernel of the stream has finished and
    its writes are visible, before any load, then let the next kernel launch at once (its launch
    and prologue overlap this kernel's body; its own wait still fences on this one's end)."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _after(b_x, dep, BF16: tl.constexpr):
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
def _log1p(y):
    """log(1 + y), accurate for small y (the rounding of 1 + y cancels in log(u) y / (u - 1))."""
    u = 1.0 + y
    d = u - 1.0
    return tl.where(d == 0.0, y, tl.log(u) * (y / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _log_decay(a, A_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias), softplus(x) = x above SOFTPLUS_THRESHOLD (= 20)."""
    x = a + dt_bias
    return -tl.exp(A_log) * tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _key_products(p_q, p_k, p_s, i_k, m_t, m_v, scale, b_ks, b_qs, b_kk, b_qk, b_q2, b_k2,
                  DK: tl.constexpr, BKC: tl.constexpr, KEY_DOT: tl.constexpr, GATED: tl.constexpr):
    """Add the dk chunk [i_k, i_k + BKC) to K S_0^T, Q S_0^T [BT, BV] and K K^T, Q K^T [BT, BT]
    (GATED: also to the squared norms |q_i|^2, |k_i|^2 [BT] of the raw rows)."""
    o_k = i_k + tl.arange(0, BKC)
    m_k = o_k < DK
    m_tk = m_t[:, None] & m_k[None, :]
    b_q = tl.load(p_q + o_k[None, :], mask=m_tk, other=0).to(tl.float32) * scale  # [BT, BKC]
    b_k = tl.load(p_k + o_k[None, :], mask=m_tk, other=0).to(tl.float32)  # [BT, BKC]
    b_s = tl.load(p_s + o_k[None, :], mask=m_v[:, None] & m_k[None, :], other=0)  # rows of S_0 [BV, BKC]
    b_ks += tl.dot(b_k, tl.trans(b_s), input_precision=KEY_DOT)
    b_qs += tl.dot(b_q, tl.trans(b_s), input_precision=KEY_DOT)
    b_kk += tl.dot(b_k, tl.trans(b_k), input_precision=KEY_DOT)
    b_qk += tl.dot(b_q, tl.trans(b_k), input_precision=KEY_DOT)
    if GATED:
        b_q2 += tl.sum(b_q * b_q, axis=1)
        b_k2 += tl.sum(b_k * b_k, axis=1)
    return b_ks, b_qs, b_kk, b_qk, b_q2, b_k2


@triton.jit
def _decays(b_gc, b_beta, b_kk, o_t):
    """From the cumulative log decays g [BT]: H - I = diag(beta) (strictly lower e^{g_i - g_j}) . K K^T,
    Gamma (lower e^{g_i - g_j}) [BT, BT] and e^{g_i} [BT, 1]; the exponent is masked to -inf before
    exp where j > i (or j = i), so a positive difference is never exponentiated."""
    b_diff = b_gc[:, None] - b_gc[None, :]  # [BT, BT]
    b_a = b_beta[:, None] * tl.exp(tl.where(o_t[:, None] > o_t[None, :], b_diff, float("-inf"))) * b_kk
    b_gamma = tl.exp(tl.where(o_t[:, None] >= o_t[None, :], b_diff, float("-inf")))
    return b_a, b_gamma, tl.exp(b_gc)[:, None]


@triton.jit
def _store_outputs(p_o, p_z, p_gc, b_o, b_z, b_gc, o_t, o_v, m_t, m_tv, first_block,
                   stride_o_t, stride_z_t, stride_gc_t):
    """o [BT, BV] (in o's dtype) and z [BT, BV] (fp32) at token rows o_t, value columns o_v of one
    head; g_cum [BT] by the program of the first value block only."""
    p_o = p_o + o_t[:, None] * stride_o_t + o_v[None, :]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_tv)
    tl.store(p_z + o_t[:, None] * stride_z_t + o_v[None, :], b_z, mask=m_tv)
    if first_block:
        tl.store(p_gc + o_t * stride_gc_t, b_gc, mask=m_t)


@triton.jit
def _pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
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
def _pending_weights(b_pg, b_m, BJ: tl.constexpr):
    """e^{g_m} and the weights e^{g_m - g_j} [BJ] of Eq. 7 from the previous round's g_cum [BJ] and m:
    g_m picked out of the tile (no load that waits for m), the exponent masked to -inf before exp
    for the rejected tokens j >= m, whose weight is then exactly 0."""
    o_j = tl.arange(0, BJ)
    b_gm = tl.sum(tl.where(o_j == b_m - 1, b_pg, 0.0), axis=0)
    return tl.exp(b_gm), tl.exp(tl.where(o_j < b_m, b_gm - b_pg, float("-inf")))


@triton.jit
def _fold_tiles(b_s, b_decay, b_wz, b_pk, PIECES: tl.constexpr, WIDEN: tl.constexpr):
    """Eq. 7 on this program's BV rows of the state, the previous round's commit: S_m = e^{g_m} S +
    sum_{j < m} e^{g_m - g_j} z_j k_j^T as one [BV, BJ] x [BJ, BK] product of the weighted z
    (`_pending_weights`) and the k rows. PIECES (bf16 inputs, whose tolerance is that of bf16): the
    weighted z in two bf16 pieces (`_split_bf16`); k exact in bf16 (its raw rows, `raw_keys`) takes
    two exact bf16 tensor-core products, z_1 k + z_2 k, fp32 k two pieces as well and three
    products, z_1 k_1 + z_1 k_2 + z_2 k_1 (the dropped terms and the pieces' remainders are about
    2^-18 of each term); else tf32x3."""
    if PIECES:
        b_z1, b_z2, _ = _split_bf16(b_wz, 2)
        if b_pk.dtype == tl.bfloat16:
            if WIDEN:  # the interpreter: the same exact products, widened (`_dot_bt`)
                return b_decay * b_s + (_dot_bt(b_z1, tl.trans(b_pk), WIDEN) + _dot_bt(b_z2, tl.trans(b_pk), WIDEN))
            return tl.dot(b_z2, b_pk, acc=tl.dot(b_z1, b_pk, acc=b_decay * b_s))
        b_k1, b_k2, _ = _split_bf16(b_pk, 2)
        if WIDEN:
            return b_decay * b_s + (_dot_bt(b_z1, tl.trans(b_k1), WIDEN) + _dot_bt(b_z1, tl.trans(b_k2), WIDEN)
                                    + _dot_bt(b_z2, tl.trans(b_k1), WIDEN))
        # one accumulator chain: no adds outside the tensor cores (each warp has 8 tiles in flight)
        return tl.dot(b_z2, b_k1, acc=tl.dot(b_z1, b_k2, acc=tl.dot(b_z1, b_k1, acc=b_decay * b_s)))
    return tl.dot(b_wz, b_pk.to(tl.float32), acc=b_decay * b_s, input_precision="tf32x3")


@triton.jit
def _fold_rows(b_s, b_pz, b_pk, b_pg, b_m, BJ: tl.constexpr):
    """`_fold_tiles` by BJ rank-1 updates, for programs of fewer than 16 rows (tl.dot's smallest
    tile); token j's z and k rows are picked out of the tiles (sums of one value and zeros, exact),
    BJ = the previous round's length rounded up to a power of two."""
    o_j = tl.arange(0, BJ)
    b_decay, b_w = _pending_weights(b_pg, b_m, BJ)
    b_wz = b_pz * b_w[None, :]
    b_pk = b_pk.to(tl.float32)
    b_s = b_decay * b_s
    for j in tl.static_range(BJ):
        b_zj = tl.sum(tl.where(o_j[None, :] == j, b_wz, 0.0), axis=1)  # [BV]
        b_kj = tl.sum(tl.where(o_j[:, None] == j, b_pk, 0.0), axis=0)  # [BK]
        b_s += b_zj[:, None] * b_kj[None, :]
    return b_s


@triton.jit
def _gdn_verify_kernel(
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
    T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr,
    DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BKC: tl.constexpr, KEY_DOT: tl.constexpr, UNROLL: tl.constexpr,
    GATED: tl.constexpr, WRITE_K: tl.constexpr, EPS: tl.constexpr, USE_GDC: tl.constexpr,
    SOLVE_DOT: tl.constexpr, RAW_KEYS: tl.constexpr,
):
    """GATED: q, k are raw (normalised here through their row norms, which scale the products),
    g and beta hold the raw a and b (gates formed here from A_log, dt_bias); WRITE_K: the normalised
    k goes to k_out (by the dv block 0 program of the first value head of each key head); RAW_KEYS:
    k as given goes there instead, and z is stored as z_i / |k_i| (`gdn_verify_gated`'s raw_keys).
    USE_GDC: launched with programmatic dependent launch (`_launch_options`)."""
    if USE_GDC:
        _grid_dependency()
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    i_b, i_h = (i_bh // HV).to(tl.int64), i_bh % HV
    i_hk = i_h // GROUP  # key head of this value head
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < T, o_v < DV
    m_tv = m_t[:, None] & m_v[None, :]

    # gates [BT]; padded tokens get g = beta = 0 so that every row of theirs below is zero
    b_g = tl.load(g + i_b * stride_g_b + o_t * stride_g_t + i_h, mask=m_t, other=0).to(tl.float32)
    b_beta = tl.load(beta + i_b * stride_beta_b + o_t * stride_beta_t + i_h, mask=m_t,
                     other=0).to(tl.float32)
    if GATED:  # raw a, b -> g, beta
        b_g = tl.where(m_t, _log_decay(b_g, tl.load(A_log + i_h).to(tl.float32),
                                       tl.load(dt_bias + i_h).to(tl.float32)), 0.0)
        b_beta = tl.where(m_t, tl.sigmoid(b_beta), 0.0)
    b_gc = tl.cumsum(b_g, axis=0)  # g_i, cumulative log decay [BT]

    # K S_0^T, Q S_0^T [BT, BV] and k_i^T k_j, q_i^T k_j [BT, BT], accumulated over dk in BKC chunks
    # (UNROLL: a static loop, every chunk's loads in flight at once; else a pipelined loop)
    p_q = q + i_b * stride_q_b + o_t[:, None] * stride_q_t + i_hk * stride_q_h
    p_k = k + i_b * stride_k_b + o_t[:, None] * stride_k_t + i_hk * stride_k_h
    p_s = state + i_b * stride_s_b + i_h * stride_s_h + o_v[:, None] * stride_s_v
    b_ks = tl.zeros([BT, BV], dtype=tl.float32)
    b_qs = tl.zeros([BT, BV], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_q2 = tl.zeros([BT], dtype=tl.float32)
    b_k2 = tl.zeros([BT], dtype=tl.float32)
    q_scale = 1.0 if GATED else scale  # GATED: scale goes in with the norm below
    if UNROLL:
        for i_ku in tl.static_range(0, BK, BKC):  # loop names differ: triton 3.6 types them per scope
            b_ks, b_qs, b_kk, b_qk, b_q2, b_k2 = _key_products(
                p_q, p_k, p_s, i_ku, m_t, m_v, q_scale, b_ks, b_qs, b_kk, b_qk, b_q2, b_k2, DK, BKC, KEY_DOT, GATED)
    else:
        for i_kc in range(0, BK, BKC):
            b_ks, b_qs, b_kk, b_qk, b_q2, b_k2 = _key_products(
                p_q, p_k, p_s, i_kc, m_t, m_v, q_scale, b_ks, b_qs, b_kk, b_qk, b_q2, b_k2, DK, BKC, KEY_DOT, GATED)
    if GATED:  # q_i -> scale q_i / |q_i|, k_i -> k_i / |k_i|: rows and columns of the products
        r_q = scale * tl.rsqrt(b_q2 + EPS)  # [BT]
        r_k = tl.rsqrt(b_k2 + EPS)
        b_ks = b_ks * r_k[:, None]
        b_qs = b_qs * r_q[:, None]
        b_kk = b_kk * (r_k[:, None] * r_k[None, :])
        b_qk = b_qk * (r_q[:, None] * r_k[None, :])
        if WRITE_K:
            if (i_v == 0) & (i_h % GROUP == 0):
                p_ko = k_out + i_b * stride_ko_b + o_t[:, None] * stride_ko_t + i_hk * stride_ko_h
                for i_kw in range(0, BK, BKC):
                    o_k = i_kw + tl.arange(0, BKC)
                    m_tk = m_t[:, None] & (o_k < DK)[None, :]
                    b_k = tl.load(p_k + o_k[None, :], mask=m_tk, other=0).to(tl.float32)
                    if not RAW_KEYS:
                        b_k = b_k * r_k[:, None]
                    tl.store(p_ko + o_k[None, :], b_k.to(p_ko.dtype.element_ty), mask=m_tk)

    b_a, b_gamma, b_decay0 = _decays(b_gc, b_beta, b_kk, o_t)

    # Eq. 3: Z = H^-1 diag(beta) (V - diag(e^g) K S_0^T)
    p_v = v + i_b * stride_v_b + o_t[:, None] * stride_v_t + i_h * stride_v_h + o_v[None, :]
    b_v = tl.load(p_v, mask=m_tv, other=0).to(tl.float32)  # [BT, BV]
    b_rhs = b_beta[:, None] * (b_v - b_decay0 * b_ks)
    b_z = tl.dot(_inverse_unit_lower(b_a, T, BT, SOLVE_DOT), b_rhs, input_precision=SOLVE_DOT)  # [BT, BV]

    # Eq. 10: O = diag(e^g) Q S_0^T + (Gamma . Q K^T) Z   (q already scaled)
    b_o = b_decay0 * b_qs + tl.dot(b_gamma * b_qk, b_z, input_precision=SOLVE_DOT)  # [BT, BV]

    if RAW_KEYS:
        b_z = b_z * r_k[:, None]
    _store_outputs(o + i_b * stride_o_b + i_h * stride_o_h, z + i_b * stride_z_b + i_h * stride_z_h,
                   g_cum + i_b * stride_gc_b + i_h, b_o, b_z, b_gc, o_t, o_v, m_t, m_tv, i_v == 0,
                   stride_o_t, stride_z_t, stride_gc_t)


@triton.jit
def _dot_bt(b_a, b_b, WIDEN: tl.constexpr):
    """A B^T of two bf16 tiles, fp32 sums of exact products: a bf16 tensor-core product, or (WIDEN,
    under the interpreter, whose tl.dot multiplies bf16 tiles as raw 16-bit integers in triton 3.9)
    the same product of the values widened to fp32, exact as well."""
    if WIDEN:
        return tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), input_precision="ieee")
    return tl.dot(b_a, tl.trans(b_b))


@triton.jit
def _split_bf16(b_s, SPLIT: tl.constexpr):
    """fp32 S = S_1 + S_2 (+ S_3) in bf16 pieces, up to 2^-18 |S| (2^-27 with three) when the
    narrowing rounds to nearest as on GPUs (2^-16 and 2^-24 where it truncates, as the interpreter
    does); the remainders are exact in fp32. SPLIT = 2 returns S_2 twice (the third is unused)."""
    b_s1 = b_s.to(tl.bfloat16)
    b_r = b_s - b_s1.to(tl.float32)
    b_s2 = b_r.to(tl.bfloat16)
    if SPLIT == 3:
        return b_s1, b_s2, (b_r - b_s2.to(tl.float32)).to(tl.bfloat16)
    return b_s1, b_s2, b_s2


@triton.jit
def _split_dot(b_a, b_s1, b_s2, b_s3, SPLIT: tl.constexpr, WIDEN: tl.constexpr):
    """A S^T for bf16 A [BT, BK] (exact in bf16) and S = S_1 + S_2 (+ S_3) [BV, BK] in bf16 pieces
    (`_split_bf16`): each piece's product with A is exact in fp32, and the pieces' products are
    independent (no accumulator chain between them)."""
    b_out = _dot_bt(b_a, b_s1, WIDEN) + _dot_bt(b_a, b_s2, WIDEN)
    if SPLIT == 3:
        b_out += _dot_bt(b_a, b_s3, WIDEN)
    return b_out


@triton.jit
def _gdn_verify_split_kernel(
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
    SOLVE_DOT: tl.constexpr, SPLIT: tl.constexpr, WIDEN: tl.constexpr, FENCE: tl.constexpr,
    FOLD: tl.constexpr, BJ: tl.constexpr, RAW_KEYS: tl.constexpr, LATE_KEYS: tl.constexpr,
):
    """The blocked form (Eqs. 3, 10 by the short-solve identities, as `_gdn_verify_kernel`) ordered
    for latency: every input is loaded at the top (FENCE: every tile's first use after the last
    load, `_after`, so that all loads are in flight at once), the state-independent part (K K^T,
    Q K^T, gates, the inverse of H) comes first, and only then K S_0^T and Q S_0^T. Every dk-long
    product is one tl.dot over the whole key dimension. SPLIT (bf16 q and k, exact in bf16): K K^T
    and Q K^T are bf16 tensor-core products (exact products, fp32 sums) and S_0 is split into SPLIT
    bf16 pieces for the state products (`_split_dot`); SPLIT = 0 (fp32 q, k): tf32x3 products.
    The scale of q and the row norms (GATED) multiply the products' rows and columns afterwards.

    FOLD: the previous round's commit (Eq. 7) on these rows first (`_fold_tiles`), stored in place
    and verified from. RAW_KEYS (GATED): k_out receives k as loaded, after the outputs if LATE_KEYS
    (where the H200 measured that order faster), and z is stored as z_i / |k_i|."""
    if USE_GDC:
        _grid_dependency()
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
        b_pz, b_pk, b_pg, b_m = _pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                                               stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t,
                                               stride_pk_h, stride_pg_b, stride_pg_t, BJ)
    p_k = k + i_b * stride_k_b + o_t[:, None] * stride_k_t + i_hk * stride_k_h + o_k[None, :]
    p_q = q + i_b * stride_q_b + o_t[:, None] * stride_q_t + i_hk * stride_q_h + o_k[None, :]
    b_k = tl.load(p_k, mask=m_tk, other=0)  # [BT, BK], input dtype
    b_q = tl.load(p_q, mask=m_tk, other=0)
    if not SPLIT:
        b_k, b_q = b_k.to(tl.float32), b_q.to(tl.float32)
    p_v = v + i_b * stride_v_b + o_t[:, None] * stride_v_t + i_h * stride_v_h + o_v[None, :]
    b_v = tl.load(p_v, mask=m_tv, other=0)  # [BT, BV], input dtype
    b_g = tl.load(g + i_b * stride_g_b + o_t * stride_g_t + i_h, mask=m_t, other=0)
    b_beta = tl.load(beta + i_b * stride_beta_b + o_t * stride_beta_t + i_h, mask=m_t, other=0)
    if GATED:  # raw a, b -> g, beta; padded tokens keep g = beta = 0
        a_log, dt = tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32)
    if FENCE:  # every tile's first use after the last load, so that all loads are in flight at once
        dep = tl.load(beta + i_b * stride_beta_b + i_h).to(tl.float32)
        b_s = _after(b_s, dep, False)
        b_v = _after(b_v, dep, b_v.dtype == tl.bfloat16)
        b_k = _after(b_k, dep, b_k.dtype == tl.bfloat16)
        b_q = _after(b_q, dep, b_q.dtype == tl.bfloat16)
        b_g = _after(b_g, dep, b_g.dtype == tl.bfloat16)
        b_beta = _after(b_beta, dep, b_beta.dtype == tl.bfloat16)
        if FOLD:
            b_pz, b_pg = _after(b_pz, dep, False), _after(b_pg, dep, False)
            b_pk = _after(b_pk, dep, b_pk.dtype == tl.bfloat16)
            b_m = _after(b_m.to(tl.float32, bitcast=True), dep, False).to(tl.int32, bitcast=True)
    b_v, b_g, b_beta = b_v.to(tl.float32), b_g.to(tl.float32), b_beta.to(tl.float32)
    if GATED:
        b_g = tl.where(m_t, _log_decay(b_g, a_log, dt), 0.0)
        b_beta = tl.where(m_t, tl.sigmoid(b_beta), 0.0)
    b_gc = tl.cumsum(b_g, axis=0)

    # state-independent: K K^T, Q K^T [BT, BT]
    if SPLIT:
        b_kk = _dot_bt(b_k, b_k, WIDEN)
        b_qk = _dot_bt(b_q, b_k, WIDEN)
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
    b_a, b_gamma, b_decay0 = _decays(b_gc, b_beta, b_kk, o_t)
    b_inv = _inverse_unit_lower(b_a, T, BT, SOLVE_DOT)
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
        b_pdecay, b_pw = _pending_weights(b_pg, b_m, BJ)
        b_s = _fold_tiles(b_s, b_pdecay, b_pz * b_pw[None, :], b_pk, SPLIT != 0, WIDEN)
        tl.store(p_s, b_s, mask=m_v[:, None] & m_k[None, :])

    # K S_0^T, Q S_0^T [BT, BV]
    if SPLIT:
        b_s1, b_s2, b_s3 = _split_bf16(b_s, SPLIT)
        b_ks = _split_dot(b_k, b_s1, b_s2, b_s3, SPLIT, WIDEN)
        b_qs = _split_dot(b_q, b_s1, b_s2, b_s3, SPLIT, WIDEN)
    else:
        b_ks = tl.dot(b_k, tl.trans(b_s), input_precision="tf32x3")
        b_qs = tl.dot(b_q, tl.trans(b_s), input_precision="tf32x3")
    b_ks = b_ks * r_k[:, None]
    b_qs = b_qs * r_q[:, None]

    # Eq. 3: Z = H^-1 diag(beta) (V - diag(e^g) K S_0^T); Eq. 10: O = diag(e^g) Q S_0^T + (Gamma . Q K^T) Z
    b_z = tl.dot(b_inv, b_beta[:, None] * (b_v - b_decay0 * b_ks), input_precision=SOLVE_DOT)
    b_o = b_decay0 * b_qs + tl.dot(b_gqk, b_z, input_precision=SOLVE_DOT)

    if RAW_KEYS:  # the pair (z_i / |k_i|, k_i) has the outer product z_i k_i^T / |k_i|
        b_z = b_z * r_k[:, None]
    _store_outputs(o + i_b * stride_o_b + i_h * stride_o_h, z + i_b * stride_z_b + i_h * stride_z_h,
                   g_cum + i_b * stride_gc_b + i_h, b_o, b_z, b_gc, o_t, o_v, m_t, m_tv, i_v == 0,
                   stride_o_t, stride_z_t, stride_gc_t)
    if WRITE_K and RAW_KEYS and LATE_KEYS:
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + o_t[:, None] * stride_ko_t + i_hk * stride_ko_h + o_k[None, :]
            tl.store(p_ko, b_k.to(p_ko.dtype.element_ty), mask=m_tk)


@triton.jit
def _gdn_verify_recurrent_kernel(
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
    GATED: tl.constexpr, WRITE_K: tl.constexpr, EPS: tl.constexpr, PREFETCH: tl.constexpr,
    USE_GDC: tl.constexpr, FOLD: tl.constexpr, BJ: tl.constexpr, RAW_KEYS: tl.constexpr,
):
    """Eq. 3 by forward substitution in state space, the same z, o and g_cum as the blocked kernel.

    A program keeps BV rows of the running state S_{i-1} in registers (never written back) and, per
    token, z_i = beta_i (v_i - e^{gamma_i} S_{i-1} k_i), S_i = e^{gamma_i} S_{i-1} + z_i k_i^T,
    o_i = S_i q_i: two dk-long reductions per token, no T x T algebra and no padding to 16 tokens.
    The outputs are gathered into [BV, BT] tiles and stored once after the token loop.
    PREFETCH: load every token's q, k, v and gates as [BT, .] tiles before the token loop and form
    the norms and gates of all tokens at once, so the loop's chain is the state arithmetic alone.
    Without it each token's loads are issued inside the loop, and on the H200 the loop waits about
    one load latency per token (bench/results/gdn_kernels_notes.md). GATED, WRITE_K and RAW_KEYS as
    in `_gdn_verify_split_kernel`."""
    if USE_GDC:
        _grid_dependency()
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
        b_pz, b_pk, b_pg, b_m = _pending_tiles(pz, pk, pg, accepted, i_b, i_h, i_hk, o_v, o_k, m_v, m_k, PT,
                                               stride_pz_b, stride_pz_t, stride_pz_h, stride_pk_b, stride_pk_t,
                                               stride_pk_h, stride_pg_b, stride_pg_t, BJ)
    p_q = q + i_b * stride_q_b + i_hk * stride_q_h + o_k
    p_k = k + i_b * stride_k_b + i_hk * stride_k_h + o_k
    p_v = v + i_b * stride_v_b + i_h * stride_v_h + o_v
    p_g = g + i_b * stride_g_b + i_h
    p_beta = beta + i_b * stride_beta_b + i_h

    b_o = tl.zeros([BV, BT], dtype=tl.float32)  # column i: o_i restricted to rows o_v
    b_z = tl.zeros([BV, BT], dtype=tl.float32)
    b_gc = tl.zeros([BT], dtype=tl.float32)
    r_K = tl.full([BT], 1.0, tl.float32)  # 1 / |k_i| (GATED)
    g_i = 0.0
    if GATED:
        a_log, dt = tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32)
    m_tk = m_t[:, None] & m_k[None, :]
    if PREFETCH:  # every token's inputs at once: [BT, BK] rows of q, k; [BV, BT] of v; [BT] gates
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
            b_G = _log_decay(b_G, a_log, dt)
            b_B = tl.sigmoid(b_B)
        else:
            b_Q = b_Q * scale
    if FOLD:  # the previous round's commit (Eq. 7) on these rows, stored in place: S_0 of this round
        b_s = _fold_rows(b_s, b_pz, b_pk, b_pg, b_m, BJ)
        tl.store(p_s, b_s, mask=m_vk)
    for i in tl.static_range(T):
        if PREFETCH:  # row i of the tiles (sums of one value and zeros: exact)
            b_k = tl.sum(tl.where(o_t[:, None] == i, b_K, 0.0), axis=0)  # k_i [BK]
            b_q = tl.sum(tl.where(o_t[:, None] == i, b_Q, 0.0), axis=0)
            b_vi = tl.sum(tl.where(o_t[None, :] == i, b_V, 0.0), axis=1)  # v_i [BV]
            gamma = tl.sum(tl.where(o_t == i, b_G, 0.0), axis=0)
            b_beta = tl.sum(tl.where(o_t == i, b_B, 0.0), axis=0)
        else:
            b_k = tl.load(p_k + i * stride_k_t, mask=m_k, other=0).to(tl.float32)  # k_i [BK]
            b_q = tl.load(p_q + i * stride_q_t, mask=m_k, other=0).to(tl.float32)
            b_vi = tl.load(p_v + i * stride_v_t, mask=m_v, other=0).to(tl.float32)  # v_i [BV]
            gamma = tl.load(p_g + i * stride_g_t).to(tl.float32)
            b_beta = tl.load(p_beta + i * stride_beta_t).to(tl.float32)
            if GATED:  # raw rows and gates
                r_ki = tl.rsqrt(tl.sum(b_k * b_k, axis=0) + EPS)
                r_K = tl.where(o_t == i, r_ki, r_K)
                b_k = b_k * r_ki
                b_q = b_q * (scale * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + EPS))
                gamma = _log_decay(gamma, a_log, dt)
                b_beta = tl.sigmoid(b_beta)
            else:
                b_q = b_q * scale
        g_i += gamma
        b_s = b_s * tl.exp(gamma)
        b_zi = b_beta * (b_vi - tl.sum(b_s * b_k[None, :], axis=1))  # [BV]
        b_s += b_zi[:, None] * b_k[None, :]
        b_oi = tl.sum(b_s * b_q[None, :], axis=1)  # [BV]
        b_z = tl.where(o_t[None, :] == i, b_zi[:, None], b_z)
        b_o = tl.where(o_t[None, :] == i, b_oi[:, None], b_o)
        b_gc = tl.where(o_t == i, g_i, b_gc)

    m_vt = m_v[:, None] & m_t[None, :]
    p_o = o + i_b * stride_o_b + o_t[None, :] * stride_o_t + i_h * stride_o_h + o_v[:, None]
    p_z = z + i_b * stride_z_b + o_t[None, :] * stride_z_t + i_h * stride_z_h + o_v[:, None]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_vt)
    if RAW_KEYS:  # the pair (z_i / |k_i|, k_i) has the outer product z_i k_i^T / |k_i|
        b_z = b_z * r_K[None, :]
    tl.store(p_z, b_z, mask=m_vt)
    if i_v == 0:
        tl.store(g_cum + i_b * stride_gc_b + o_t * stride_gc_t + i_h, b_gc, mask=m_t)
    if WRITE_K:
        if (i_v == 0) & (i_h % GROUP == 0):
            p_ko = k_out + i_b * stride_ko_b + i_hk * stride_ko_h + o_k
            if RAW_KEYS:
                if not PREFETCH:  # k as given, reloaded (in cache; PREFETCH stored it on arrival)
                    b_kr = tl.load(p_k + o_t[:, None] * stride_k_t, mask=m_tk, other=0)
                    tl.store(p_ko + o_t[:, None] * stride_ko_t, b_kr.to(p_ko.dtype.element_ty), mask=m_tk)
            elif PREFETCH:
                tl.store(p_ko + o_t[:, None] * stride_ko_t, b_K.to(p_ko.dtype.element_ty), mask=m_tk)
            else:
                _store_normalised_rows(p_k, p_ko, stride_k_t, stride_ko_t, m_k, T, EPS)


@triton.jit
def _store_normalised_rows(p_k, p_ko, stride_k_t, stride_ko_t, m_k, T: tl.constexpr, EPS: tl.constexpr):
    """k_out rows i < T: k_i / |k_i| (the recurrent kernel without PREFETCH)."""
    for i in tl.static_range(T):
        b_k = tl.load(p_k + i * stride_k_t, mask=m_k, other=0).to(tl.float32)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + EPS)
        tl.store(p_ko + i * stride_ko_t, b_k.to(p_ko.dtype.element_ty), mask=m_k)


@triton.jit
def _gdn_commit_kernel(
    states, z, k, g_cum, accepted, batch,
    stride_s_l, stride_s_b, stride_s_h, stride_s_v,
    stride_z_l, stride_z_b, stride_z_t, stride_z_h,
    stride_k_l, stride_k_b, stride_k_t, stride_k_h,
    stride_gc_l, stride_gc_b, stride_gc_t,
    T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, UNROLL: tl.constexpr, USE_GDC: tl.constexpr,
    DOT: tl.constexpr, BT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """DOT: the m rank-1 updates as one [BV, BT] x [BT, BK] product of the weighted z columns and
    the k rows, every token's loads issued at once (tokens >= m masked to zero); else UNROLL (a
    static loop over the T tokens, masked beyond m) or a loop over the m tokens."""
    if USE_GDC:
        _grid_dependency()
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

    # Eq. 7: S_m = e^{g_m} S_0 + sum_{j<=m} e^{g_m - g_j} z_j k_j^T (rank-1 updates, only the m
    # committed tokens: g_m - g_j <= 0 for j <= m, so no exponent is positive); rows o_v, in place
    b_s = tl.exp(b_gm) * b_s
    if DOT:
        o_t = tl.arange(0, BT)
        m_j = o_t < b_m  # committed tokens j < m
        b_w = tl.where(m_j, tl.exp(b_gm - tl.load(p_gc + o_t * stride_gc_t, mask=m_j, other=0)), 0.0)  # [BT]
        b_wz = tl.load(p_z[:, None] + o_t[None, :] * stride_z_t, mask=m_v[:, None] & m_j[None, :],
                       other=0).to(tl.float32) * b_w[None, :]  # e^{g_m - g_j} z_j as columns [BV, BT]
        b_kt = tl.load(p_k[None, :] + o_t[:, None] * stride_k_t, mask=m_j[:, None] & m_k[None, :],
                       other=0).to(tl.float32)  # k_j as rows [BT, BK]
        b_s = tl.dot(b_wz, b_kt, acc=b_s, input_precision=DOT_PRECISION)
    elif UNROLL:  # every token's loads in flight at once; tokens beyond m are masked to zero
        for j in tl.static_range(T):
            i_j = tl.minimum(j, b_m - 1)  # tokens beyond m re-read token m (cached) with weight 0
            b_w = tl.where(j < b_m, tl.exp(b_gm - tl.load(p_gc + i_j * stride_gc_t)), 0.0)  # e^{g_m - g_j}
            b_wz = tl.load(p_z + i_j * stride_z_t, mask=m_v, other=0).to(tl.float32) * b_w  # [BV]
            b_kj = tl.load(p_k + i_j * stride_k_t, mask=m_k, other=0).to(tl.float32)  # k_j [BK]
            b_s += b_wz[:, None] * b_kj[None, :]
    else:
        for jr in range(0, b_m):  # not j: the static loop's j is a constexpr (triton 3.6)
            b_wz = tl.load(p_z + jr * stride_z_t, mask=m_v, other=0).to(tl.float32) * tl.exp(
                b_gm - tl.load(p_gc + jr * stride_gc_t))  # e^{g_m - g_j} z_j [BV]
            b_kj = tl.load(p_k + jr * stride_k_t, mask=m_k, other=0).to(tl.float32)  # k_j [BK]
            b_s += b_wz[:, None] * b_kj[None, :]
    tl.store(p_s, b_s, mask=m_s)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


@functools.cache
def _interpreted() -> bool:
    """The kernels run under TRITON_INTERPRET=1 (set before this module was imported): fixed at
    import, so looked up once, not at every launch of the decoding round."""
    return type(_gdn_verify_kernel).__name__ == "InterpretedFunction"


def _check_dtype(fn: str, name: str, x: Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if x.dtype not in allowed:
        raise ValueError(f"{fn}: {name} has dtype {x.dtype}, expected one of {list(allowed)}")


def _check_layout(fn: str, tensors: dict[str, Tensor]) -> None:
    """Same device for all (CUDA, or CPU under TRITON_INTERPRET=1); last dim contiguous."""
    names = list(tensors)
    device = tensors[names[0]].device
    for name, x in tensors.items():
        if x.device != device:
            raise ValueError(f"{fn}: {name} is on {x.device}, expected {device} like {names[0]}")
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(f"{fn}: {name} has strides {tuple(x.stride())}, "
                             "expected a contiguous last dimension (stride 1)")
    if device.type != "cuda" and not _interpreted():
        raise ValueError(f"{fn}: tensors are on {device}; the Triton kernels need CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")


def _check_sizes(fn: str, T: int, dk: int) -> None:
    if T > MAX_TOKENS:
        raise ValueError(f"{fn}: T={T} tokens, the Triton kernels take at most {MAX_TOKENS} "
                         "(use the reference for longer prefill chunks)")
    if dk > MAX_KEY_DIM:
        raise ValueError(f"{fn}: dk={dk}, the Triton kernels take at most {MAX_KEY_DIM}")


@dataclass(frozen=True, slots=True)
class VerifyTuning:
    """Launch parameters of `_gdn_verify_kernel` (bench/gdn_tuning.py sweeps them on the GPU)."""

    block_v: int = 16  # value rows of S_0 per program: grid (B * HV, dv / block_v)
    block_k: int = 16  # dk chunk of the key products (bounds the registers of the FMA products)
    num_warps: int = 2
    key_dot: str = "ieee"  # blocked: precision of the dk-long products, "ieee" (fp32 FMA) or "tf32x3"
    unroll: bool = False  # a static loop over the dk chunks instead of a (software-pipelined) loop
    num_stages: int = 3
    # "blocked": Eq. 3 by the short-solve identities over tokens padded to 16 (tensor-core products);
    # "recurrent": forward substitution in state space per token (block_k, key_dot, unroll unused);
    # "split": the blocked form ordered for latency, one product over dk, S_0 split into `split`
    # bf16 pieces when q, k are bf16 (tf32x3 for fp32 inputs; block_k, key_dot, unroll unused)
    method: str = "blocked"
    # recurrent only: every token's inputs loaded before the token loop (PREFETCH of the kernel)
    prefetch: bool = False
    # programmatic dependent launch on SM90+ (`_launch_options`); ignored elsewhere
    pdl: bool = False
    # blocked and split: precision of the 16 x 16 products of the solve and the outputs (ieee or tf32x3)
    solve_dot: str = "ieee"
    split: int = 3  # split only: bf16 pieces of S_0 (2: 2^-18 relative, 3: 2^-27)
    # split only: every tile's first use after the last load (`_after`), so that all loads are in
    # flight at once (compiled kernels only)
    fence: bool = False
    # split with raw_keys: k's copy to k_out after the outputs instead of with the solve
    late_keys: bool = False

    def __post_init__(self):
        if self.key_dot not in ("ieee", "tf32x3", "tf32"):
            raise ValueError(f"VerifyTuning: key_dot={self.key_dot!r}, expected ieee, tf32x3 or tf32")
        if self.solve_dot not in ("ieee", "tf32x3"):
            raise ValueError(f"VerifyTuning: solve_dot={self.solve_dot!r}, expected ieee or tf32x3")
        if self.method not in ("blocked", "recurrent", "split"):
            raise ValueError(f"VerifyTuning: method={self.method!r}, expected blocked, recurrent or split")
        if self.split not in (2, 3):
            raise ValueError(f"VerifyTuning: split={self.split}, expected 2 or 3 bf16 pieces")
        if self.late_keys and self.method != "split":
            raise ValueError(f"VerifyTuning: late_keys with method {self.method!r}, only the split kernel has it")
        for name in ("block_v", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"VerifyTuning: {name}={value} is not a power of two")


@dataclass(frozen=True, slots=True)
class CommitTuning:
    block_v: int = 32  # value rows per program: grid (L * B * HV, dv / block_v)
    num_warps: int = 4
    unroll: bool = False  # a static loop over the T tokens (masked beyond m) instead of a loop over m
    pdl: bool = False  # programmatic dependent launch on SM90+ (`_launch_options`); ignored elsewhere
    # "loop": m rank-1 updates (unroll as above); "dot": one [block_v, 16] x [16, dk] product of all
    # tokens' factors, loaded at once (block_v >= 16, the smallest tl.dot tile)
    method: str = "loop"
    key_dot: str = "tf32x3"  # dot only: "ieee" (fp32 FMA), "tf32x3" (tensor cores, about fp32)

    def __post_init__(self):
        if self.method not in ("loop", "dot"):
            raise ValueError(f"CommitTuning: method={self.method!r}, expected loop or dot")
        if self.key_dot not in ("ieee", "tf32x3"):
            raise ValueError(f"CommitTuning: key_dot={self.key_dot!r}, expected ieee or tf32x3")
        for name in ("block_v", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"CommitTuning: {name}={value} is not a power of two")
        if self.method == "dot" and self.block_v < 16:
            raise ValueError(f"CommitTuning: block_v={self.block_v} with method dot, expected at least 16")


# Per verification length T (1..16), the fastest passing variant on the H200 of the round the runtime
# runs, each verify folding the previous round's commit from raw-key factors (bench/gdn_fold_sweep.py,
# bench/results/gdn_fold_sweep.md, 2026-12-02, eighth session; shapes: seventh session; the verify
# alone: bench/results/gdn_tuning_split.md): up to T = 4 forward substitution in state space with
# every token's inputs loaded first, one warp per program and programmatic dependent launch, 8 value
# rows at T = 2 and 4 from T = 3 (106.4 us per fused round of 30 layers at T = 2, 125.2 at T = 3,
# 131.0 at T = 4); from T = 5 the split kernel, 32 value rows and 4 warps per program, S_0 in two
# bf16 pieces, all loads in flight at once (157.7 us at T = 6, 158.8 at T = 16), from T = 7 to 12
# with the raw keys' copy after the outputs (147.4 us at T = 8, 158.8 at T = 12; 150.6 and 161.4
# with it before, but 174.2 at T = 16); a length between the measured ones takes the next measured
# length's choice.
_PREFETCH = VerifyTuning(num_warps=1, num_stages=1, method="recurrent", prefetch=True, pdl=True)
_SPLIT = VerifyTuning(block_v=32, num_warps=4, num_stages=1, method="split", split=2, fence=True, pdl=True)
_MEASURED = {2: dataclasses.replace(_PREFETCH, block_v=8), 4: dataclasses.replace(_PREFETCH, block_v=4),
             6: _SPLIT, 8: dataclasses.replace(_SPLIT, late_keys=True), 12: dataclasses.replace(_SPLIT, late_keys=True),
             16: _SPLIT}
VERIFY_TUNING: dict[int, VerifyTuning] = {
    T: _MEASURED[min(t for t in _MEASURED if t >= T)] for T in range(1, MAX_TOKENS + 1)}
# Per window length T (the round buffers' length; m is read on the device): one tensor-core product
# of all tokens' factors (40.3 us for 30 layers at m = 16, the rank-1 loop 67.1), the loop up to
# T = 4, where whole rounds measured it 1-4 us faster (bench/gdn_round_parts.py). Neither with PDL:
# behind the PDL verify launches a PDL commit cost the round 77 us at w = 16.
COMMIT_TUNING: dict[int, CommitTuning] = {
    T: CommitTuning(block_v=16, num_warps=1) if T <= 4 else CommitTuning(block_v=16, num_warps=4, method="dot")
    for T in range(1, MAX_TOKENS + 1)}


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _launch_options(pdl: bool, x: Tensor) -> dict:
    """Launch with programmatic dependent launch where asked for and possible: a CUDA device of
    compute capability 9 or higher, compiled (the interpreter cannot run the kernels' inline PTX).
    The capability is looked up once per device, not at every launch of the decoding round."""
    if pdl and x.is_cuda and not _interpreted() and _pdl_capable(x.device.index):
        return dict(USE_GDC=True, launch_pdl=True)
    return dict(USE_GDC=False)


def _key_block(dk: int) -> int:
    return max(16, triton.next_power_of_2(dk))


def _fold_args(state: Tensor, pending) -> tuple:
    """The kernels' pending-commit arguments: (z, k, g_cum, accepted, T') and their strides, or
    placeholders (T' = 0) without a pending commit."""
    if pending is None:
        return (state, state, state, state, 0, *(0,) * 8)
    z_p, k_p, g_p, accepted = pending
    return (z_p, k_p, g_p, accepted, z_p.shape[1], *z_p.stride()[:3], *k_p.stride()[:3], *g_p.stride()[:2])


def _launch_verify(q, k, v, g, beta, state, scale, o, z, g_cum, tuning: VerifyTuning, *, gates=None,
                   k_out=None, pending=None, raw_keys=False) -> None:
    """gates = (A_log, dt_bias): q, k are raw and g, beta hold the raw a, b (`gdn_verify_gated`);
    pending = (z, k, g_cum, accepted) of the previous round (T' <= 16 tokens), committed into state
    first: inside the split and recurrent kernels, by a one-layer `gdn_commit` before the blocked one."""
    B, T, HK, _ = q.shape
    HV, dv, dk = v.shape[2], v.shape[3], q.shape[3]
    if raw_keys and gates is None:
        raise ValueError("raw_keys needs the raw projections (gates): the key norms are formed in the kernel")
    if pending is not None and tuning.method == "blocked":
        z_p, k_p, g_p, accepted = pending
        _launch_commit(state[None], z_p[None], k_p[None], g_p[None], accepted, COMMIT_TUNING[z_p.shape[1]])
        pending = None
    grid = (B * HV, triton.cdiv(dv, tuning.block_v))
    A_log, dt_bias = gates if gates is not None else (g, g)  # unused pointers when not gated
    k_store = k_out if k_out is not None else k
    args = (q, k, v, g, beta, state, o, z, g_cum, float(scale), A_log, dt_bias, k_store,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g.stride()[:2], *beta.stride()[:2],
            *state.stride()[:3], *o.stride()[:3], *z.stride()[:3], *g_cum.stride()[:2], *k_store.stride()[:3])
    shape = dict(T=T, HV=HV, GROUP=HV // HK, DK=dk, DV=dv, BK=_key_block(dk), BV=tuning.block_v,
                 GATED=gates is not None, WRITE_K=k_out is not None, EPS=L2_EPS, RAW_KEYS=raw_keys)
    fold = _fold_args(state, pending)
    pt = fold[4]  # T' of the pending commit, 0 without one
    if tuning.method == "recurrent":
        _gdn_verify_recurrent_kernel[grid](*args, *fold, **shape, BT=triton.next_power_of_2(T),
                                           PREFETCH=tuning.prefetch, FOLD=pending is not None,
                                           BJ=triton.next_power_of_2(max(pt, 1)),
                                           num_warps=tuning.num_warps, num_stages=tuning.num_stages,
                                           **_launch_options(tuning.pdl, state))
        return
    if tuning.method == "split":
        _gdn_verify_split_kernel[grid](*args, *fold, **shape, BT=BLOCK_T, SOLVE_DOT=tuning.solve_dot,
                                       FOLD=pending is not None, BJ=max(BLOCK_T, triton.next_power_of_2(pt)),
                                       LATE_KEYS=tuning.late_keys,
                                       SPLIT=tuning.split if q.dtype == k.dtype == torch.bfloat16 else 0,
                                       WIDEN=_interpreted(), FENCE=tuning.fence and not _interpreted(),
                                       num_warps=tuning.num_warps, num_stages=tuning.num_stages,
                                       **_launch_options(tuning.pdl, state))
        return
    _gdn_verify_kernel[grid](*args, **shape, BT=BLOCK_T, BKC=min(tuning.block_k, _key_block(dk)),
                             KEY_DOT=tuning.key_dot, UNROLL=tuning.unroll, SOLVE_DOT=tuning.solve_dot,
                             num_warps=tuning.num_warps,
                             num_stages=tuning.num_stages, **_launch_options(tuning.pdl, state))


def _launch_commit(states, z, k, g_cum, accepted, tuning: CommitTuning) -> None:
    L, B, HV, dv, dk = states.shape
    grid = (L * B * HV, triton.cdiv(dv, tuning.block_v))
    _gdn_commit_kernel[grid](
        states, z, k, g_cum, accepted, B,
        *states.stride()[:4], *z.stride()[:4], *k.stride()[:4], *g_cum.stride()[:3],
        T=z.shape[2], HV=HV, GROUP=HV // k.shape[3], DK=dk, DV=dv, BK=_key_block(dk), BV=tuning.block_v,
        UNROLL=tuning.unroll, num_warps=tuning.num_warps, **_launch_options(tuning.pdl, states),
        DOT=tuning.method == "dot", BT=max(BLOCK_T, triton.next_power_of_2(z.shape[2])), DOT_PRECISION=tuning.key_dot,
    )


def gdn_verify(q, k, v, g, beta, state, scale, *, z_out=None, g_out=None) -> tuple[Tensor, Tensor, Tensor]:
    """Triton `reference.gdn_verify`: Eq. 3 and Eq. 10 for T <= 16 tokens, one launch.

    q, k [B, T, HK, dk] (L2-normalised) and v [B, T, HV, dv] in bf16 or fp32; g (log decay <= 0),
    beta [B, T, HV] bf16 or fp32; state S_0 [B, HV, dv, dk] fp32 (not modified); scale multiplies q.
    Returns o [B, T, HV, dv] in v.dtype, z [B, T, HV, dv] fp32 and g_cum [B, T, HV] fp32. When given,
    z_out [B, T, HV, dv] and g_out [B, T, HV] (fp32, any strides with a contiguous last dim, e.g.
    `buf[slot, :, :T]`) are written in place and returned as z and g_cum.
    """
    fn = "gdn_verify"
    B, T, HK, HV, dk, dv = _check_step_inputs(fn, q, k, v, g, beta, state)
    _check_factor_outputs(fn, z_out, g_out, (B, T, HV, dv))
    _check_sizes(fn, T, dk)
    for name, x in dict(q=q, k=k, v=v, g=g, beta=beta).items():
        _check_dtype(fn, name, x, INPUT_DTYPES)
    o = torch.empty(B, T, HV, dv, dtype=v.dtype, device=v.device)  # [B, T, HV, dv]
    z = z_out if z_out is not None else torch.empty(B, T, HV, dv, device=v.device)
    g_cum = g_out if g_out is not None else torch.empty(B, T, HV, device=v.device)
    _check_layout(fn, dict(q=q, k=k, v=v, g=g, beta=beta, state=state, z_out=z, g_out=g_cum))

    _launch_verify(q, k, v, g, beta, state, scale, o, z, g_cum, VERIFY_TUNING.get(T, VerifyTuning()))
    return o, z, g_cum


def gdn_verify_gated(q, k, v, a, b, A_log, dt_bias, state, scale, *, z_out=None, g_out=None,
                     k_out=None, pending=None, raw_keys=False) -> tuple[Tensor, Tensor, Tensor]:
    """Triton `reference.gdn_verify_gated`: `gdn_verify` from the raw projections in the same launch,
    the L2 norms of q and k and the gates g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
    formed inside the kernel. q, k [B, T, HK, dk] raw, v [B, T, HV, dv], a, b [B, T, HV] in bf16 or
    fp32; A_log, dt_bias [HV] any float dtype; k_out [B, T, HK, dk] (when given) receives the
    normalised k (the raw k with raw_keys, below); the rest as `gdn_verify`. raw_keys: the factors
    (z_i / |k_i|, k_i) instead, k_out receiving k as given (k's dtype, exact) and z the scaled z
    (`reference.gdn_verify_gated`).

    pending = (z [B, T', HV, dv], k [B, T', HK, dk] bf16 or fp32, g_cum [B, T', HV] fp32,
    accepted [B] long): the previous round's factors of this layer and its m, read on the device.
    Its commit (Eq. 7) is applied to `state` in place in the same launch, each program folding its
    own rows before it verifies from them, so the round costs no separate commit launch and no
    second read of the state. T' > 16 (a long prefill chunk) is committed by the reference first."""
    fn = "gdn_verify_gated"
    B, T, HK, HV, dk, dv = _check_gated_inputs(fn, q, k, v, a, b, A_log, dt_bias, state, k_out)
    _check_factor_outputs(fn, z_out, g_out, (B, T, HV, dv))
    _check_sizes(fn, T, dk)
    for name, x in dict(q=q, k=k, v=v, a=a, b=b).items():
        _check_dtype(fn, name, x, INPUT_DTYPES)
    o = torch.empty(B, T, HV, dv, dtype=v.dtype, device=v.device)
    z = z_out if z_out is not None else torch.empty(B, T, HV, dv, device=v.device)
    g_cum = g_out if g_out is not None else torch.empty(B, T, HV, device=v.device)
    tensors = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, z_out=z, g_out=g_cum)
    if pending is not None:
        check_pending(fn, state, pending)
        _check_dtype(fn, "pending z", pending[0], INPUT_DTYPES)
        _check_dtype(fn, "pending k", pending[1], INPUT_DTYPES)
        _check_dtype(fn, "pending g_cum", pending[2], (torch.float32,))
        tensors.update(pending_z=pending[0], pending_k=pending[1], pending_g_cum=pending[2],
                       accepted=pending[3])
    _check_layout(fn, tensors if k_out is None else dict(tensors, k_out=k_out))
    _check_raw_keys(fn, k, k_out, raw_keys)
    if pending is not None and pending[0].shape[1] > MAX_TOKENS:
        reference_commit(state[None], *(x[None] for x in pending[:3]), pending[3])
        pending = None

    _launch_verify(q, k, v, a, b, state, scale, o, z, g_cum, VERIFY_TUNING.get(T, VerifyTuning()),
                   gates=(A_log, dt_bias), k_out=k_out, pending=pending, raw_keys=raw_keys)
    return o, z, g_cum


def gdn_commit(states, z, k, g_cum, accepted) -> None:
    """Triton `reference.gdn_commit`: the accepted state of every layer by Eq. 7, one launch.

    states [L, B, HV, dv, dk] fp32 holds S_0 of every layer and is overwritten with S_m in place
    (any strides with a contiguous last dim, e.g. the runtime's cache); z [L, B, T, HV, dv] and
    k [L, B, T, HK, dk] bf16 or fp32, g_cum [L, B, T, HV] fp32 are the factors of `gdn_verify`
    (T <= 16); accepted [B] long is m per sequence (1 <= m <= T), read on the device: no host
    synchronisation (range-checked only when it already lives on the CPU).
    """
    fn = "gdn_commit"
    _check_commit_inputs(states, z, k, g_cum, accepted)
    T, dk = z.shape[2], states.shape[4]
    _check_sizes(fn, T, dk)
    _check_dtype(fn, "z", z, INPUT_DTYPES)
    _check_dtype(fn, "k", k, INPUT_DTYPES)
    _check_dtype(fn, "g_cum", g_cum, (torch.float32,))
    _check_layout(fn, dict(states=states, z=z, k=k, g_cum=g_cum, accepted=accepted))

    _launch_commit(states, z, k, g_cum, accepted, COMMIT_TUNING[T])
