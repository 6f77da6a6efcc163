"""The DFlash parallel block drafter (DESIGN B.4).

Context: the target's hidden states after the layers in `target_layer_ids`, concatenated, mapped by
`fc` and `hidden_norm`; every layer's K/V of the context come from that one projection and are
cached, advancing only through committed tokens. A block is `[anchor, MASK × (block_size − 1)]`
at the positions after the context; the block attends (non-causally) to the context and to
itself; one pass gives D = block_size − 1 draft tokens with top-1 confidence and entropy.

The context length lives on the device (`position`; `length` is the host's copy), as the target's
does (`cache.py`): a proposal writes the block's K/V right after the context and attends to the
cache up to a host-known bound, or over a static span masked on the device (`key_span`, the
GPU-resident round); `extend` writes the features of all w verified tokens and advances by m.
`set_ops` gives the drafter its backend's kernels (`backends.drafter_ops`): the RMS norms
(the residual adds fused in), the q/k norms with RoPE and the cache writes in one launch per layer,
the block attention, which reads only the live context [0, p + block_size), p read on the device,
whatever the cache's size, and the draft tokens' statistics from the logits in one launch. Without
them every op is plain PyTorch (SDPA for the attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels.attention import reference as attention_reference
from ..kernels.sampling import reference as sampling_reference
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
        # (q, k, v, q_weight, k_weight, eps, cos, sin, key cache, value cache, position) → q normed and
        # roped, k normed and roped and v written into the caches (`kernels/attention`'s norm_rope_store
        # with the plain norm)
        self.prepare_op: Callable = partial(attention_reference.norm_rope_store, offset=False)
        # (q [B, T, H, hd], the whole context cache's K, V [B, S, n_kv, hd], position [1]) → [B, T, H·hd],
        # every query over [0, position + T) (`kernels/attention`'s block_attention); None: SDPA over the
        # keys up to `span`, masked by `visible`
        self.block_op: Callable | None = None
        self.linear_op: Callable[[Tensor, Tensor], Tensor] = F.linear  # the projections' product

    def key_value(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → K, V [B, T, n_kv, head_dim] (K normed and rotated by rope's cos, sin [T, hd],
        a row per token of x): the training's form."""
        B, T, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)), *rope)
        return k, self.v_proj(x).view(B, T, self.n_kv, self.head_dim)

    def write(self, x: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor], position: Tensor) -> None:
        """The context's K, V of x [B, T, hidden] into key, value [B, S, n_kv, hd] at position[0] + t; rope:
        RoPE's tables cos, sin [S, hd] by position."""
        B, T, _ = x.shape
        k = self.linear_op(x, self.k_proj.weight).view(B, T, self.n_kv, self.head_dim)
        v = self.linear_op(x, self.v_proj.weight).view(B, T, self.n_kv, self.head_dim)
        no_queries = k.new_empty(B, T, 0, self.head_dim)
        self.prepare_op(no_queries, k, v, self.q_norm.weight, self.k_norm.weight, self.k_norm.eps, *rope, key,
                        value, position)

    def forward(self, x: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor], position: Tensor,
                span: int, visible: Tensor | None) -> Tensor:
        """x [B, T, hidden], the block at positions position[0] + t: its K/V written into key, value
        [B, S, n_kv, hd] (the context cache), then every query over the context and the whole block
        (not causal within it) → [B, T, hidden]; rope: RoPE's tables cos, sin [S, hd] by position. SDPA
        reads the keys [0, span), masked by visible [1 or T, span] (None: all); `block_op` reads
        [0, position + T) of the whole cache."""
        B, T, _ = x.shape
        q = self.linear_op(x, self.q_proj.weight).view(B, T, self.n_heads, self.head_dim)
        k = self.linear_op(x, self.k_proj.weight).view(B, T, self.n_kv, self.head_dim)
        v = self.linear_op(x, self.v_proj.weight).view(B, T, self.n_kv, self.head_dim)
        q = self.prepare_op(q, k, v, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, *rope, key, value,
                            position)  # [B, T, H, hd]
        if self.block_op is not None:
            return self.linear_op(self.block_op(q, key, value, position), self.o_proj.weight)
        keys, values = key[:, :span], value[:, :span]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=visible, enable_gqa=True)
        return self.linear_op(out.transpose(1, 2).reshape(B, T, -1), self.o_proj.weight)


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
        # logits [D, V] → tokens [D] long, top-1 probabilities and entropies [D] fp32
        self.statistics_op: Callable = sampling_reference.draft_statistics
        self.linear_op: Callable[[Tensor, Tensor], Tensor] = F.linear  # `fc`'s and the LM head's product
        self.ctx_k: Tensor | None = None  # [n_layers, B, max_len + block_size, n_kv, hd]
        self.ctx_v: Tensor | None = None
        self.position: Tensor | None = None  # [1] long, context length on the device
        self.rope: tuple[Tensor, Tensor] | None = None  # cos, sin [ctx_k's positions, head_dim]
        self.length = 0  # the host's copy
        self.key_span: int | None = None  # static key span of the resident round (None: host-known)

    @property
    def draft_len(self) -> int:
        return self.cfg.draft_len

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    def reset(self, max_len: int) -> None:
        """Allocate (or reuse) the context cache for a request of at most max_len positions (plus
        room for the block drafted after them)."""
        p = self.fc.weight
        size = max_len + self.cfg.block_size
        shape = (len(self.layers), 1, size, self.cfg.num_key_value_heads, self.cfg.head_dim)
        if self.ctx_k is None or self.ctx_k.shape[2] < size:
            self.ctx_k = torch.zeros(shape, dtype=p.dtype, device=p.device)
            self.ctx_v = torch.zeros(shape, dtype=p.dtype, device=p.device)
            self.position = torch.zeros(1, dtype=torch.long, device=p.device)
            # RoPE's tables [size, head_dim], row i for position i (read on the device by position)
            self.rope = rope_cos_sin(torch.arange(size, device=p.device), self.inv_freq, p.dtype)
        self.position.zero_()
        self.length, self.key_span = 0, None

    def set_ops(self, *, norm: Callable, prepare: Callable, block_attention: Callable | None,
                statistics: Callable, linear: Callable) -> None:
        """The backend's ops (`backends.drafter_ops`): every RMS norm's `op`, every layer's
        `prepare_op` (its q/k norms, RoPE and cache writes) and `block_op` (None: SDPA), the block's
        tokens, confidences and entropies from its logits (`statistics_op`), and every product
        (`linear_op`: the context projection, the layers', the LM head's)."""
        self.statistics_op, self.linear_op = statistics, linear
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.op = norm
            if isinstance(module, (DraftAttention, DenseMLP)):
                module.linear_op = linear
        for layer in self.layers:
            layer.self_attn.prepare_op, layer.self_attn.block_op = prepare, block_attention

    @torch.no_grad()
    def extend(self, features: Tensor, accepted: Tensor | None = None) -> None:
        """Append committed tokens' target features [1, w, n_taps·hidden] to the context: all w, or
        the first `accepted` ([1] long on the device; the rest is written and later overwritten)."""
        w = features.shape[1]
        if self.length + w > self.ctx_k.shape[2]:
            raise ValueError(f"drafter context of {self.length + w} positions exceeds its cache ({self.ctx_k.shape[2]})")
        ctx = self.hidden_norm(self.linear_op(features.to(self.fc.weight.dtype), self.fc.weight))
        for i, layer in enumerate(self.layers):
            layer.self_attn.write(ctx, self.ctx_k[i], self.ctx_v[i], self.rope, self.position)
        if accepted is None:
            self.position.add_(w)
            self.length += w
        else:
            self.position.add_(accepted)

    @torch.no_grad()
    def propose(self, anchor: int | Tensor) -> DraftOutput:
        """Draft D tokens after the anchor (a number, or [1] long on the device), which sits at the
        position right after the context."""
        embed, lm_head = self._target
        bs = self.cfg.block_size
        device = self.fc.weight.device
        block = torch.full((1, bs), self.cfg.mask_token_id, dtype=torch.long, device=device)
        if isinstance(anchor, Tensor):
            block = torch.cat((anchor.view(1, 1), block[:, 1:]), dim=1)
        else:
            block[0, 0] = anchor
        x = embed(block).to(self.fc.weight.dtype)  # [1, bs, hidden]
        whole = self.layers[0].self_attn.block_op is not None  # the kernel reads [0, p + bs) on the device
        span = self.ctx_k.shape[2] if whole else self.key_span or self.length + bs
        visible = None
        if not whole and self.key_span is not None:  # the context and the whole block; beyond, only stale keys
            visible = torch.arange(span, device=device)[None, :] <= self.position[0] + bs - 1  # [1, span]
        delta = None  # the last layer's MLP output, added to x inside the next norm's launch
        for i, layer in enumerate(self.layers):
            h, x = (layer.input_layernorm(x), x) if delta is None else layer.input_layernorm.add_norm(delta, x)
            attended = layer.self_attn(h, self.ctx_k[i], self.ctx_v[i], self.rope, self.position, span, visible)
            h, x = layer.post_attention_layernorm.add_norm(attended, x)
            delta = layer.mlp(h)
        h = self.norm(x) if delta is None else self.norm.add_norm(delta, x)[0]
        return DraftOutput(*self.statistics_op(self.linear_op(h[0, 1:], lm_head.weight)))  # from the logits [D, V]
