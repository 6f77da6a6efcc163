"""`qwen3_next` checkpoints: fused `in_proj_qkvz` / `in_proj_ba` are split into the separate
`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` of `HybridTarget`.

The fused rows are grouped per key head: for each of the HK key heads,
[q (dk), k (dk), v (r·dv), z (r·dv)] with r = HV / HK; and [b (r), a (r)] for `in_proj_ba`."""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import TargetConfig
from .common import fuse_experts, strip_prefixes


def _split_qkvz(w: Tensor, cfg: TargetConfig) -> dict[str, Tensor]:
    hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    grouped = w.view(hk, 2 * dk + 2 * r * dv, -1)  # [HK, rows per key head, hidden]
    q, k, v, z = grouped.split((dk, dk, r * dv, r * dv), dim=1)
    flat = lambda t: t.reshape(-1, w.shape[-1])  # noqa: E731
    return {"in_proj_qkv.weight": torch.cat((flat(q), flat(k), flat(v))), "in_proj_z.weight": flat(z)}


def _split_ba(w: Tensor, cfg: TargetConfig) -> dict[str, Tensor]:
    hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    b, a = w.view(hk, 2 * r, -1).split((r, r), dim=1)
    return {"in_proj_b.weight": b.reshape(-1, w.shape[-1]), "in_proj_a.weight": a.reshape(-1, w.shape[-1])}


def map_weights(raw: dict[str, Tensor], cfg: TargetConfig) -> dict[str, Tensor]:
    weights = strip_prefixes(raw, ("model.",), ("mtp.",))
    out = {}
    for name, tensor in weights.items():
        if name.endswith("linear_attn.in_proj_qkvz.weight"):
            base = name[: -len("in_proj_qkvz.weight")]
            out.update({base + k: v for k, v in _split_qkvz(tensor, cfg).items()})
        elif name.endswith("linear_attn.in_proj_ba.weight"):
            base = name[: -len("in_proj_ba.weight")]
            out.update({base + k: v for k, v in _split_ba(tensor, cfg).items()})
        else:
            out[name] = tensor
    return fuse_experts(out, cfg.num_experts)
