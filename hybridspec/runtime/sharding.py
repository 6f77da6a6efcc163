"""Which part of the hybrid target one rank of a tensor-parallel group holds (no communication here;
`tensor_parallel.py` runs it; the loaders keep only these parts, each rank reading every full tensor
of the checkpoint once).

Each of the P ranks builds the target of `local_config`: the same layers with 1/P of the heads and
of the intermediate columns. Rank r takes contiguous slices of the full weights:

    GDN layers        key heads [r·HK/P, (r+1)·HK/P) and value heads [r·HV/P, …): their q, k, v rows
                      (and conv channels), z, b, a rows, A_log, dt_bias; out_proj's input columns
                      (value head j reads key head j // (HV/HK), so both splits stay together)
    attention layers  query heads and KV heads likewise (q with its gate rows, k, v; o_proj columns)
    MoE               every expert, with 1/P of its intermediate columns (gate and up rows, down
                      columns); the shared expert likewise; the router and the shared expert's gate
                      whole (every rank routes every token the same). With expert parallelism
                      instead: experts [r·E/P, (r+1)·E/P) whole (the shared expert still split)
    dense MLPs        1/P of the intermediate columns
    whole             embeddings, norms, LM head

Every output projection (GDN out_proj, o_proj, the experts' and the dense MLP's down) then gives a
partial sum, completed by one all-reduce per token mixer and one per MLP block. Under expert
parallelism each rank's MoE output sums its own experts' share of every token (the experts of
other ranks add nothing there), so the same all-reduce completes it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .config import ConfigError, TargetConfig

# (field, what it counts) split across the ranks; each must be a multiple of the world size
SPLIT_FIELDS = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "attention KV heads"),
                ("linear_num_key_heads", "GDN key heads"), ("linear_num_value_heads", "GDN value heads"),
                ("moe_intermediate_size", "expert intermediate columns"),
                ("shared_expert_intermediate_size", "shared-expert intermediate columns"),
                ("intermediate_size", "dense-MLP intermediate columns"))


def local_config(cfg: TargetConfig, world: int, *, expert_parallel: bool = False) -> TargetConfig:
    """The configuration one rank of `world` builds: the split counts of SPLIT_FIELDS divided by
    the world size; with `expert_parallel` the experts' intermediate width whole and E / world
    experts per rank instead. ConfigError naming the field when one is not a multiple of it."""
    if world < 1:
        raise ConfigError(f"tensor parallelism over {world} ranks")
    if expert_parallel:  # TargetConfig checks that the experts divide
        cfg = dataclasses.replace(cfg, expert_shards=world)
    changes = {}
    for field, what in SPLIT_FIELDS:
        if expert_parallel and field == "moe_intermediate_size":
            continue
        value = getattr(cfg, field)
        if value % world:
            raise ConfigError(f"tensor parallelism over {world} ranks: {field} = {value} ({what}) is not a multiple "
                              f"of {world}")
        changes[field] = value // world
    return dataclasses.replace(cfg, **changes)


def shard_tensor(name: str, t: Tensor, cfg: TargetConfig, rank: int, world: int, *,
                 expert_parallel: bool = False) -> Tensor:
    """Rank `rank`'s part of the full target's parameter `name` (the module docstring's table); the
    tensor itself for parameters every rank holds whole."""
    leaf = name.split(".", 2)[-1] if name.startswith("layers.") else name
    hk, hv = cfg.linear_num_key_heads // world, cfg.linear_num_value_heads // world
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    nh, nkv, d = cfg.num_attention_heads // world, cfg.num_key_value_heads // world, cfg.head_dim

    def part(size: int, dim: int = 0, offset: int = 0) -> Tensor:  # the rank's `size` rows from `offset`
        return t.narrow(dim, offset + rank * size, size)

    def gate_up(full: int, dim: int) -> Tensor:  # the rank's gate rows, then its up rows
        inter = full // world
        return torch.cat((part(inter, dim), part(inter, dim, full)), dim=dim)

    if leaf in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):  # q, k, v rows or channels
        key_dim = cfg.linear_num_key_heads * dk
        return torch.cat((part(hk * dk), part(hk * dk, 0, key_dim), part(hv * dv, 0, 2 * key_dim)))
    if leaf == "linear_attn.in_proj_z.weight":
        return part(hv * dv)
    if leaf in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight", "linear_attn.dt_bias",
                "linear_attn.A_log"):
        return part(hv)
    if leaf == "linear_attn.out_proj.weight":
        return part(hv * dv, 1)
    if leaf == "self_attn.q_proj.weight":  # each head's query rows followed by its gate rows
        return part(nh * 2 * d)
    if leaf in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        return part(nkv * d)
    if leaf == "self_attn.o_proj.weight":
        return part(nh * d, 1)
    if expert_parallel and leaf in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # [E, …]: whole experts
        return part(cfg.num_experts // world)
    if leaf == "mlp.experts.gate_up_proj":  # [E, 2I, H]
        return gate_up(cfg.moe_intermediate_size, 1)
    if leaf == "mlp.experts.down_proj":  # [E, H, I]
        return part(cfg.moe_intermediate_size // world, 2)
    if leaf in ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"):
        return part(cfg.shared_expert_intermediate_size // world)
    if leaf == "mlp.shared_expert.down_proj.weight":
        return part(cfg.shared_expert_intermediate_size // world, 1)
    if leaf in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):  # dense MLP layers
        return part(cfg.intermediate_size // world)
    if leaf == "mlp.down_proj.weight":
        return part(cfg.intermediate_size // world, 1)
    return t


def shard_state(state: dict[str, Tensor], cfg: TargetConfig, rank: int, world: int, *,
                expert_parallel: bool = False) -> dict[str, Tensor]:
    """Rank `rank`'s parts of a full target's state dict (`shard_tensor` of every entry)."""
    return {name: shard_tensor(name, t, cfg, rank, world, expert_parallel=expert_parallel).contiguous()
            for name, t in state.items()}


def first_expert(cfg: TargetConfig, rank: int) -> int:
    """The id of the first routed expert rank `rank` holds (`cfg`: its local configuration): 0
    unless the experts are split whole across the ranks."""
    return (rank % cfg.expert_shards) * cfg.local_experts
