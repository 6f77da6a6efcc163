"""The out-projection, residual add and offset RMS norm in plain PyTorch.

    linear_add_norm   (normalize(s) · (1 + norm_weight), s),  s = x Wᵀ + residual

The product is rounded to the activation dtype before the add, as `F.linear` followed by the
norm's fused add rounds it (`kernels/norm/reference.py`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from hybridspec.kernels.norm.reference import offset_rms_norm


def linear_add_norm(x: Tensor, weight: Tensor, residual: Tensor, norm_weight: Tensor, eps: float
                    ) -> tuple[Tensor, Tensor]:
    """x [..., K], weight [N, K], residual [..., N], norm_weight [N] (zero-centred) →
    (normalize(s) · (1 + norm_weight), s) in x's dtype, s = x Wᵀ + residual."""
    return offset_rms_norm(F.linear(x, weight), norm_weight, eps, residual)
