"""Plain-PyTorch reference of `triton.rows_linear`: y = x W^T with fp32 sums, rounded once to x's
dtype."""

from __future__ import annotations

from torch import Tensor


def rows_linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K], weight [R, K] → [..., R] in x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
