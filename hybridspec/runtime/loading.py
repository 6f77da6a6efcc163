"""Load a target or drafter from a model reference (a Hugging Face directory with config.json +
safetensors, single file or sharded with an index; a repo id in the local Hugging Face cache; or a
preset with random weights), and save a drafter in the DFlash checkpoint format.

Models are built on the meta device and filled straight on the target device in the target dtype
(`weights.py`), after a check of the device's free memory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from .config import (TARGET_MODEL_TYPES, ConfigError, DrafterConfig, TargetConfig, default_target_layer_ids,
                     drafter_config_from_dict, read_config_json, target_config_from_dict)
from .drafter import DFlashDrafter
from .hub import describe, resolve_reference
from .layers.rope import rope_inv_freq
from .models import qwen3_5_moe, qwen3_next
from .layers.moe import SparseMoE
from .models.common import Placement, strip_prefix
from .models.hybrid import HybridTarget
from .presets import PRESETS, preset_config
from .sharding import first_expert, local_config, shard_tensor
from .weights import check_memory, materialize_, plan_load, read_checkpoint, stream_, stream_parts_, weight_bytes

RANDOM_BLOCK_SIZE = 16  # a random drafter's block: anchor + D = 15 draft tokens
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PLACEMENTS = {"qwen3_5_moe_text": qwen3_5_moe.placements, "qwen3_5_moe": qwen3_5_moe.placements,
               "qwen3_next": qwen3_next.placements}


def torch_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """A dtype name; `auto` is bfloat16 on CUDA and float32 (the exactness reference) elsewhere."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def init_random_(model: HybridTarget, seed: int = 0) -> HybridTarget:
    """Random weights of realistic scale (std 0.02 projections, decays A ∈ [1, 16], unit gates)."""
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _init_random_param_(name, p, gen)
    return model


def init_random_part_(model: HybridTarget, cfg: TargetConfig, rank: int, world: int, seed: int = 0, *,
                      expert_parallel: bool = False) -> HybridTarget:
    """Rank `rank`'s part (`sharding.shard_tensor`) of the weights `init_random_` gives the full
    target of `cfg`, drawn one full parameter at a time on the model's device (so a rank never
    holds more than its part and one full parameter)."""
    p = model.embed_tokens.weight
    gen = torch.Generator(device=p.device).manual_seed(seed)
    with torch.device("meta"):
        full = HybridTarget(cfg, backend=model.backend, feature_layers=model.feature_layers)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, shape in ((n, q.shape) for n, q in full.named_parameters()):  # init_random_'s order
            whole = torch.empty(shape, device=p.device, dtype=p.dtype)
            _init_random_param_(name, whole, gen)
            params[name].copy_(shard_tensor(name, whole, cfg, rank, world, expert_parallel=expert_parallel))
    return model


def _init_random_param_(name: str, p: Tensor, gen: torch.Generator) -> None:
    if name.endswith("A_log"):
        p.copy_(torch.empty(p.shape, device=p.device).uniform_(1.0, 16.0, generator=gen).log())
    elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        p.fill_(1.0)
    elif p.ndim == 1:
        p.zero_()
    else:
        fan_in = p.shape[-1]
        p.normal_(0.0, min(0.02, 1.0 / math.sqrt(fan_in)), generator=gen)


def target_config(spec: str | Path) -> TargetConfig:
    """The config of a model reference (directory, repo id or preset); no weights read."""
    path = Path(resolve_reference(spec))
    if path.is_dir():
        raw = read_config_json(path)
        if "DFlashDraftModel" in (raw.get("architectures") or []):
            raise ConfigError(f"{describe(path)}: a DFlash drafter, not a target; give it as --drafter")
        return target_config_from_dict(raw, f"{describe(path)}: config.json")
    if str(spec) in PRESETS:
        return target_config_from_dict(preset_config(str(spec)), f"preset {spec}")
    if path.exists():
        raise ConfigError(f"{path}: not a model directory (expected config.json + *.safetensors)")
    raise ConfigError(f"{spec!r} is neither a model directory, a preset ({', '.join(sorted(PRESETS))}) "
                      "nor a Hugging Face repo id (org/name or org/name@revision)")


