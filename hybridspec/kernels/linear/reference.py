"""The dense projection the runtime uses today: the library's product."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [M, K], weight [N, K] → x Wᵀ [M, N] in x's dtype."""
    return F.linear(x, weight)
