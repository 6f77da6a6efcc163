"""`qwen3_next` checkpoints: fused `in_proj_qkvz` / `in_proj_ba` are split into the separate
`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` of `HybridTarget`.

The fused rows are grouped per key head: for each of the HK key heads,
[q (dk), k (dk), v (r·dv), z (r·dv)] with r = HV / HK; and [b (r), a (r)] for `in_proj_ba`."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ..config import TargetConfig
from .common import Placement, expert_placement, strip_prefix


def _split_qkvz(w: Tensor, cfg: TargetConfig) -> tuple[Tensor, Tensor]:
    """[HK·(2dk + 2r·dv), hidden] → qkv [HK·2dk + HV·dv, hidden], z [HV·dv, hidden]."""
    hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    grouped = w.view(hk, 2 * dk + 2 * r * dv, -1)  # [HK, rows per key head, hidden]
    q, k, v, z = grouped.split((dk, dk, r * dv, r * dv), dim=1)
    flat = lambda t: t.reshape(-1, w.shape[-1])  # noqa: E731
    return torch.cat((flat(q), flat(k), flat(v))), flat(z)


def _split_ba(w: Tensor, cfg: TargetConfig) -> tuple[Tensor, Tensor]:
    """[HK·2r, hidden] → b [HV, hidden], a [HV, hidden]."""
    hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
    b, a = w.view(hk, 2 * r, -1).split((r, r), dim=1)
    return b.reshape(-1, w.shape[-1]), a.reshape(-1, w.shape[-1])


def _part(split, i: int, w: Tensor, cfg: TargetConfig) -> Tensor:
    return split(w, cfg)[i]


def placements(name: str, cfg: TargetConfig) -> list[Placement]:
    name = strip_prefix(name, ("model.",), ("mtp.",))
    if name is None:
        return []
    for fused, split, parts in (("in_proj_qkvz.weight", _split_qkvz, ("in_proj_qkv.weight", "in_proj_z.weight")),
                                ("in_proj_ba.weight", _split_ba, ("in_proj_b.weight", "in_proj_a.weight"))):
        if name.endswith("linear_attn." + fused):
            base = name[: -len(fused)]
            return [Placement(base + part, (), partial(_part, split, i, cfg=cfg)) for i, part in enumerate(parts)]
    return [expert_placement(name, cfg.moe_intermediate_size) or Placement(name)]
