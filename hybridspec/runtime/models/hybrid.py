"""The hybrid GDN + MoE target (Qwen3.5 / Qwen3.6 / Qwen3-Next), split at the Layer-0 router.

    stage0(tokens[:u])  Layer-0 GDN + Layer-0 router on u tokens        (DESIGN A.4)
    stage1(s0, w)       Layer-0 experts on the first w ≤ u tokens, layers 1…L−1, norm, LM head
    commit(m)           advance KV length, conv windows and every GDN state through m tokens (Eq. 7)

A plain forward of T tokens is `stage1(stage0(tokens), T)`; prefill runs it chunk by chunk and
commits each chunk whole. Parameter names follow the Hugging Face `qwen3_5_moe_text` layout with
the `model.` prefix removed (the loaders of `models/` map other layouts onto it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import backends
from ..cache import TargetCache
from ..config import TargetConfig
from ..layers.attention import GatedAttention
from ..layers.gdn import GatedDeltaNet
from ..layers.moe import DenseMLP, Router, SparseMoE
from ..layers.norms import GatedRMSNorm, OffsetRMSNorm
from ..layers.rope import rope_cos_sin, rope_inv_freq


@dataclass
class Stage0:
    """What Stage 0 retains for Stage 1 (per token of the u run; Stage 1 reads only the first w)."""

    tokens: int  # u
    residual: Tensor  # [B, u, hidden]  Layer-0 hidden after the GDN residual add
    moe_input: Tensor  # [B, u, hidden]  post-attention norm output (router and experts input)
    expert_ids: Tensor  # [B, u, k]
    expert_weights: Tensor  # [B, u, k]


@dataclass
class PassOutput:
    tokens: int  # w
    logits: Tensor  # [B, w, vocab] fp32
    features: Tensor | None  # [B, w, n_taps·hidden]  hidden after each tapped layer (drafter context)
    expert_ids: list[Tensor] | None  # per MoE layer [B, w, k] when routing is recorded


def whole(t: Tensor) -> Tensor:
    """A layer output that is already complete (one process holds every head and column)."""
    return t


class DecoderLayer(nn.Module):
    """`reduce` completes the token mixer's and the MLP block's outputs: `whole` in one process, an
    all-reduce over the ranks under tensor parallelism (`runtime/tensor_parallel.py`)."""

    def __init__(self, cfg: TargetConfig, index: int, verify: Callable, experts: Callable):
        super().__init__()
        self.reduce: Callable[[Tensor], Tensor] = whole
        self.is_gdn = cfg.layer_types[index] == "linear_attention"
        if self.is_gdn:
            self.linear_attn = GatedDeltaNet(cfg, verify)
        else:
            self.self_attn = GatedAttention(cfg)
        dense = index in cfg.dense_layers
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size) if dense else SparseMoE(cfg, experts)
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, SparseMoE)

    def mix(self, h: Tensor, cache: TargetCache, index: int, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        """The token mixer's output on h = input_layernorm(x), completed by `reduce` (not yet added to
        x: the add is fused into the post-attention norm, `mlp_block`)."""
        h = self.linear_attn(h, cache, index) if self.is_gdn else self.self_attn(h, cache, index, rope)
        return self.reduce(h)

    def mlp_block(self, delta: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The MLP block on post_attention_layernorm(x'), x' = x + delta (the mixer's output): returns
        (the block's output, completed by `reduce`, x', the expert ids or None for a dense MLP). A MoE
        block applies the norm inside its router's launch where the backend can (`norm_route`)."""
        if self.is_moe:
            ids, weights, h, x = self.mlp.norm_route(delta, x, self.post_attention_layernorm)
            return self.reduce(self.mlp.run_experts(h, ids, weights)), x, ids
        h, x = self.post_attention_layernorm.add_norm(delta, x)
        return self.reduce(self.mlp(h)), x, None


