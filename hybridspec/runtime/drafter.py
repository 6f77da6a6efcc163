"""The DFlash parallel block drafter (DESIGN B.4).

Context: the target's hidden states after the layers in `target_layer_ids`, concatenated, mapped by
`fc` and `hidden_norm`; every layer's K/V of the context come from that one projection and are
cached, advancing only through committed tokens. A block is `[anchor, MASK × (block_size − 1)]`
at the positions after the context; the block attends (non-causally) to the context and to
itself; one pass gives D = block_size − 1 draft tokens with top-1 confidence and entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DrafterConfig
from .layers.moe import DenseMLP
from .layers.norms import RMSNorm
from .layers.rope import apply_rope, rope_cos_sin, rope_inv_freq


@dataclass
class DraftOutput:
    tokens: Tensor  # [D] long   d_1 … d_D
    confidence: Tensor  # [D] fp32  top-1 probability
    entropy: Tensor  # [D] fp32  nats


class DraftAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def key_value(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → K, V [B, T, n_kv, head_dim] (K normed and rotated)."""
        B, T, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)), *rope)
        return k, self.v_proj(x).view(B, T, self.n_kv, self.head_dim)

    def forward(self, x: Tensor, ctx_k: Tensor, ctx_v: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        B, T, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)), *rope)
        k, v = self.key_value(x, rope)
        keys = torch.cat((ctx_k, k), dim=1).transpose(1, 2)  # [B, n_kv, S+T, hd]
        values = torch.cat((ctx_v, v), dim=1).transpose(1, 2)
        groups = self.n_heads // self.n_kv
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values)  # non-causal
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class DFlashDrafter(nn.Module):
    """Drafter weights and its context cache. `embed` and `lm_head` are the target's."""

    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self._target = (embed, lm_head)  # not registered: not the drafter's weights
        self.ctx_k: Tensor | None = None  # [n_layers, B, max_len, n_kv, hd]
        self.ctx_v: Tensor | None = None
        self.length = 0

    @property
    def draft_len(self) -> int:
        return self.cfg.draft_len

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    def reset(self, max_len: int) -> None:
        """Allocate (or reuse) the context cache for a request of at most max_len positions."""
        p = self.fc.weight
        shape = (len(self.layers), 1, max_len, self.cfg.num_key_value_heads, self.cfg.head_dim)
        if self.ctx_k is None or self.ctx_k.shape[2] < max_len:
            self.ctx_k = torch.zeros(shape, dtype=p.dtype, device=p.device)
            self.ctx_v = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self.length = 0

    def _rope(self, start: int, count: int) -> tuple[Tensor, Tensor]:
        positions = torch.arange(start, start + count, device=self.inv_freq.device)
        return rope_cos_sin(positions, self.inv_freq, self.fc.weight.dtype)

    @torch.no_grad()
    def extend(self, features: Tensor) -> None:
        """Append committed tokens' target features [1, m, n_taps·hidden] to the context."""
        m = features.shape[1]
        if self.length + m > self.ctx_k.shape[2]:
            raise ValueError(f"drafter context of {self.length + m} positions exceeds its cache ({self.ctx_k.shape[2]})")
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        rope = self._rope(self.length, m)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(ctx, rope)
            self.ctx_k[i, :, self.length : self.length + m] = k
            self.ctx_v[i, :, self.length : self.length + m] = v
        self.length += m

    @torch.no_grad()
    def propose(self, anchor: int) -> DraftOutput:
        """Draft D tokens after the anchor, which sits at the position right after the context."""
        embed, lm_head = self._target
        bs = self.cfg.block_size
        block = torch.full((1, bs), self.cfg.mask_token_id, dtype=torch.long, device=self.fc.weight.device)
        block[0, 0] = anchor
        x = embed(block).to(self.fc.weight.dtype)  # [1, bs, hidden]
        rope = self._rope(self.length, bs)
        for i, layer in enumerate(self.layers):
            ctx_k, ctx_v = self.ctx_k[i, :, : self.length], self.ctx_v[i, :, : self.length]
            x = x + layer.self_attn(layer.input_layernorm(x), ctx_k, ctx_v, rope)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = lm_head(self.norm(x[0, 1:])).float()  # [D, V]
        logp = torch.log_softmax(logits, dim=-1)
        top_logp, tokens = logp.max(dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return DraftOutput(tokens, top_logp.exp(), entropy)
