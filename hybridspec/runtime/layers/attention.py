"""Gated softmax attention over the static KV cache (DESIGN B.4: `q_proj` is 2× wide, the second
half gates the output through a sigmoid; q/k RMS-normed per head; partial RoPE)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...kernels.attention import reference as attention_reference
from ..cache import TargetCache
from ..config import TargetConfig
from .fusion import fuse_linears
from .norms import OffsetRMSNorm


class GatedAttention(nn.Module):
    """`op` computes the gated attention over the cache and `prepare_op` the q/k norms, RoPE and the
    cache writes before it (`kernels/attention`: the references, or the Triton kernels that read the
    position on the device); `linear_op` the projections' product; the model sets all three per
    backend."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.op: Callable = attention_reference.gated_attention
        self.prepare_op: Callable = attention_reference.norm_rope_store
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = OffsetRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self._qkv: Tensor | None = None  # q (with its gate), k and v projections as one weight
        self.linear_op: Callable[[Tensor, Tensor], Tensor] = torch.nn.functional.linear

    def fuse_projections(self) -> None:
        """The q (2× wide), k and v projections as one GEMM (`fuse_linears`)."""
        self._qkv = fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(q with gate, k, v) projections of x (separately where autograd is on: the fused tensor is
        not a parameter, the three views are)."""
        if self._qkv is None or torch.is_grad_enabled():
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv = self.n_kv * self.head_dim
        return self.linear_op(x, self._qkv).split((2 * self.n_heads * self.head_dim, kv, kv), dim=-1)

    def forward(self, x: Tensor, cache: TargetCache, index: int, rope: tuple[Tensor, Tensor]) -> Tensor:
        """x [B, T, hidden] at positions p … p+T−1 (p = cache.position, on the device); writes their
        K/V into the cache. `op` reads keys up to `cache.key_span` (static) or, when the host knows
        the length, up to length + T; the Triton kernels read the length on the device instead."""
        B, T, _ = x.shape
        q_gate, k, v = self._project(x)
        q, gate = q_gate.view(B, T, self.n_heads, 2 * self.head_dim).chunk(2, dim=-1)
        kv_shape = (B, T, self.n_kv, self.head_dim)
        q = self.prepare_op(q, k.view(kv_shape), v.view(kv_shape), self.q_norm.weight, self.k_norm.weight,
                            self.q_norm.eps, *rope, cache.key[index], cache.value[index], cache.position)
        out = self.op(q, gate, cache.key[index], cache.value[index], cache.position, cache.key_span or cache.length + T)
        return self.linear_op(out, self.o_proj.weight)
