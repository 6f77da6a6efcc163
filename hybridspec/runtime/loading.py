"""Load a target or drafter from a Hugging Face directory (config.json + safetensors, single file
or sharded with an index) or build a preset with random weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn

from .config import ConfigError, read_config_json, target_config_from_dict
from .layers.rope import rope_inv_freq
from .models import qwen3_5_moe, qwen3_next
from .models.hybrid import HybridTarget
from .presets import PRESETS, preset_config

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


def load_target(spec: str | Path, *, device: str = "cpu", dtype: str = "float32", backend: str = "torch",
                seed: int = 0) -> HybridTarget:
    """A directory with a supported config.json, or a preset name (random weights)."""
    path = Path(spec)
    if path.is_dir():
        cfg = target_config_from_dict(read_config_json(path), str(path / "config.json"))
        model = HybridTarget(cfg, backend=backend)
        load_state(model, _MAPPERS[cfg.model_type](read_safetensors(path), cfg), str(path))
        return model.to(device=device, dtype=torch_dtype(dtype)).eval()
    if str(spec) in PRESETS:
        cfg = target_config_from_dict(preset_config(str(spec)), f"preset {spec}")
        with torch.device("meta"):
            model = HybridTarget(cfg, backend=backend)
        model = model.to_empty(device=device).to(torch_dtype(dtype))
        model.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta).to(device)  # to_empty left it unset
        return init_random_(model, seed).eval()
    if path.exists():
        raise ConfigError(f"{path}: not a model directory (expected config.json + *.safetensors)")
    raise ConfigError(f"{spec!r} is neither a model directory nor a preset ({', '.join(sorted(PRESETS))})")



def random_drafter(target: HybridTarget, *, num_layers: int = 2, block_size: int = 16, seed: int = 0):
    """A DFlash drafter with random weights shaped for `target` (cost profiling, demos, tests)."""
    from .config import DrafterConfig, default_target_layer_ids
    from .drafter import DFlashDrafter

    cfg = target.cfg
    dcfg = DrafterConfig(  # the target's attention shapes
        hidden_size=cfg.hidden_size, num_hidden_layers=num_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=3 * cfg.hidden_size, block_size=block_size, mask_token_id=cfg.vocab_size - 1,
        target_layer_ids=tuple(default_target_layer_ids(cfg.num_hidden_layers, num_layers)),
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
