"""Eq. 5 and Eq. 6 in one single-program launch, the same operations as the policies' torch form.

Inputs live on the device (draft confidences and entropies, the artifact's tables, Stage 0's
Layer-0 expert ids, the round's remaining budget); the outputs are written to the round's buffers
`w0`, `w_c` and `w` = min(w_c, w_rem), and p̂ to `p_hat`. Recurrences (the entropy smoothing, the
prefix product, the expected-token sum) run in position order as the torch form does on the host,
so their roundings are the same; the logistic dot product, the sigmoid and log(1 + x) may differ
from torch's by an ulp, so a choice can differ from the torch form's only where two lengths score
equal to float precision (any length emits the same tokens). Eq. 6 runs in float64, in the order of
`HybridSpecPolicy.added_latency`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import check_device



@triton.jit
def _pick(values, index, offsets):
    """values[index] of a 1-D block (exact: one term of a sum of zeros)."""
    return tl.sum(tl.where(offsets == index, values, tl.zeros_like(values)), axis=0)


@triton.jit
def _select_kernel(conf_ptr, ent_ptr, iso_x_ptr, iso_y_ptr, coef_ptr, lengths_ptr, cost_ptr, rho,
                   ids_ptr, cost64_ptr, nbar_all_ptr, nbar_cond_ptr, scalars_ptr, w_rem_ptr,
                   p_hat_ptr, w0_ptr, w_c_ptr, w_ptr,
                   D: tl.constexpr, K: tl.constexpr, L: tl.constexpr, W: tl.constexpr, TOPK: tl.constexpr,
                   NCOND: tl.constexpr, CORRECT: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
                   BL: tl.constexpr, BW: tl.constexpr, BT: tl.constexpr, EPS: tl.constexpr):
    o_d = tl.arange(0, BD)
    d_ok = o_d < D
    conf = tl.load(conf_ptr + o_d, mask=d_ok, other=0.0).to(tl.float32)
    ent = tl.load(ent_ptr + o_d, mask=d_ok, other=0.0).to(tl.float32)
    # isotonic calibration: clip to the row's ends, find the span (searchsorted, right), interpolate
    o_k = tl.arange(0, BK)
    tile_ok = d_ok[:, None] & (o_k < K)[None, :]
    xp = tl.load(iso_x_ptr + o_d[:, None] * K + o_k[None, :], mask=tile_ok, other=0.0)
    fp = tl.load(iso_y_ptr + o_d[:, None] * K + o_k[None, :], mask=tile_ok, other=0.0)
    first = tl.load(iso_x_ptr + o_d * K, mask=d_ok, other=0.0)
    last = tl.load(iso_x_ptr + o_d * K + (K - 1), mask=d_ok, other=0.0)
    x = tl.minimum(tl.maximum(conf, first), last)
    hi = tl.sum(((xp <= x[:, None]) & tile_ok).to(tl.int32), axis=1)
    hi = tl.minimum(tl.maximum(hi, 1), K - 1)
    lo = hi - 1
    zero = tl.zeros_like(xp)
    x_lo = tl.sum(tl.where(o_k[None, :] == lo[:, None], xp, zero), axis=1)
    x_hi = tl.sum(tl.where(o_k[None, :] == hi[:, None], xp, zero), axis=1)
    f_lo = tl.sum(tl.where(o_k[None, :] == lo[:, None], fp, zero), axis=1)
    f_hi = tl.sum(tl.where(o_k[None, :] == hi[:, None], fp, zero), axis=1)
    span = tl.maximum(x_hi - x_lo, 1e-12)
    t = tl.minimum(tl.maximum((x - x_lo) / span, 0.0), 1.0)
    calibrated = tl.where(x_hi == x_lo, f_hi, f_lo + t * (f_hi - f_lo))
    # entropy smoothing h̄_i = (h_i + h̄_{i−1}) / 2, h̄_0 = h_1, in position order
    h_first = _pick(ent, 0, o_d)
    smooth = tl.zeros([BD], dtype=tl.float32)
    previous = tl.zeros([BD], dtype=tl.float32)  # h̄_{i−1}, with h_1 at i = 1
    prev = h_first
    for i in tl.static_range(D):
        previous = tl.where(o_d == i, prev, previous)
        prev = (_pick(ent, i, o_d) + prev) / 2
        smooth = tl.where(o_d == i, prev, smooth)
    jump = tl.log((ent + EPS) / (previous + EPS))
    position = (o_d + 1).to(tl.float32)
    c0 = tl.load(coef_ptr)
    logit = c0 + (calibrated * tl.load(coef_ptr + 1) + position * tl.load(coef_ptr + 2)
                  + calibrated * position * tl.load(coef_ptr + 3) + tl.log(1.0 + smooth) * tl.load(coef_ptr + 4)
                  + jump * tl.load(coef_ptr + 5))
    accept = tl.sigmoid(logit)
    # p̂_i = Π_{j≤i} ĉ_j and G(w) = 1 + Σ_{i<w} p̂_i, in position order
    o_w = tl.arange(0, BW)
    p_hat = tl.zeros([BD], dtype=tl.float32)
    gain = tl.full([BW], 1.0, dtype=tl.float32)  # G(0) = G(1) = 1
    prod = 1.0
    total = 0.0
    for i in tl.static_range(D):
        prod = prod * _pick(accept, i, o_d)
        p_hat = tl.where(o_d == i, prod, p_hat)
        total = total + prod
        gain = tl.where(o_w == i + 2, 1 + total, gain)
    tl.store(p_hat_ptr + o_d, p_hat, mask=d_ok)
    # Eq. 5: argmax over the candidate lengths of G(w) − ρ C_tgt(w), ties to the shorter
    o_l = tl.arange(0, BL)
    l_ok = o_l < L
    lengths = tl.load(lengths_ptr + o_l, mask=l_ok, other=0)
    cost = tl.load(cost_ptr + o_w, mask=o_w <= W, other=0.0)
    g_l = tl.sum(tl.where(o_w[None, :] == lengths[:, None], gain[None, :], tl.zeros([BL, BW], tl.float32)), axis=1)
    c_l = tl.sum(tl.where(o_w[None, :] == lengths[:, None], cost[None, :], tl.zeros([BL, BW], tl.float32)), axis=1)
    score = tl.where(l_ok, g_l - rho * c_l, float("-inf"))
    best = tl.max(score, axis=0)
    index = tl.min(tl.where(score == best, o_l, BL), axis=0)
    w0 = _pick(lengths, index, o_l).to(tl.int64)
    w_rem = tl.load(w_rem_ptr).to(tl.int64)
    w_c = w0
    if CORRECT:
        # n_new: experts of token w0 (row w0 of the block) that no earlier token selected
        o_t = tl.arange(0, BT)
        o_r = tl.arange(0, BW)
        ids = tl.load(ids_ptr + o_r[:, None] * TOPK + o_t[None, :], mask=(o_r < W)[:, None] & (o_t < TOPK)[None, :],
                      other=-1)  # [BW, BT]
        row = tl.minimum(w0, W - 1)
        mine = tl.sum(tl.where(o_r[:, None] == row, ids, tl.zeros_like(ids)), axis=0)  # [BT]
        earlier = tl.where((o_r < w0)[:, None], ids, -1)  # [BW, BT]
        seen = tl.sum(tl.sum((earlier[:, :, None] == mine[None, None, :]).to(tl.int32), axis=1), axis=0)  # [BT]
        n_new = tl.sum(((seen == 0) & (o_t < TOPK)).to(tl.int64), axis=0)
        # ΔL_c = C(w0+1) − C(w0) − s + η (n̄(w0 | n_new) − n̄(w0)), float64
        eta, s, rho64 = tl.load(scalars_ptr), tl.load(scalars_ptr + 1), tl.load(scalars_ptr + 2)
        w0c = tl.minimum(w0, W - 1)
        n_c = tl.minimum(n_new, NCOND - 1)
        cond = tl.load(nbar_cond_ptr + w0c * NCOND + n_c)
        extra = eta * (cond - tl.load(nbar_all_ptr + w0c))
        added = tl.load(cost64_ptr + w0c + 1) - tl.load(cost64_ptr + w0c) - s + extra
        p_last = _pick(p_hat, tl.maximum(w0c - 1, 0), o_d).to(tl.float64)
        expand = (p_last > rho64 * added) & (w0 < W) & (w_rem > w0)
        w_c = w0 + expand.to(tl.int64)
    tl.store(w0_ptr, w0)
    tl.store(w_c_ptr, w_c)
    tl.store(w_ptr, tl.minimum(w_c, w_rem))


def select_lengths(confidence: Tensor, entropy: Tensor, iso_x: Tensor, iso_y: Tensor, coef: Tensor, lengths: Tensor,
                   cost: Tensor, rho: float, w_rem: Tensor, out: tuple[Tensor, Tensor, Tensor], p_hat: Tensor,
                   correction: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None, *,
                   entropy_eps: float) -> None:
    """Write w0, w_c, w (each [1] long, `out`) and p̂ [D] (fp32) of one round.

    confidence, entropy [D]; iso_x, iso_y [D, K] fp32 (rows padded with their last point); coef [6]
    fp32; lengths [L] long ascending; cost [W + 1] fp32; rho the artifact's ρ; w_rem [1] long, the
    longest length the budget allows. correction (HybridSpec): (Layer-0 expert ids [W, k] of the
    whole block, then float64: cost [W + 1], n̄_all [W + 1], n̄_all(· | n) [W + 1, n_max + 1] and
    [η, s, ρ]);
    without it w_c = w0. entropy_eps: the acceptance model's ε (`artifacts.params.ENTROPY_EPS`)."""
    D, K = iso_x.shape
    W = cost.shape[0] - 1
    if confidence.shape != (D,) or entropy.shape != (D,) or W != D + 1 or coef.shape != (6,):
        raise ValueError(f"select_lengths: confidence {tuple(confidence.shape)}, entropy {tuple(entropy.shape)}, "
                         f"iso tables {tuple(iso_x.shape)}, cost {tuple(cost.shape)}, coef {tuple(coef.shape)}")
    if iso_y.shape != iso_x.shape or lengths.dtype != torch.long or lengths.dim() != 1 or lengths.shape[0] > W - 1:
        raise ValueError(f"select_lengths: iso_y {tuple(iso_y.shape)} must match iso_x {tuple(iso_x.shape)}, and "
                         f"lengths {tuple(lengths.shape)} {lengths.dtype} be at most {W - 1} long ints (values in "
                         f"2..{W}: PolicyParameters checks them)")
    for name, t in (("iso_x", iso_x), ("iso_y", iso_y), ("coef", coef), ("lengths", lengths), ("cost", cost)):
        if not t.is_contiguous():
            raise ValueError(f"select_lengths: {name} must be contiguous (stride {t.stride()})")
    check_device("select_lengths", confidence=confidence, entropy=entropy, iso_x=iso_x, iso_y=iso_y, coef=coef,
                 lengths=lengths, cost=cost, w_rem=w_rem, p_hat=p_hat)
    correct = correction is not None
    if correct:
        ids, cost64, nbar_all, nbar_cond, scalars = correction
        for name, t in (("cost", cost64), ("nbar_all", nbar_all), ("nbar_cond", nbar_cond), ("scalars", scalars)):
            if t.dtype != torch.float64 or not t.is_contiguous():
                raise ValueError(f"select_lengths: the correction's {name} must be contiguous float64 (Eq. 6 "
                                 f"runs in float64), got {t.dtype} with stride {t.stride()}")
        if ids.shape[0] != W:
            raise ValueError(f"select_lengths: Stage 0's expert ids cover {ids.shape[0]} tokens, the block {W}")
        topk, ncond = ids.shape[1], nbar_cond.shape[1]
    else:
        ids, cost64, nbar_all, nbar_cond, scalars = w_rem, cost, cost, cost, cost
        topk, ncond = 1, 1
    w0, w_c, w = out
    _select_kernel[(1,)](
        confidence, entropy, iso_x, iso_y, coef, lengths, cost, float(rho),  # a float argument arrives as fp32
        ids.contiguous(), cost64, nbar_all, nbar_cond, scalars, w_rem, p_hat, w0, w_c, w,
        D=D, K=K, L=lengths.shape[0], W=W, TOPK=topk, NCOND=ncond, CORRECT=correct,
        BD=triton.next_power_of_2(D), BK=triton.next_power_of_2(K), BL=triton.next_power_of_2(lengths.shape[0]),
        BW=triton.next_power_of_2(W + 1), BT=triton.next_power_of_2(topk),
        EPS=entropy_eps, num_warps=1)
