"""Tensor parallelism of the hybrid target over `torch.distributed` (NCCL on GPUs, gloo on CPU).

Each of the P ranks of a process group holds a `HybridTarget` built from `local_config`: the same
layers with 1/P of the heads and of the intermediate columns, its caches sized to match. Rank r
takes contiguous slices of the full weights:

    GDN layers        key heads [r·HK/P, (r+1)·HK/P) and value heads [r·HV/P, …): their q, k, v rows
                      (and conv channels), z, b, a rows, A_log, dt_bias; out_proj's input columns
                      (value head j reads key head j // (HV/HK), so both splits stay together)
    attention layers  query heads and KV heads likewise (q with its gate rows, k, v; o_proj columns)
    MoE               every expert, with 1/P of its intermediate columns (gate and up rows, down
                      columns); the shared expert likewise; the router and the shared expert's gate
                      whole (every rank routes every token the same)
    dense MLPs        1/P of the intermediate columns
    whole             embeddings, norms, LM head

Every output projection (GDN out_proj, o_proj, the experts' and the dense MLP's down) then gives a
partial sum, completed by one all-reduce per token mixer and one per MLP block, before the residual
add. Every rank holds the same hidden states afterwards, so the LM head, the drafter (replicated),
the selector and acceptance run identically on every rank with no further communication.

Expert parallelism (experts split by id, each rank running its own) is the alternative layout for
the MoE blocks; which one is faster is for the two-GPU measurement to decide.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from .config import ConfigError, TargetConfig
from .models.hybrid import HybridTarget

# (field, what it counts) split across the ranks; each must be a multiple of the world size
SPLIT_FIELDS = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "attention KV heads"),
                ("linear_num_key_heads", "GDN key heads"), ("linear_num_value_heads", "GDN value heads"),
                ("moe_intermediate_size", "expert intermediate columns"),
                ("shared_expert_intermediate_size", "shared-expert intermediate columns"),
                ("intermediate_size", "dense-MLP intermediate columns"))


def local_config(cfg: TargetConfig, world: int) -> TargetConfig:
    """The configuration one rank of `world` builds: the split counts of SPLIT_FIELDS divided by
    the world size. ConfigError naming the field when one is not a multiple of it."""
    if world < 1:
        raise ConfigError(f"tensor parallelism over {world} ranks")
    changes = {}
    for field, what in SPLIT_FIELDS:
        value = getattr(cfg, field)
        if value % world:
            raise ConfigError(f"tensor parallelism over {world} ranks: {field} = {value} ({what}) is not a multiple "
                              f"of {world}")
        changes[field] = value // world
    return dataclasses.replace(cfg, **changes)


def _rows(t: Tensor, start: int, size: int, dim: int = 0) -> Tensor:
    return t.narrow(dim, start, size)


def shard_state(state: dict[str, Tensor], cfg: TargetConfig, rank: int, world: int) -> dict[str, Tensor]:
    """Rank `rank`'s slices of a full target's state dict (the module docstring's table)."""
    hk, hv = cfg.linear_num_key_heads // world, cfg.linear_num_value_heads // world
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    nh, nkv, d = cfg.num_attention_heads // world, cfg.num_key_value_heads // world, cfg.head_dim
    i_moe, i_shared = cfg.moe_intermediate_size // world, cfg.shared_expert_intermediate_size // world
    i_dense = cfg.intermediate_size // world
    key_dim = cfg.linear_num_key_heads * dk

    def gdn_channels(t: Tensor) -> Tensor:  # q, k, v rows (or conv channels) of this rank's heads
        return torch.cat((_rows(t, rank * hk * dk, hk * dk), _rows(t, key_dim + rank * hk * dk, hk * dk),
                          _rows(t, 2 * key_dim + rank * hv * dv, hv * dv)))

    def gate_up(t: Tensor, inter: int, full: int, dim: int) -> Tensor:  # gate rows then up rows
        return torch.cat((_rows(t, rank * inter, inter, dim), _rows(t, full + rank * inter, inter, dim)), dim=dim)

    out = {}
    for name, t in state.items():
        leaf = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if leaf in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            t = gdn_channels(t)
        elif leaf == "linear_attn.in_proj_z.weight":
            t = _rows(t, rank * hv * dv, hv * dv)
        elif leaf in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight", "linear_attn.dt_bias",
                      "linear_attn.A_log"):
            t = _rows(t, rank * hv, hv)
        elif leaf == "linear_attn.out_proj.weight":
            t = _rows(t, rank * hv * dv, hv * dv, 1)
        elif leaf == "self_attn.q_proj.weight":  # each head's query rows followed by its gate rows
            t = _rows(t, rank * nh * 2 * d, nh * 2 * d)
        elif leaf in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            t = _rows(t, rank * nkv * d, nkv * d)
        elif leaf == "self_attn.o_proj.weight":
            t = _rows(t, rank * nh * d, nh * d, 1)
        elif leaf == "mlp.experts.gate_up_proj":  # [E, 2I, H]
            t = gate_up(t, i_moe, cfg.moe_intermediate_size, 1)
        elif leaf == "mlp.experts.down_proj":  # [E, H, I]
            t = _rows(t, rank * i_moe, i_moe, 2)
        elif leaf in ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"):
            t = _rows(t, rank * i_shared, i_shared)
        elif leaf == "mlp.shared_expert.down_proj.weight":
            t = _rows(t, rank * i_shared, i_shared, 1)
        elif leaf in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):  # dense MLP layers
            t = _rows(t, rank * i_dense, i_dense)
        elif leaf == "mlp.down_proj.weight":
            t = _rows(t, rank * i_dense, i_dense, 1)
        out[name] = t.contiguous()
    return out