class HybridTarget(nn.Module):
    def __init__(self, cfg: TargetConfig, *, backend: str = "torch", feature_layers: tuple[int, ...] = ()):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        verify, self._gdn_commit = backends.gdn_ops(backend)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        experts = backends.moe_experts_op(backend)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, verify, experts) for i in range(cfg.num_hidden_layers))
        self.norm = OffsetRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # each layer's row in the cache tensors of its kind
        self._cache_index = [cfg.gdn_layers.index(i) if t == "linear_attention" else cfg.attention_layers.index(i)
                      for i, t in enumerate(cfg.layer_types)]
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rotary_dim, cfg.rope_theta), persistent=False)
        self._rope_tables: tuple[Tensor, Tensor] | None = None  # `_rope`'s
        self.feature_layers = tuple(feature_layers)  # layers whose output the drafter reads (its target_layer_ids)
        offset_norm, gated_norm = backends.norm_ops(backend)
        route, norm_route = backends.router_ops(backend)
        attend, prepare = backends.attention_ops(backend)
        conv = backends.gdn_conv_op(backend)
        project = backends.linear_op(backend)
        for module in self.modules():
            if isinstance(module, Router):
                module.op = route
            elif isinstance(module, SparseMoE):
                module.norm_route_op = norm_route
            elif isinstance(module, GatedAttention):
                module.op, module.prepare_op, module.linear_op = attend, prepare, project
            elif isinstance(module, GatedDeltaNet):
                module.conv_op, module.linear_op = conv, project
            elif isinstance(module, OffsetRMSNorm):
                module.op = offset_norm
            elif isinstance(module, GatedRMSNorm):
                module.op = gated_norm
        self.head_op = project  # the LM head's product

    def fuse_projections(self) -> None:
        """Each layer's input projections as one GEMM (`GatedDeltaNet.fuse_projections`: q, k, v, z, b,
        a; `GatedAttention.fuse_projections`: q with its gate, k, v); called by the loaders once the
        weights are in place."""
        for layer in self.layers:
            (layer.linear_attn if layer.is_gdn else layer.self_attn).fuse_projections()

    # ---------------------------------------------------------------- caches
    def new_cache(self, *, max_len: int, tokens_per_pass: int = 64, batch: int = 1) -> TargetCache:
        p = self.embed_tokens.weight
        cache = TargetCache.allocate(self.cfg, max_len=max_len, tokens_per_pass=tokens_per_pass,
                                     dtype=p.dtype, device=p.device, batch=batch)
        self._rope(cache)
        return cache

    @property
    def rope_tables(self) -> tuple[Tensor, Tensor] | None:
        """`_rope`'s tables (None before the first cache)."""
        return self._rope_tables

    def _rope(self, cache: TargetCache) -> tuple[Tensor, Tensor]:
        """RoPE's tables cos, sin [max_len, R], row i for position i (a pass's attention reads the rows
        of its positions on the device); made again, at a new address, for a larger cache (captured
        graphs that read the old ones are then captured again: `ResidentDecoder.prepare`)."""
        table = self._rope_tables
        dtype, device = self.embed_tokens.weight.dtype, self.inv_freq.device
        if table is None or table[0].shape[0] < cache.max_len or table[0].dtype != dtype or table[0].device != device:
            positions = torch.arange(cache.max_len, device=device)
            self._rope_tables = table = rope_cos_sin(positions, self.inv_freq, dtype)
        return table

    def _check_room(self, cache: TargetCache, tokens: int) -> None:
        """Host-side bounds from the host's copy of the length (the resident round checks its
        budget once per request instead: every position it can reach fits the cache)."""
        if tokens > cache.max_tokens_per_pass:
            raise ValueError(f"{tokens} tokens in one pass; the cache's round buffers hold {cache.max_tokens_per_pass}")
        if cache.length + tokens > cache.max_len:
            raise ValueError(f"context of {cache.length + tokens} tokens exceeds the cache's {cache.max_len}")

    # ---------------------------------------------------------------- the split forward
    @torch.no_grad()
    def stage0(self, tokens: Tensor, cache: TargetCache) -> Stage0:
        """tokens [B, u] → Layer-0 GDN (factors left in the round buffers) and Layer-0 routing."""
        u = tokens.shape[1]
        self._check_room(cache, u)
        layer = self.layers[0]
        x = self.embed_tokens(tokens)
        delta = layer.mix(layer.input_layernorm(x), cache, 0, rope=None)  # [B, u, hidden]
        ids, weights, moe_input, residual = layer.mlp.norm_route(delta, x, layer.post_attention_layernorm)
        return Stage0(u, residual, moe_input, ids, weights)

    @torch.no_grad()
    def stage1(self, s0: Stage0, w: int, cache: TargetCache, *, record_routing: bool = False,
               features: bool = True) -> PassOutput:
        """Resume at the Layer-0 experts for the first w ≤ u tokens; reads no retained value beyond w.
        features: whether the pass returns the drafter's features (None otherwise)."""
        if not 1 <= w <= s0.tokens:
            raise ValueError(f"stage1 length w={w} must be in 1..{s0.tokens} (the Stage-0 length)")
        rope = self._rope(cache)
        layer0 = self.layers[0]
        ids, weights = s0.expert_ids[:, :w], s0.expert_weights[:, :w]
        # each layer's output is x + delta; the add is fused into the next norm, which also returns it
        delta = layer0.reduce(layer0.mlp.run_experts(s0.moe_input[:, :w], ids, weights))
        x = s0.residual[:, :w]
        routing = [ids] if record_routing else None
        taps = set(self.feature_layers) if features else set()
        outputs = {}
        for index in range(1, len(self.layers)):
            layer = self.layers[index]
            h, x = layer.input_layernorm.add_norm(delta, x)  # x: the output of layer index − 1
            if index - 1 in taps:
                outputs[index - 1] = x
            delta, x, ids = layer.mlp_block(layer.mix(h, cache, self._cache_index[index], rope), x)
            if routing is not None and ids is not None:
                routing.append(ids)
        normed, x = self.norm.add_norm(delta, x)
        if len(self.layers) - 1 in taps:
            outputs[len(self.layers) - 1] = x
        logits = self.head_op(normed, self.lm_head.weight).float()
        # in the drafter's order, repeats allowed (DFlash concatenates per listed layer)
        feats = torch.cat([outputs[i] for i in self.feature_layers], dim=-1) if taps else None
        return PassOutput(w, logits, feats, routing)

    def forward_pass(self, tokens: Tensor, cache: TargetCache, *, record_routing: bool = False,
                     features: bool = True) -> PassOutput:
        """Unsplit verification of all tokens [B, T] (nothing committed)."""
        return self.stage1(self.stage0(tokens, cache), tokens.shape[1], cache, record_routing=record_routing,
                           features=features)

    # ---------------------------------------------------------------- commit
    @torch.no_grad()
    def commit(self, cache: TargetCache, w: int, accepted: int | Tensor) -> None:
        """Advance every cache through the first `accepted` (= m) of the w tokens just verified: a
        number (the host advances its length too), or [B] long on the device (nothing read back:
        the caller advances `cache.length` once it reads m).

        The GDN states advance at each layer's next verification, which folds this commit into its
        launch (`TargetCache.defer_commit`); `flush` applies it now where the states are needed."""
        if isinstance(accepted, int) and not 1 <= accepted <= w:
            raise ValueError(f"commit of {accepted} tokens after a pass of {w}")
        self.flush(cache)  # a layer not verified since the last commit (none in a decoding round)
        cache.defer_commit(w, accepted)
        # the conv windows keep the last K−1 inputs before token m: window columns m … m+K−2
        window = torch.cat((cache.conv, cache.conv_in[:, :, :w].transpose(-1, -2)), dim=-1)  # [n, B, C, K−1+w]
        index = cache.accepted.view(1, -1, 1, 1) + cache.conv_columns  # [1, B, 1, K−1]
        torch.gather(window, -1, index.expand(cache.conv.shape), out=cache.conv)
        cache.position.add_(cache.accepted)
        if isinstance(accepted, int):
            cache.length += accepted

    @torch.no_grad()
    def flush(self, cache: TargetCache) -> None:
        """Commit the pending GDN states now (one all-layer `gdn_commit` when every layer waits), so
        that `cache.ssm` holds the committed state of every layer."""
        layers = cache.waiting_layers()
        if not layers:
            return
        spans = [(0, len(cache.pending))] if len(layers) == len(cache.pending) else [(i, i + 1) for i in layers]
        for lo, hi in spans:
            self._gdn_commit(cache.ssm[lo:hi], *cache.pending_span(lo, hi))
        cache.mark_committed()

    def enter_static(self, cache: TargetCache, span: int) -> None:
        """The round's static form, as the resident round and the timed passes run it: the pending
        commit flushed, then a null one over `span` round tokens (every pass folds a commit of the
        same shape), and attention over the whole key cache under its device-side mask."""
        self.flush(cache)
        cache.null_commit(span)
        cache.fixed_pending, cache.key_span = span, cache.max_len

    # ---------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, tokens: Tensor, cache: TargetCache, *, all_logits: bool = False,
                each_chunk: Callable[[Tensor, int], None] | None = None) -> PassOutput:
        """Run and commit a prompt [B, T] in chunks of the round-buffer size.

        Returns the last token's logits (all tokens' with `all_logits`) and every token's features.
        `each_chunk(logits [B, c, V], start)` sees every chunk's logits (rows start … start + c − 1)
        before they are dropped (prompt logprobs without holding [T, V])."""
        chunk = cache.max_tokens_per_pass
        logits, features = [], []
        for start in range(0, tokens.shape[1], chunk):
            part = tokens[:, start : start + chunk]
            out = self.forward_pass(part, cache)
            self.commit(cache, part.shape[1], part.shape[1])
            if each_chunk is not None:
                each_chunk(out.logits, start)
            logits.append(out.logits if all_logits else out.logits[:, -1:])
            if out.features is not None:
                features.append(out.features)
        all_l = torch.cat(logits, dim=1) if all_logits else logits[-1]
        return PassOutput(tokens.shape[1], all_l, torch.cat(features, dim=1) if features else None, None)
