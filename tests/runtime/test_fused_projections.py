"""The loaders' fused input projections (`HybridTarget.fuse_projections`): the GDN layers' q, k, v,
z, b, a and the attention layers' q (with its gate), k, v become views of one weight per layer, and
the model computes what it computed with the separate projections."""

from __future__ import annotations

import torch

from hybridspec.runtime.config import target_config_from_dict
from hybridspec.runtime.models.hybrid import HybridTarget
from hybridspec.runtime.presets import preset_config


def test_fused_projections_are_views_and_change_no_output():
    torch.manual_seed(0)
    target = HybridTarget(target_config_from_dict(preset_config("random-tiny"), "random-tiny")).eval()
    for p in target.parameters():
        p.data.normal_(0, 0.05)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    tokens = torch.randint(0, target.cfg.vocab_size, (1, 12))

    def logits():
        cache = target.new_cache(max_len=64, tokens_per_pass=16)
        cache.reset()
        return target.prefill(tokens, cache, all_logits=True).logits

    separate = logits()
    target.fuse_projections()
    fused = logits()
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # the same weights
    for layer in target.layers:
        mixer = layer.linear_attn if layer.is_gdn else layer.self_attn
        storage = (mixer._in_proj if layer.is_gdn else mixer._qkv).untyped_storage().data_ptr()
        names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a") if layer.is_gdn else ("q_proj", "k_proj", "v_proj")
        assert all(getattr(mixer, n).weight.untyped_storage().data_ptr() == storage for n in names)
    assert {layer.is_gdn for layer in target.layers} == {True, False}  # both kinds covered
    torch.testing.assert_close(fused, separate, rtol=1e-5, atol=1e-5)
