"""Eq. 5 and Eq. 6 position by position in float64, the same signature as `triton.select_lengths`:
the plain form to read the kernel against (its results match up to float rounding, so a choice can
differ only where two lengths score equal to that precision)."""

from __future__ import annotations

import math

import torch
from torch import Tensor



def _calibrate(c: float, xs: list[float], ys: list[float]) -> float:
    """Isotonic prediction: piecewise-linear through (xs, ys), clipped at the ends."""
    c = min(max(c, xs[0]), xs[-1])
    hi = min(max(sum(x <= c for x in xs), 1), len(xs) - 1)
    x_lo, x_hi, y_lo, y_hi = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
    if x_hi == x_lo:
        return y_hi
    return y_lo + min(max((c - x_lo) / max(x_hi - x_lo, 1e-12), 0.0), 1.0) * (y_hi - y_lo)


def select_lengths(confidence: Tensor, entropy: Tensor, iso_x: Tensor, iso_y: Tensor, coef: Tensor, lengths: Tensor,
                   cost: Tensor, rho: float, w_rem: Tensor, out: tuple[Tensor, Tensor, Tensor], p_hat: Tensor,
                   correction: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None = None, *,
                   entropy_eps: float) -> None:
    conf, ent = confidence.tolist(), entropy.tolist()
    c = coef.tolist()
    D, W = len(conf), cost.shape[0] - 1
    prod, p, smooth_prev = 1.0, [], ent[0]  # h̄_0 = h_1
    for i in range(D):
        previous = smooth_prev
        smooth_prev = (ent[i] + smooth_prev) / 2  # h̄_i
        cal = _calibrate(conf[i], iso_x[i].tolist(), iso_y[i].tolist())
        logit = (c[0] + c[1] * cal + c[2] * (i + 1) + c[3] * cal * (i + 1) + c[4] * math.log1p(smooth_prev)
                 + c[5] * math.log((ent[i] + entropy_eps) / (previous + entropy_eps)))
        prod *= 1 / (1 + math.exp(-logit))  # ĉ_i, then p̂_i = Π_{j≤i} ĉ_j
        p.append(prod)
    p_hat.copy_(torch.tensor(p))
    costs = cost.tolist()
    # Eq. 5: G(w) − ρ C(w) with G(w) = 1 + Σ_{i<w} p̂_i, the first (shortest) of the best
    scores = [(1 + sum(p[: w - 1]) - rho * costs[w], w) for w in lengths.tolist()]
    w0 = max(scores, key=lambda sw: (sw[0], -sw[1]))[1]
    budget = int(w_rem.reshape(-1)[0])
    w_c = w0
    if correction is not None and w0 < W and budget > w0:
        ids, cost64, nbar_all, nbar_cond, scalars = correction
        eta, s, rho64 = scalars.tolist()
        earlier = set(ids[:w0].reshape(-1).tolist())
        n_new = len(set(ids[w0].tolist()) - earlier)  # Layer-0 experts token w0 adds
        table = nbar_cond[w0].tolist()
        added = (cost64[w0 + 1] - cost64[w0]).item() - s + eta * (table[min(n_new, len(table) - 1)] - nbar_all[w0].item())
        w_c = w0 + int(p[w0 - 1] > rho64 * added)  # Eq. 6
    for tensor, value in zip(out, (w0, w_c, min(w_c, budget))):
        tensor.fill_(value)
