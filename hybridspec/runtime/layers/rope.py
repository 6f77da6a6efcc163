"""Rotary position embedding tables (cos, sin per position); the rotation itself, optionally on the
first `rotary_dim` features only (partial RoPE), is `apply_rope` of the attention kernels' reference
(`kernels/attention/reference.py`), re-exported here for the drafter."""

from __future__ import annotations

import torch
from torch import Tensor

from ...kernels.attention.reference import apply_rope

__all__ = ["apply_rope", "rope_cos_sin", "rope_inv_freq"]


def rope_inv_freq(rotary_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [...] → cos, sin [..., rotary_dim] (frequencies repeated twice, half-rotation layout)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)  # [..., rotary_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
