"""The target's and the drafter's RMS norms in plain PyTorch (statistics in fp32, result in the activation dtype).

    offset_rms_norm   Qwen3.5 / Qwen3-Next: normalize(s) · (1 + weight), s = x (+ residual)
    rms_norm          Qwen3 (the DFlash drafter): weight · normalize(s), s = x (+ residual)
    gated_rms_norm    GDN output norm: weight · normalize(x) · silu(gate), norm before gate

Each rounds where the checkpoints' reference implementation rounds, so the Triton kernels
(`triton.py`) can reproduce every intermediate dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def normalize(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x²) + eps) over the last dimension, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def offset_rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """(normalize(s) · (1 + weight) in x's dtype, s) with s = x + residual (in x's dtype) or x.
    `weight` is stored zero-centred ([N] for x [..., N])."""
    s = x if residual is None else x + residual
    return (normalize(s, eps) * (1.0 + weight.float())).to(x.dtype), s


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(weight · normalize(s), s) with s = x + residual (in x's dtype) or x: the normalized value
    rounded to x's dtype, then its product with the weight (as torch multiplies two tensors)."""
    s = x if residual is None else x + residual
    return weight * normalize(s, eps).to(x.dtype), s


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight · normalize(x) · silu(gate) in gate's dtype; x (any float dtype) is first rounded
    to gate's dtype, the normalized value and its product with the weight are rounded to it too."""
    dtype = gate.dtype
    y = weight * normalize(x.to(dtype), eps).to(dtype)
    return (y * F.silu(gate.float())).to(dtype)
