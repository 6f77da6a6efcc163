"""Gated attention over a layer's KV cache in plain PyTorch.

Token i of a pass of T tokens sits at position p + i (p = position[0], on the device) and sees the
keys 0 … p + i; the pass's own keys and values are already in the cache. Query head h reads KV head
h // (H / H_kv). The output is multiplied by sigmoid(gate), each step rounded to the activation
dtype as the checkpoints' implementation does.

`norm_rope_store` prepares a pass's queries and keys before the attention: q and k RMS-normed per
head (the target's offset norm, or the drafter's plain one), partial RoPE on both, the keys and
values written into the cache at the pass's positions.

`block_attention` is the drafter's: no gate, and every query of the block sees the keys
0 … p + T − 1 (the context and the whole block, not causal within it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridspec.kernels.norm.reference import offset_rms_norm, rms_norm


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
    """q, gate [B, T, H, D]; key, value [B, S, H_kv, D]; position [≥ 1] long (position[0]: the first
    token's) → [B, T, H·D] in q's dtype.
    span: how many keys to read (None: all S, the positions past the context masked)."""
    check_attention_args(q, gate, key, value, position)
    B, T, H, D = q.shape
    S = span or key.shape[1]
    positions = position[0] + torch.arange(T, device=q.device)  # [T]
    visible = torch.arange(S, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), key[:, :S].transpose(1, 2), value[:, :S].transpose(1, 2),
                                         attn_mask=visible, enable_gqa=True)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate.reshape(B, T, H * D))


def block_attention(q: Tensor, key: Tensor, value: Tensor, position: Tensor, span: int | None = None) -> Tensor:
    """q [B, T, H, D]; key, value [B, S, H_kv, D]; position [≥ 1] long → [B, T, H·D] in q's dtype, every
    query attending to the keys [0, position[0] + T). span: how many keys to read (None: all S, the
    positions from p + T on masked)."""
    check_attention_args(q, q, key, value, position)
    B, T, H, D = q.shape
    S = span or key.shape[1]
    visible = torch.arange(S, device=q.device) < position[0] + T  # [S]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), key[:, :S].transpose(1, 2), value[:, :S].transpose(1, 2),
                                         attn_mask=visible[None, :].expand(T, S), enable_gqa=True)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(B, T, H * D)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, heads, head_dim]; cos/sin [T, rotary_dim] (or [B, T, rotary_dim]), rotary_dim ≤ head_dim;
    RoPE in the half-rotation layout on the first rotary_dim features, the rest passed through."""
    rot = cos.shape[-1]
    cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if cos.dim() == 2 else (cos[:, :, None], sin[:, :, None])
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def check_prepare_args(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor,
                       sin: Tensor, key: Tensor, value: Tensor, position: Tensor, offset: bool = True) -> None:
    """Shapes: q [B, T, H, D]; k, v [B, T, H_kv, D]; weights [D] (the plain norm's in k's dtype);
    cos, sin [P, R] tables by position (R even, ≤ D); key, value [B, S, H_kv, D]; position [≥ 1] long."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"norm_rope_store: q must be [B, T, H, D] and k, v [B, T, H_kv, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, T, H, D = q.shape
    if key.dim() != 4 or value.shape != key.shape or key.shape[0] != B or key.shape[2:] != k.shape[2:]:
        raise ValueError(f"norm_rope_store: the cache {tuple(key.shape)} / {tuple(value.shape)} does not hold "
                         f"keys {tuple(k.shape)}")
    if q_weight.shape != (D,) or k_weight.shape != (D,):
        raise ValueError(f"norm_rope_store: norm weights must be [{D}], got {tuple(q_weight.shape)} and "
                         f"{tuple(k_weight.shape)}")
    if not offset and not (q_weight.dtype == k_weight.dtype == k.dtype):
        raise ValueError(f"norm_rope_store: the plain norm's weights must have k's dtype {k.dtype}, got "
                         f"{q_weight.dtype} and {k_weight.dtype}")
    if cos.dim() != 2 or sin.shape != cos.shape or not cos.shape[0] or cos.shape[1] % 2 or cos.shape[1] > D:
        raise ValueError(f"norm_rope_store: cos and sin must be tables [P, R] by position with R even and ≤ {D}, "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if position.dtype != torch.long or position.numel() < 1:
        raise ValueError("norm_rope_store: position must be a long tensor holding the first token's position")


def norm_rope_store(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
                    cos: Tensor, sin: Tensor, key: Tensor, value: Tensor, position: Tensor, offset: bool = True
                    ) -> Tensor:
    """q [B, T, H, D] → its per-head RMS norm (`q_weight`) with RoPE, in q's dtype; k, v
    [B, T, H_kv, D]: k normed (`k_weight`) and roped, both written into key / value [B, S, H_kv, D]
    at positions position[0] … position[0] + T − 1 (read on the device). cos, sin [P, R]: RoPE's
    tables, row i for position i (`runtime.layers.rope.rope_cos_sin`). offset: the offset norm
    (`norm.reference.offset_rms_norm`, the target's), else the plain norm (`rms_norm`, the drafter's).
    q may have no heads (H = 0: keys and values only)."""
    check_prepare_args(q, k, v, q_weight, k_weight, cos, sin, key, value, position, offset)
    norm = offset_rms_norm if offset else rms_norm
    positions = position[0] + torch.arange(q.shape[1], device=q.device)  # [T]
    cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)  # [T, R]
    key.index_copy_(1, positions, apply_rope(norm(k, k_weight, eps)[0], cos, sin))
    value.index_copy_(1, positions, v)
    return apply_rope(norm(q, q_weight, eps)[0], cos, sin)
