"""The mixers' projections in plain PyTorch.

    linear            x Wᵀ  (a mixer's input projection)
    linear_add_norm   (normalize(s) · (1 + norm_weight), s),  s = x Wᵀ + residual
                      (with `gate`: x = gated_rms_norm(heads, gate, gate_weight), heads [..., H, dv])

The product is rounded to the activation dtype before the add, as `F.linear` followed by the
norm's fused add rounds it (`kernels/norm/reference.py`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from hybridspec.kernels.norm.reference import gated_rms_norm, offset_rms_norm


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K], weight [N, K] → x Wᵀ [..., N] in the weight's dtype."""
    return F.linear(x, weight)


def linear_add_norm(x: Tensor, weight: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, *,
                    gate: Tensor | None = None, gate_weight: Tensor | None = None, gate_eps: float = 1e-6
                    ) -> tuple[Tensor, Tensor]:
    """x [..., K], weight [N, K], residual [..., N], norm_weight [N] (zero-centred) →
    (normalize(s) · (1 + norm_weight), s) in the weight's dtype, s = x Wᵀ + residual. With `gate`
    ([..., H, dv] like x, K = H·dv) and `gate_weight` [dv], x is first each head's gated norm."""
    if gate is not None:
        x = gated_rms_norm(x, gate, gate_weight, gate_eps).reshape(*residual.shape[:-1], -1)
    return offset_rms_norm(F.linear(x, weight), norm_weight, eps, residual)