def build_target(cfg: TargetConfig, *, device: str, dtype: str, backend: str, feature_layers: tuple[int, ...],
                 what: str) -> HybridTarget:
    """The target with uninitialised weights on `device` in `dtype`, after the memory check."""
    device, torch_type = torch.device(device), torch_dtype(dtype, device)
    with torch.device("meta"):
        model = HybridTarget(cfg, backend=backend, feature_layers=feature_layers)
    check_memory(weight_bytes(model, torch_type), device, what)
    materialize_(model, device, torch_type)
    model.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta).to(device)  # the meta build left it empty
    return model


def load_target(spec: str | Path, *, device: str = "cpu", dtype: str = "auto", backend: str = "torch",
                seed: int = 0, feature_layers: tuple[int, ...] = (), shard: tuple[int, int] = (0, 1),
                expert_parallel: bool = False) -> HybridTarget:
    """A model reference with a supported config.json (directory or repo id), or a preset name
    (random weights). `feature_layers`: the layers whose outputs the drafter reads (its
    `target_layer_ids`; none without a drafter). Checkpoint tensors stream onto `device` in `dtype`.
    `shard` (rank, world): only that rank's part of the target under tensor parallelism
    (`sharding.py`), with the weights of the full target's slices; the device holds only the part.
    `expert_parallel`: the part holds 1/world of the experts whole instead of 1/world of every
    expert's columns."""
    rank, world = shard
    full_cfg = target_config(spec)
    cfg = local_config(full_cfg, world, expert_parallel=expert_parallel) if world > 1 else full_cfg
    path = Path(resolve_reference(spec))
    what = f"preset {spec}" if not path.is_dir() else describe(path)
    if world > 1:
        what += f" (rank {rank} of {world})"
    if not path.is_dir():
        model = build_target(cfg, device=device, dtype=dtype, backend=backend, feature_layers=feature_layers,
                             what=what)
        model = (init_random_part_(model, full_cfg, rank, world, seed, expert_parallel=expert_parallel) if world > 1
                 else init_random_(model, seed))
        return _placed(_fused(model), rank).eval()
    source = describe(path)
    with torch.device("meta"):  # the headers are checked against the shapes before anything is allocated
        shapes = HybridTarget(full_cfg, backend=backend, feature_layers=feature_layers)
    route = lambda name: _PLACEMENTS[full_cfg.model_type](name, full_cfg)  # noqa: E731
    plan = plan_load(shapes, read_checkpoint(path, source), route, source,
                     optional=("lm_head.weight",) if full_cfg.tie_word_embeddings else ())
    model = build_target(cfg, device=device, dtype=dtype, backend=backend, feature_layers=feature_layers, what=what)
    if world > 1:
        full_shapes = {name: p.shape for name, p in shapes.named_parameters()}
        stream_parts_(model, plan, full_shapes,
                      lambda name, t: shard_tensor(name, t, full_cfg, rank, world, expert_parallel=expert_parallel))
    else:
        stream_(model, plan, torch.device(device))
    return _placed(_fused(model), rank).eval()


def _placed(model: HybridTarget, rank: int) -> HybridTarget:
    """Each MoE block told which of the router's experts it holds (`sharding.first_expert`)."""
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.first_expert = first_expert(model.cfg, rank)
    return model


def _fused(model: HybridTarget) -> HybridTarget:
    """The loaded weights in the runtime's fused layouts (`HybridTarget.fuse_projections`)."""
    model.fuse_projections()
    return model


