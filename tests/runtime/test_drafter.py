"""The DFlash drafter: checkpoint format, cached context equals recomputation, committed-only context,
the triton backend's ops (equal drafts, no PyTorch form of the ops its kernels take)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from hybridspec.runtime.config import ConfigError
from hybridspec.runtime.loading import load_drafter, load_target, random_drafter
from tests.tolerance import assert_close


@pytest.fixture(scope="module")
def pair(qwen35_dir):
    target = load_target(qwen35_dir)
    return target, random_drafter(target, num_layers=2, seed=4)


def write_dflash(drafter, directory, *, nested_block_size: bool) -> None:
    """Write a drafter in the DFlash checkpoint format (HF-style names, `model.` prefix)."""
    cfg = drafter.cfg
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
           "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
           "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
           "intermediate_size": cfg.intermediate_size, "rope_theta": cfg.rope_theta, "num_target_layers": 8,
           "vocab_size": cfg.vocab_size,
           "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}
    if nested_block_size:
        raw["dflash_config"]["block_size"] = cfg.block_size
    else:
        raw["block_size"] = cfg.block_size
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw))
    save_file({f"model.{k}": v.contiguous() for k, v in drafter.state_dict().items()}, directory / "model.safetensors")


def _reference_draft(drafter, target, features, anchor):
    """DFlash's forward written out without the context cache: Q from the block, K/V from
    [k_proj(context); k_proj(block)] in every layer, non-causal, RoPE at absolute positions."""
    cfg = drafter.cfg
    ctx = drafter.hidden_norm(drafter.fc(features))[0]  # [S, hidden]
    S, bs = ctx.shape[0], cfg.block_size
    x = target.embed_tokens(torch.tensor([anchor] + [cfg.mask_token_id] * (bs - 1)))  # [bs, hidden]
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
    ang = torch.arange(S + bs).float()[:, None] * inv[None]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    rot = lambda t, c, s: t * c[:, None] + torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), -1) * s[:, None]  # noqa: E731
    for layer in drafter.layers:
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = rot(att.q_norm(att.q_proj(h).view(bs, -1, cfg.head_dim)), cos[S:], sin[S:])
        both = torch.cat((ctx, h))
        k = rot(att.k_norm(att.k_proj(both).view(S + bs, -1, cfg.head_dim)), cos, sin)
        v = att.v_proj(both).view(S + bs, -1, cfg.head_dim)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(cfg.head_dim)
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(bs, -1)
        x = x + att.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return F.softmax(target.lm_head(drafter.norm(x[1:])).float(), -1)


def test_cached_context_equals_recomputation(pair):
    target, drafter = pair
    features = torch.randn(1, 13, len(drafter.cfg.target_layer_ids) * target.cfg.hidden_size)
    drafter.reset(64)
    for piece in (features[:, :5], features[:, 5:6], features[:, 6:]):  # context grows in commits
        drafter.extend(piece)
    out = drafter.propose(anchor=3)
    probs = _reference_draft(drafter, target, features, 3)
    top, tokens = probs.max(-1)
    assert out.tokens.tolist() == tokens.tolist()
    assert_close("confidence", top, out.confidence, 1e-5)
    assert_close("entropy", -(probs * probs.clamp_min(1e-30).log()).sum(-1), out.entropy, 1e-5)
    assert out.tokens.shape == (drafter.cfg.block_size - 1,)


@pytest.mark.parametrize("key_span", [None, 64 + 16])
def test_the_triton_block_attention_reads_only_the_live_context(pair, key_span):
    """The drafter on the triton backend's kernels (under the interpreter on CPU: its norms, its q/k
    norms with RoPE and cache writes, its block attention): the reference recomputation's draft,
    with NaN in every cached position past the block (the whole cache is handed to the attention
    kernel, which reads [0, p + block_size) on the device), whether the resident round set a static
    span or not."""
    from hybridspec.runtime.backends import drafter_ops

    target, drafter = pair
    features = torch.randn(1, 11, len(drafter.cfg.target_layer_ids) * target.cfg.hidden_size)
    drafter.reset(64)
    drafter.extend(features)
    drafter.key_span = key_span
    drafter.ctx_k[:, :, 11 + drafter.cfg.block_size:] = float("nan")
    drafter.ctx_v[:, :, 11 + drafter.cfg.block_size:] = float("nan")
    drafter.set_ops(**drafter_ops("triton"))
    try:
        out = drafter.propose(anchor=3)
    finally:
        drafter.set_ops(**drafter_ops("torch"))
        drafter.key_span = None
    probs = _reference_draft(drafter, target, features, 3)
    top, tokens = probs.max(-1)
    assert out.tokens.tolist() == tokens.tolist()
    assert_close("confidence", top, out.confidence, 1e-5)
    assert_close("entropy", -(probs * probs.clamp_min(1e-30).log()).sum(-1), out.entropy, 1e-5)


def test_on_the_triton_backend_no_norm_rope_or_softmax_runs_in_pytorch(pair):
    """With the triton backend's ops a proposal and a context extension leave the norms, the RoPE
    rotation, the cache writes, the softmax statistics and (fp32, at most 16 tokens) the products to
    their kernels: none of the PyTorch ops those would dispatch (seen by a dispatch mode) runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hybridspec.runtime.backends import drafter_ops

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    target, drafter = pair
    features = torch.randn(1, 9, len(drafter.cfg.target_layer_ids) * target.cfg.hidden_size)
    drafter.reset(64)
    drafter.set_ops(**drafter_ops("triton"))
    try:
        with Ops() as ops:
            drafter.extend(features)
            drafter.propose(anchor=3)
    finally:
        drafter.set_ops(**drafter_ops("torch"))
    torch_forms = {"rsqrt", "pow", "mean", "neg", "cos", "sin", "index_copy_", "_log_softmax", "max",
                   "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math", "mm",
                   "addmm", "bmm"}
    assert drafter.fc.weight.dtype == torch.float32
    assert not ops.seen & torch_forms, sorted(ops.seen & torch_forms)


@pytest.mark.parametrize("nested", [False, True])
def test_checkpoint_round_trip(pair, tmp_path, nested):
    target, drafter = pair
    write_dflash(drafter, tmp_path / "d", nested_block_size=nested)
    loaded = load_drafter(tmp_path / "d", target.embed_tokens, target.lm_head)
    assert loaded.cfg == drafter.cfg
    features = torch.randn(1, 7, len(drafter.cfg.target_layer_ids) * target.cfg.hidden_size)
    for d in (drafter, loaded):
        d.reset(32)
        d.extend(features)
    a, b = drafter.propose(5), loaded.propose(5)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.confidence, b.confidence)


def test_bad_drafter_config_is_named(pair, tmp_path):
    target, drafter = pair
    write_dflash(drafter, tmp_path / "d", nested_block_size=False)
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    del raw["dflash_config"]["mask_token_id"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="mask_token_id"):
        load_drafter(tmp_path / "d", target.embed_tokens, target.lm_head)
