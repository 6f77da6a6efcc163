"""Draft-side acceptance estimates (DESIGN A.9): ĉ_i from confidence and entropy, p̂_i = Π_{j≤i} ĉ_j.

Torch ops only, so the estimate stays on the device that drafted."""

from __future__ import annotations

import torch
from torch import Tensor

from ..artifacts.params import ENTROPY_EPS, AcceptanceModel



def smoothed_entropy(entropy: Tensor) -> Tensor:
    """h̄_i = (h_i + h̄_{i−1}) / 2 with h̄_0 = h_1.  entropy [..., D] → [..., D]."""
    out, prev = [], entropy[..., 0]
    for i in range(entropy.shape[-1]):
        prev = (entropy[..., i] + prev) / 2
        out.append(prev)
    return torch.stack(out, dim=-1)


def acceptance_features(calibrated: Tensor, entropy: Tensor) -> Tensor:
    """[..., D] calibrated confidence and entropy → [..., D, 5] logistic features:
    [c, i, c·i, log(1 + h̄_i), log(h_i / h̄_{i−1})] with positions i = 1 … D."""
    D = entropy.shape[-1]
    position = torch.arange(1, D + 1, dtype=calibrated.dtype, device=calibrated.device).expand_as(calibrated)
    smooth = smoothed_entropy(entropy)
    previous = torch.cat((entropy[..., :1], smooth[..., :-1]), dim=-1)  # h̄_{i−1}, with h̄_0 = h_1
    jump = torch.log((entropy + ENTROPY_EPS) / (previous + ENTROPY_EPS))
    return torch.stack((calibrated, position, calibrated * position, torch.log1p(smooth), jump), dim=-1)


def _interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Piecewise-linear interpolation clipped at the ends (isotonic prediction), row by row:
    x [D], xp, fp [D, K] increasing thresholds and values per row → [D]. Rows shorter than K are
    padded by repeating their last point (a zero-width span that returns that point's value)."""
    x = torch.minimum(torch.maximum(x, xp[:, 0]), xp[:, -1])[:, None]  # [D, 1]
    hi = torch.searchsorted(xp, x, right=True).clamp(1, xp.shape[1] - 1)  # [D, 1]
    lo = hi - 1
    x_lo, x_hi, f_lo, f_hi = xp.gather(1, lo), xp.gather(1, hi), fp.gather(1, lo), fp.gather(1, hi)
    span = (x_hi - x_lo).clamp_min(1e-12)
    t = ((x - x_lo) / span).clamp(0, 1)
    return torch.where(x_hi == x_lo, f_hi, f_lo + t * (f_hi - f_lo))[:, 0]


def _padded(rows: tuple[tuple[float, ...], ...], device) -> Tensor:
    """Ragged rows → [D, K] fp32, each row padded with its last value."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.float32, device=device)


class AcceptanceEstimator:
    """Evaluates an `AcceptanceModel` on a device, with a number of kernels that does not depend
    on the isotonic tables (all positions interpolated at once)."""

    def __init__(self, model: AcceptanceModel, device: torch.device | str = "cpu"):
        self.iso_x, self.iso_y = _padded(model.iso_x, device), _padded(model.iso_y, device)  # [D, K]
        self.coef = torch.tensor(model.coef, dtype=torch.float32, device=device)

    def conditional(self, confidence: Tensor, entropy: Tensor) -> Tensor:
        """ĉ_i = P(A_D ≥ i | A_D ≥ i−1): confidence, entropy [D] → [D]."""
        calibrated = _interp(confidence.float(), self.iso_x, self.iso_y)
        logit = self.coef[0] + acceptance_features(calibrated, entropy.float()) @ self.coef[1:]
        return torch.sigmoid(logit)

    def prefix(self, confidence: Tensor, entropy: Tensor) -> Tensor:
        """p̂_i = Π_{j≤i} ĉ_j  [D]."""
        return torch.cumprod(self.conditional(confidence, entropy), dim=-1)
