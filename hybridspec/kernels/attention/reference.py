"""Gated attention over a layer's KV cache in plain PyTorch.

Token i of a pass of T tokens sits at position p + i (p = position[0], on the device) and sees the
keys 0 … p + i; the pass's own keys and values are already in the cache. Query head h reads KV head
h // (H / H_kv). The output is multiplied by sigmoid(gate), each step rounded to the activation
dtype as the checkpoints' implementation does."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_attention_args(q: Tensor, gate: Tensor, key: Tensor, value: Tensor, position: Tensor) -> None:
    """Shapes: q, gate [B, T, H, D]; key, value [B, S, H_kv, D] with H a multiple of H_kv; position [≥ 1] long."""
    if q.dim() != 4 or gate.shape != q.shape:
        raise ValueError(f"attention: q and gate must both be [B, T, H, D], got {tuple(q.shape)} and {tuple(gate.shape)}")
    if key.dim() != 4 or value.shape != key.shape:
        raise ValueError(f"attention: key and value must both be [B, S, H_kv, D], got {tuple(key.shape)} and {tuple(value.shape)}")
    B, T, H, D = q.shape
    if key.shape[0] != B or key.shape[3] != D or H % key.shape[2]:
        raise ValueError(f"attention: q {tuple(q.shape)} does not fit the cache {tuple(key.shape)}")
    if position.dtype != torch.long or position.numel() < 1:
        raise ValueError("attention: position must be a long tensor holding the first token's position")


def gated_attention(q: Tensor, gate: Tensor, key: Tensor, value: Tensor, position: Tensor,
                    span: int | None = None) -> Tensor:
    """q, gate [B, T, H, D]; key, value [B, S, H_kv, D]; position [B] long → [B, T, H·D] in q's dtype.
    span: how many keys to read (None: all S, the positions past the context masked)."""
    check_attention_args(q, gate, key, value, position)
    B, T, H, D = q.shape
    S = span or key.shape[1]
    positions = position[0] + torch.arange(T, device=q.device)  # [T]
    visible = torch.arange(S, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), key[:, :S].transpose(1, 2), value[:, :S].transpose(1, 2),
                                         attn_mask=visible, enable_gqa=True)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate.reshape(B, T, H * D))
