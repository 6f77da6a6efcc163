"""Config parsing, presets of real shapes, and the other checkpoint layouts of DESIGN B.4."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridspec.runtime.config import ConfigError, target_config_from_dict
from hybridspec.runtime.loading import load_target
from hybridspec.runtime.models.hybrid import HybridTarget
from hybridspec.runtime.presets import PRESETS, preset_config


@pytest.mark.parametrize("name,billions", [("qwen3.5-35b-a3b", 35), ("qwen3.6-35b-a3b", 35),
                                           ("qwen3-next-80b-a3b", 80), ("qwen3.5-122b-a10b", 122)])
def test_presets_have_the_published_sizes(name, billions):
    cfg = target_config_from_dict(preset_config(name), name)
    with torch.device("meta"):
        model = HybridTarget(cfg)
    total = sum(p.numel() for p in model.parameters()) / 1e9
    assert abs(total - billions) / billions < 0.1, f"{name}: {total:.1f}B parameters"
    assert cfg.layer_types[0] == "linear_attention" and cfg.attention_layers == tuple(range(3, cfg.num_hidden_layers, 4))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError, match="qwen3.5-35b-a3b"):
        load_target("qwen3.5-36b")


def test_layer0_must_be_gdn():
    raw = {**preset_config("random-tiny"), "layer_types": ["full_attention"] + ["linear_attention"] * 3}
    with pytest.raises(ConfigError, match="layer 0 must be a Gated DeltaNet layer"):
        target_config_from_dict(raw)


def test_missing_field_is_named():
    raw = preset_config("random-tiny")
    del raw["num_experts"]
    with pytest.raises(ConfigError, match="missing field 'num_experts'"):
        target_config_from_dict(raw, "x/config.json")


def test_multimodal_layout_with_fused_experts_loads_the_text_model(qwen35_dir, tmp_path):
    """`qwen3_5_moe` checkpoints: text config nested, weights under `model.language_model.`,
    experts fused as 3-D tensors, a vision tower and MTP head to skip."""
    text = json.loads((qwen35_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text,
                                                      "architectures": ["Qwen3_5MoeForConditionalGeneration"]}))
    raw = load_file(qwen35_dir / "model.safetensors")
    out = {"model.visual.blocks.0.weight": torch.zeros(2), "mtp.fc.weight": torch.zeros(2)}
    E = text["num_experts"]
    for name, t in raw.items():
        name = name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name
        if ".experts." in name:
            continue
        out[name] = t
    for layer in range(text["num_hidden_layers"]):
        src = f"model.layers.{layer}.mlp.experts"
        gate = torch.stack([raw[f"{src}.{e}.gate_proj.weight"] for e in range(E)])
        up = torch.stack([raw[f"{src}.{e}.up_proj.weight"] for e in range(E)])
        dst = f"model.language_model.layers.{layer}.mlp.experts"
        out[f"{dst}.gate_up_proj"] = torch.cat((gate, up), dim=1)
        out[f"{dst}.down_proj"] = torch.stack([raw[f"{src}.{e}.down_proj.weight"] for e in range(E)])
    save_file(out, tmp_path / "model.safetensors")
    a, b = load_target(qwen35_dir), load_target(tmp_path)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


def test_mis_shaped_weight_is_named(qwen35_dir, tmp_path):
    (tmp_path / "config.json").write_text((qwen35_dir / "config.json").read_text())
    raw = load_file(qwen35_dir / "model.safetensors")
    raw["model.norm.weight"] = torch.zeros(3)
    save_file(raw, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"norm.weight has shape \(3,\)"):
        load_target(tmp_path)


def test_every_preset_is_listed():
    assert {"qwen3.5-35b-a3b", "qwen3.6-35b-a3b", "qwen3.5-122b-a10b", "qwen3-next-80b-a3b"} <= set(PRESETS)


def test_an_unknown_reference_names_the_three_forms():
    from hybridspec.runtime.loading import target_config

    with pytest.raises(ConfigError, match=r"neither a model directory, a preset \(.*\) nor a Hugging Face repo id"):
        target_config("no-such-model")