def random_drafter_layers(cfg: TargetConfig, num_layers: int = 2) -> tuple[int, ...]:
    """The target layers a random drafter of `num_layers` layers reads when the target names none."""
    return tuple(default_target_layer_ids(cfg.num_hidden_layers, num_layers))


def random_drafter(target: HybridTarget, *, cfg: TargetConfig | None = None, num_layers: int = 2,
                   block_size: int = RANDOM_BLOCK_SIZE, seed: int = 0):
    """A DFlash drafter with random weights shaped for `target` (cost profiling, demos, tests), reading
    the layers the target was built to expose (`random_drafter_layers` when it exposes none). `cfg`:
    the full target's config when `target` is one rank's part (the drafter is whole on every rank)."""
    cfg = cfg or target.cfg
    dcfg = DrafterConfig(  # the target's attention shapes
        hidden_size=cfg.hidden_size, num_hidden_layers=num_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=3 * cfg.hidden_size, block_size=block_size, mask_token_id=cfg.vocab_size - 1,
        target_layer_ids=target.feature_layers or random_drafter_layers(cfg, num_layers),
        vocab_size=cfg.vocab_size,
    )
    p = target.embed_tokens.weight
    drafter = DFlashDrafter(dcfg, target.embed_tokens, target.lm_head).to(device=p.device, dtype=p.dtype)
    gen = torch.Generator(device=p.device).manual_seed(seed)
    with torch.no_grad():
        for name, w in drafter.named_parameters():
            if w.ndim == 1:
                w.fill_(1.0)
            else:
                w.normal_(0.0, 1.0 / math.sqrt(w.shape[-1]), generator=gen)
    return drafter.eval()


def drafter_config(spec: str | Path) -> DrafterConfig:
    """The config of a DFlash drafter reference (directory or repo id); no weights read."""
    path = Path(resolve_reference(spec))
    if not path.is_dir():
        raise ConfigError(f"{spec!r}: not a drafter directory nor a Hugging Face repo id (org/name[@revision]), "
                          "nor `random`")
    raw = read_config_json(path)
    if raw.get("model_type") in TARGET_MODEL_TYPES:
        raise ConfigError(f"{describe(path)}: a {raw['model_type']} target, not a DFlash drafter; give it as --model")
    return drafter_config_from_dict(raw, f"{describe(path)}: config.json")


def drafter_placements(name: str) -> list[Placement]:
    """DFlash names, without `model.`; the embeddings and LM head are the target's, not read."""
    name = strip_prefix(name, ("model.",), ("embed_tokens.", "lm_head.", "model.embed_tokens."))
    return [] if name is None else [Placement(name)]


def load_drafter(spec: str | Path, embed: nn.Embedding, lm_head: nn.Linear) -> DFlashDrafter:
    """A DFlash drafter (directory or repo id), streamed onto the target's device and dtype."""
    path = Path(resolve_reference(spec))
    cfg, source = drafter_config(path), describe(path)
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg, embed, lm_head)  # embed and lm_head are the target's, not registered
    plan = plan_load(drafter, read_checkpoint(path, source), drafter_placements, source)
    p = embed.weight
    check_memory(weight_bytes(drafter, p.dtype), p.device, source)
    materialize_(drafter, p.device, p.dtype)
    drafter.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta).to(p.device)  # the meta build left it empty
    stream_(drafter, plan, p.device)
    return drafter.eval()


def save_drafter(drafter: DFlashDrafter, directory: str | Path, *, num_target_layers: int,
                 dtype: torch.dtype | None = None) -> None:
    """Write `config.json` + `model.safetensors` in the DFlash checkpoint format."""
    cfg, directory = drafter.cfg, Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
           "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
           "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
           "intermediate_size": cfg.intermediate_size, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
           "vocab_size": cfg.vocab_size, "num_target_layers": num_target_layers, "block_size": cfg.block_size,
           "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tensors = {k: (v.to(dtype) if dtype else v).contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(tensors, directory / "model.safetensors")
