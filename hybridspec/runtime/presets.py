"""Exact-name presets of real target shapes with random weights, for cost profiling only.

Shapes follow the public configurations (DESIGN B.4). For Qwen3.5-122B-A10B the public card gives
48 layers, hidden 3072, 32 query heads, 256 experts top-8 plus a shared expert; the GDN and expert
widths below are the family's pattern scaled to that hidden size and are marked as assumed."""

from __future__ import annotations

_QWEN35_35B = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
}

PRESETS: dict[str, dict] = {
    "qwen3.5-35b-a3b": _QWEN35_35B,
    "qwen3.6-35b-a3b": _QWEN35_35B,
    "qwen3.5-122b-a10b": {
        **_QWEN35_35B, "hidden_size": 3072, "num_hidden_layers": 48, "num_attention_heads": 32,
        "linear_num_value_heads": 64,  # assumed
        "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024,  # assumed
    },
    "qwen3-next-80b-a3b": {
        **_QWEN35_35B, "model_type": "qwen3_next", "vocab_size": 151936, "num_hidden_layers": 48,
        "num_experts": 512, "num_experts_per_tok": 10, "intermediate_size": 5120, "norm_topk_prob": True,
    },
}


# A tiny random hybrid target: the default model when the embedded pair is not installed, and fast tests.
PRESETS["random-tiny"] = {
    **_QWEN35_35B, "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 16, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "max_position_embeddings": 4096,
}


def preset_config(name: str) -> dict:
    """The HF-style config dict of a preset, by exact name."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return dict(PRESETS[name])
