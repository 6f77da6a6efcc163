"""Draft-side acceptance estimates (DESIGN A.9): ĉ_i from confidence and entropy, p̂_i = Π_{j≤i} ĉ_j.

Torch ops only, so the estimate stays on the device that drafted."""

from __future__ import annotations

import torch
from torch import Tensor

from ..artifacts.params import AcceptanceModel

ENTROPY_EPS = 1e-6  # keeps log(h_i / h̄_{i−1}) finite when an entropy is exactly 0


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
    """Piecewise-linear interpolation clipped at the ends (isotonic prediction)."""
    x = x.clamp(xp[0], xp[-1])
    hi = torch.searchsorted(xp, x, right=True).clamp(1, len(xp) - 1)
    lo = hi - 1
    span = (xp[hi] - xp[lo]).clamp_min(1e-12)
    t = ((x - xp[lo]) / span).clamp(0, 1)
    return torch.where(xp[hi] == xp[lo], fp[hi], fp[lo] + t * (fp[hi] - fp[lo]))


class AcceptanceEstimator:
    """Evaluates an `AcceptanceModel` on a device."""

    def __init__(self, model: AcceptanceModel, device: torch.device | str = "cpu"):
        f32 = torch.float32
        self.iso = [(torch.tensor(x, dtype=f32, device=device), torch.tensor(y, dtype=f32, device=device))
                    for x, y in zip(model.iso_x, model.iso_y)]
        self.coef = torch.tensor(model.coef, dtype=f32, device=device)

    def conditional(self, confidence: Tensor, entropy: Tensor) -> Tensor:
        """ĉ_i = P(A_D ≥ i | A_D ≥ i−1): confidence, entropy [D] → [D]."""
        calibrated = torch.stack([_interp(confidence[i].float(), *self.iso[i]) for i in range(len(self.iso))])
        logit = self.coef[0] + acceptance_features(calibrated, entropy.float()) @ self.coef[1:]
        return torch.sigmoid(logit)

    def prefix(self, confidence: Tensor, entropy: Tensor) -> Tensor:
        """p̂_i = Π_{j≤i} ĉ_j  [D]."""
        return torch.cumprod(self.conditional(confidence, entropy), dim=-1)
