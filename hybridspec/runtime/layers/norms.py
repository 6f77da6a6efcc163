"""RMS norms of the Qwen3 family (statistics in fp32, result in the input dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _normalize(x: Tensor, eps: float) -> Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class OffsetRMSNorm(nn.Module):
    """Qwen3.5 / Qwen3-Next norm: `normalize(x) * (1 + weight)`; weight stored zero-centred."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return (_normalize(x, self.eps) * (1.0 + self.weight.float())).type_as(x)


class RMSNorm(nn.Module):
    """Qwen3 norm (the DFlash drafter): `weight * normalize(x)` with the weight applied in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * _normalize(x, self.eps).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm: `weight * normalize(o) * silu(gate)` (norm before gate)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dtype = x.dtype
        y = self.weight * _normalize(x, self.eps).to(dtype)
        return (y * F.silu(gate.float())).to(dtype)
