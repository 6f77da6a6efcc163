"""Rotary position embedding, optionally on the first `rotary_dim` features only (partial RoPE)."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_inv_freq(rotary_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [...] → cos, sin [..., rotary_dim] (frequencies repeated twice, half-rotation layout)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)  # [..., rotary_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, heads, head_dim]; cos/sin [T, rotary_dim] (or [B, T, rotary_dim]), rotary_dim ≤ head_dim."""
    rot = cos.shape[-1]
    cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if cos.dim() == 2 else (cos[:, :, None], sin[:, :, None])
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)