class AllReduce:
    """Sums a layer's partial output over the process group, in place (graph-capturable with NCCL)."""

    def __init__(self, group=None):
        self.group = group

    def __call__(self, t: Tensor) -> Tensor:
        dist.all_reduce(t, group=self.group)
        return t


def tensor_parallel_target(full: HybridTarget, group=None) -> HybridTarget:
    """This rank's part of `full` (identical on every rank of `group`, the default process group
    when None): a target of `local_config` with this rank's weight slices and an all-reduce after
    every token mixer and MLP block. The GDN and attention caches it allocates hold this rank's
    heads only."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    cfg = local_config(full.cfg, world)
    p = full.embed_tokens.weight
    local = HybridTarget(cfg, backend=full.backend, feature_layers=full.feature_layers).to(dtype=p.dtype,
                                                                                           device=p.device)
    local.load_state_dict(shard_state(full.state_dict(), full.cfg, rank, world))
    if full.cfg.tie_word_embeddings:
        local.lm_head.weight = local.embed_tokens.weight
    local.fuse_projections()  # as the loaders leave a target
    reduce = AllReduce(group)
    for layer in local.layers:
        layer.reduce = reduce
    return local


def spawn(fn: Callable[..., Any], world: int, device: str, *args) -> Any:
    """Run fn(*args) on `world` spawned processes joined in a fresh process group (gloo on CPU;
    NCCL on CUDA, rank r on GPU r) and return rank 0's result. An error on any rank is raised here."""
    if device.startswith("cuda") and torch.cuda.device_count() < world:
        raise ValueError(f"tensor parallelism over {world} ranks needs {world} GPUs, this machine has "
                         f"{torch.cuda.device_count()}")
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(_rank_main, args=(world, device, f"{tmp}/rendezvous", fn, args, results), nprocs=world,
                     join=True)
        except mp.ProcessRaisedException as exc:
            if (error := bad_input(str(exc))) is not None:
                raise error from None
            raise
    return results.get()


def bad_input(rank_failure: str) -> ValueError | None:
    """A rank's failure (its traceback as `mp.spawn` reports it) as the ValueError the command
    reports for bad input, when that is what the rank raised; None for any other error."""
    kind, _, message = rank_failure.strip().splitlines()[-1].partition(": ")
    if kind.rsplit(".", 1)[-1] in ("ValueError", "ConfigError", "PolicyError", "ArtifactError"):
        return ValueError(message)
    return None


def _rank_main(rank: int, world: int, device: str, rendezvous: str, fn, args, results) -> None:
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        out = fn(*args)
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()
