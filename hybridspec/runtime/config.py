"""Typed configuration of the target and the drafter, parsed from Hugging Face `config.json`.

One source of truth: frozen dataclasses validated on construction. Parsing accepts the
`qwen3_5_moe_text`, `qwen3_5_moe` (its `text_config`) and `qwen3_next` model types (DESIGN B.4) and
the DFlash drafter format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TARGET_MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")


class ConfigError(ValueError):
    """A configuration file or value that the runtime cannot use."""


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """Shapes of a hybrid GDN + MoE target. `layer_types[i]` is `linear_attention` or `full_attention`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    # gated softmax attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # MoE
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead of MoE (qwen3_next only)
    intermediate_size: int = 0  # width of those dense MLPs
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    max_position_embeddings: int = 32768
    expert_shards: int = 1  # expert parallelism: each process holds num_experts / expert_shards whole experts

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries, num_hidden_layers is {self.num_hidden_layers}"
            )
        bad = sorted(set(self.layer_types) - {"linear_attention", "full_attention"})
        if bad:
            raise ConfigError(f"unknown layer types {bad}")
        if self.layer_types[0] != "linear_attention":
            raise ConfigError("layer 0 must be a Gated DeltaNet layer (HybridSpec's Stage 0 runs it)")
        if 0 in self.dense_layers:
            raise ConfigError("layer 0 must have an MoE block (Stage 0 stops at its router)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok={self.num_experts_per_tok} with {self.num_experts} experts")
        if self.expert_shards < 1 or self.num_experts % self.expert_shards:
            raise ConfigError(f"expert parallelism over {self.expert_shards} ranks: num_experts = {self.num_experts} "
                              f"is not a multiple of {self.expert_shards}")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def local_experts(self) -> int:
        """Routed experts one process holds (all of them without expert parallelism)."""
        return self.num_experts // self.expert_shards

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_conv_dim(self) -> int:
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    """A DFlash drafter (DESIGN B.4): Qwen3-style non-causal layers over target features."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ConfigError(f"block_size must be at least 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise ConfigError("dflash_config.target_layer_ids is empty")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def draft_len(self) -> int:
        """D: draft tokens per block (the block's first slot holds the anchor)."""
        return self.block_size - 1


def read_config_json(path: Path) -> dict:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path}: no config.json")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


def _rope(raw: dict) -> tuple[float, float]:
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", "default") not in ("default", None):
        raise ConfigError(f"rope_type {rope['rope_type']!r} is not supported (only default RoPE)")
    theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


def _eos(raw: dict) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def target_config_from_dict(raw: dict, source: str = "config") -> TargetConfig:
    """Parse a Hugging Face config dict of a supported hybrid target."""
    model_type = raw.get("model_type")
    if model_type not in TARGET_MODEL_TYPES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not one of {', '.join(TARGET_MODEL_TYPES)}")
    text = raw
    if model_type == "qwen3_5_moe":
        if "text_config" not in raw:
            raise ConfigError(f"{source}: qwen3_5_moe config without text_config")
        text = {**raw["text_config"]}
        text.setdefault("eos_token_id", raw.get("eos_token_id"))
    n_layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = text.get("full_attention_interval", 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    dense: tuple[int, ...] = ()
    if model_type == "qwen3_next":
        step = text.get("decoder_sparse_step", 1)
        only = set(text.get("mlp_only_layers") or [])
        dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    theta, factor = _rope(text)
    try:
        return TargetConfig(
            model_type=model_type,
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"],
            rope_theta=theta,
            partial_rotary_factor=factor,
            linear_num_key_heads=text["linear_num_key_heads"],
            linear_num_value_heads=text["linear_num_value_heads"],
            linear_key_head_dim=text["linear_key_head_dim"],
            linear_value_head_dim=text["linear_value_head_dim"],
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            num_experts=text["num_experts"],
            num_experts_per_tok=text["num_experts_per_tok"],
            moe_intermediate_size=text["moe_intermediate_size"],
            shared_expert_intermediate_size=text["shared_expert_intermediate_size"],
            norm_topk_prob=bool(text.get("norm_topk_prob", True)),
            dense_layers=dense,
            intermediate_size=text.get("intermediate_size", 0) or 0,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            eos_token_ids=_eos(text),
            max_position_embeddings=text.get("max_position_embeddings", 32768),
        )
    except KeyError as exc:
        raise ConfigError(f"{source}: missing field {exc.args[0]!r}") from exc


def drafter_config_from_dict(raw: dict, source: str = "config") -> DrafterConfig:
    """Parse a DFlash drafter config (`architectures: ["DFlashDraftModel"]`)."""
    if "DFlashDraftModel" not in (raw.get("architectures") or []):
        raise ConfigError(f"{source}: not a DFlash drafter (architectures={raw.get('architectures')})")
    dflash = raw.get("dflash_config") or {}
    block_size = dflash.get("block_size", raw.get("block_size"))
    if block_size is None:
        raise ConfigError(f"{source}: missing block_size (top level or dflash_config)")
    if "mask_token_id" not in dflash:
        raise ConfigError(f"{source}: missing dflash_config.mask_token_id")
    n_layers = raw["num_hidden_layers"]
    layer_ids = dflash.get("target_layer_ids")
    if layer_ids is None:
        layer_ids = default_target_layer_ids(raw["num_target_layers"], n_layers)
    rope = raw.get("rope_parameters") or {}
    try:
        return DrafterConfig(
            hidden_size=raw["hidden_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw["num_key_value_heads"],
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            intermediate_size=raw["intermediate_size"],
            block_size=int(block_size),
            mask_token_id=int(dflash["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0))),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            vocab_size=raw.get("vocab_size", 0),
        )
    except KeyError as exc:
        raise ConfigError(f"{source}: missing field {exc.args[0]!r}") from exc


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default taps: evenly spaced over layers 1 … L−3 (the middle layer for one draft layer)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]
