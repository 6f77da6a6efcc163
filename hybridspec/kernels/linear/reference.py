"""Plain-PyTorch references of `triton.py`: the products with fp32 sums, rounded once to the
activations' dtype; the normalised products are the norm's reference followed by the product."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from hybridspec.kernels.norm import reference as norm_reference


def rows_linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K], weight [R, K] → [..., R] in x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)


def norm_linear(x: Tensor, norm_weight: Tensor, eps: float, residual: Tensor | None, weight: Tensor
                ) -> tuple[Tensor, Tensor]:
    """(offset_rms_norm(s) W^T, s) with s = x + residual (x where residual is None): x, residual
    [..., K], norm_weight [K] (zero-centred), weight [R, K] → ([..., R], [..., K]) in x's dtype."""
    h, s = norm_reference.offset_rms_norm(x, norm_weight, eps, residual)
    return F.linear(h, weight), s


def gated_linear(o: Tensor, z: Tensor, norm_weight: Tensor, eps: float, weight: Tensor) -> Tensor:
    """gated_rms_norm(o, z) W^T: o, z [..., HV, D], norm_weight [D], weight [R, HV·D] → [..., R] in z's
    dtype (the GDN output norm, then its out-projection)."""
    h = norm_reference.gated_rms_norm(o, z, norm_weight, eps)
    return F.linear(h.reshape(*h.shape[:-2], -1), weight)
