"""Load a target or drafter from a Hugging Face directory (config.json + safetensors, single file
or sharded with an index), build a preset or a drafter with random weights, and save a drafter in
the DFlash checkpoint format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from .config import (ConfigError, DrafterConfig, TargetConfig, default_target_layer_ids, drafter_config_from_dict,
                     read_config_json, target_config_from_dict)
from .drafter import DFlashDrafter
from .layers.rope import rope_inv_freq
from .models import qwen3_5_moe, qwen3_next
from .models.common import strip_prefixes
from .models.hybrid import HybridTarget
from .presets import PRESETS, preset_config

RANDOM_BLOCK_SIZE = 16  # a random drafter's block: anchor + D = 15 draft tokens
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MAPPERS = {"qwen3_5_moe_text": qwen3_5_moe.map_weights, "qwen3_5_moe": qwen3_5_moe.map_weights,
            "qwen3_next": qwen3_next.map_weights}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def read_safetensors(directory: Path) -> dict[str, Tensor]:
    """All tensors of `model.safetensors` or of the shards listed in `model.safetensors.index.json`."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / name for name in shard_names]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{directory}: no *.safetensors files")
    tensors = {}
    for file in files:
        if not file.is_file():
            raise ConfigError(f"{index}: lists {file.name}, which does not exist")
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def load_state(model: nn.Module, weights: dict[str, Tensor], source: str) -> None:
    """Copy mapped weights into the model; name every missing, unexpected or mis-shaped tensor."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights) - ({"lm_head.weight"} if _tied(model) else set()))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ConfigError(f"{source}: weights do not match the config: missing {missing[:6]}, unexpected {unexpected[:6]}")
    for name, tensor in weights.items():
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise ConfigError(f"{source}: {name} has shape {tuple(tensor.shape)}, config implies {tuple(own[name].shape)}")
        own[name].copy_(tensor)


def _tied(model: nn.Module) -> bool:
    return getattr(getattr(model, "cfg", None), "tie_word_embeddings", False)


def init_random_(model: HybridTarget, seed: int = 0) -> HybridTarget:
    """Random weights of realistic scale (std 0.02 projections, decays A ∈ [1, 16], unit gates)."""
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape, device=p.device).uniform_(1.0, 16.0, generator=gen).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            else:
                fan_in = p.shape[-1]
                p.normal_(0.0, min(0.02, 1.0 / math.sqrt(fan_in)), generator=gen)
    return model


def target_config(spec: str | Path) -> TargetConfig:
    """The config of a model directory (config.json) or of a preset; no weights read."""
    path = Path(spec)
    if path.is_dir():
        return target_config_from_dict(read_config_json(path), str(path / "config.json"))
    if str(spec) in PRESETS:
        return target_config_from_dict(preset_config(str(spec)), f"preset {spec}")
    if path.exists():
        raise ConfigError(f"{path}: not a model directory (expected config.json + *.safetensors)")
    raise ConfigError(f"{spec!r} is neither a model directory nor a preset ({', '.join(sorted(PRESETS))})")


def load_target(spec: str | Path, *, device: str = "cpu", dtype: str = "float32", backend: str = "torch",
                seed: int = 0, feature_layers: tuple[int, ...] = ()) -> HybridTarget:
    """A directory with a supported config.json, or a preset name (random weights). `feature_layers`:
    the layers whose outputs the drafter reads (its `target_layer_ids`; none without a drafter)."""
    cfg = target_config(spec)
    if Path(spec).is_dir():
        model = HybridTarget(cfg, backend=backend, feature_layers=feature_layers)
        load_state(model, _MAPPERS[cfg.model_type](read_safetensors(Path(spec)), cfg), str(spec))
        return model.to(device=device, dtype=torch_dtype(dtype)).eval()
    with torch.device("meta"):
        model = HybridTarget(cfg, backend=backend, feature_layers=feature_layers)
    model = model.to_empty(device=device).to(torch_dtype(dtype))
    model.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta).to(device)  # to_empty left it unset
    return init_random_(model, seed).eval()


def random_drafter_layers(cfg: TargetConfig, num_layers: int = 2) -> tuple[int, ...]:
    """The target layers a random drafter of `num_layers` layers reads when the target names none."""
    return tuple(default_target_layer_ids(cfg.num_hidden_layers, num_layers))


def random_drafter(target: HybridTarget, *, num_layers: int = 2, block_size: int = RANDOM_BLOCK_SIZE, seed: int = 0):
    """A DFlash drafter with random weights shaped for `target` (cost profiling, demos, tests), reading
    the layers the target was built to expose (`random_drafter_layers` when it exposes none)."""
    cfg = target.cfg
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


def drafter_config(path: str | Path) -> DrafterConfig:
    """The config of a DFlash drafter directory (config.json); no weights read."""
    path = Path(path)
    return drafter_config_from_dict(read_config_json(path), str(path / "config.json"))


def load_drafter(path: str | Path, embed: nn.Embedding, lm_head: nn.Linear) -> DFlashDrafter:
    """A DFlash drafter directory (config.json + safetensors), on the target's device and dtype."""
    path = Path(path)
    drafter = DFlashDrafter(drafter_config(path), embed, lm_head)
    weights = strip_prefixes(read_safetensors(path), ("model.",), ("embed_tokens.", "lm_head.", "model.embed_tokens."))
    load_state(drafter, weights, str(path))
    p = embed.weight
    return drafter.to(device=p.device, dtype=p.dtype).eval()


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
