"""RMS norms of the Qwen3 family (statistics in fp32, result in the input dtype).

Every norm runs through `op` (`kernels/norm`: the PyTorch reference by default, which training
differentiates through; the target on its triton backend, and the drafter beside it, set the Triton
kernels)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...kernels.norm import reference as norm_reference


class OffsetRMSNorm(nn.Module):
    """Qwen3.5 / Qwen3-Next norm: `normalize(x) * (1 + weight)`; weight stored zero-centred."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.op = norm_reference.offset_rms_norm

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, self.weight, self.eps)[0]

    def add_norm(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm's launch."""
        return self.op(x, self.weight, self.eps, residual)


class RMSNorm(nn.Module):
    """Qwen3 norm (the DFlash drafter): `weight * normalize(x)` with the weight applied in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.op = norm_reference.rms_norm

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, self.weight, self.eps)[0]

    def add_norm(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm's launch."""
        return self.op(x, self.weight, self.eps, residual)


class GatedRMSNorm(nn.Module):
    """GDN output norm: `weight * normalize(o) * silu(gate)` (norm before gate), in gate's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.op = norm_reference.gated_rms_norm

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        return self.op(x, gate, self.weight, self.eps)
