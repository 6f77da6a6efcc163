"""Several projections of the same input as one GEMM."""

from __future__ import annotations

import torch
from torch import Tensor, nn


@torch.no_grad()
def fuse_linears(*parts: nn.Linear) -> Tensor:
    """Concatenate the weights of `parts` (bias-free linears of one input) into one [Σ out, in]
    tensor and make each part's weight a view of its rows, so that one `F.linear` with the
    returned tensor computes every part and the parameters (state dict, loaders) stay as they were.
    Call after the weights are loaded."""
    fused = torch.cat([p.weight for p in parts], dim=0)
    start = 0
    for p in parts:
        rows = p.weight.shape[0]
        p.weight = nn.Parameter(fused[start : start + rows], requires_grad=p.weight.requires_grad)
        start += rows
    return fused
