"""Static, preallocated caches of the target (DESIGN B.5).

Committed state: attention K/V up to `length`, each GDN layer's conv window and recurrent state.
Round buffers: what a verification pass retains so that the commit can advance every cache through
the `m` accepted tokens without re-running anything: the GDN compact factors `(z, k, g_cum)`
(DESIGN A.7) and the conv inputs of the tokens in flight. No per-token state buffer exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .config import TargetConfig


@dataclass
class TargetCache:
    key: Tensor  # [n_attn, B, max_len, n_kv, head_dim]
    value: Tensor  # [n_attn, B, max_len, n_kv, head_dim]
    conv: Tensor  # [n_gdn, B, conv_dim, K-1]   last K-1 conv inputs
    ssm: Tensor  # [n_gdn, B, HV, dv, dk] fp32 recurrent state S (o = S q)
    z: Tensor  # [n_gdn, B, T_max, HV, dv] fp32   round buffers: compact factors …
    k: Tensor  # [n_gdn, B, T_max, HK, dk]
    g_cum: Tensor  # [n_gdn, B, T_max, HV] fp32
    conv_in: Tensor  # [n_gdn, B, T_max, conv_dim]   … and conv inputs of the tokens in flight
    length: int = 0  # committed tokens

    @property
    def max_len(self) -> int:
        return self.key.shape[2]

    @property
    def max_tokens_per_pass(self) -> int:
        return self.z.shape[2]

    def reset(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()
        self.length = 0

    @classmethod
    def allocate(
        cls, cfg: TargetConfig, *, max_len: int, tokens_per_pass: int, dtype: torch.dtype, device, batch: int = 1
    ) -> "TargetCache":
        n_attn, n_gdn = len(cfg.attention_layers), len(cfg.gdn_layers)
        hv, hk = cfg.linear_num_value_heads, cfg.linear_num_key_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kv_shape = (n_attn, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
        f32 = torch.float32
        return cls(
            key=torch.zeros(kv_shape, dtype=dtype, device=device),
            value=torch.zeros(kv_shape, dtype=dtype, device=device),
            conv=torch.zeros(n_gdn, batch, cfg.gdn_conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=dtype, device=device),
            ssm=torch.zeros(n_gdn, batch, hv, dv, dk, dtype=f32, device=device),
            z=torch.zeros(n_gdn, batch, tokens_per_pass, hv, dv, dtype=f32, device=device),
            k=torch.zeros(n_gdn, batch, tokens_per_pass, hk, dk, dtype=f32, device=device),
            g_cum=torch.zeros(n_gdn, batch, tokens_per_pass, hv, dtype=f32, device=device),
            conv_in=torch.zeros(n_gdn, batch, tokens_per_pass, cfg.gdn_conv_dim, dtype=dtype, device=device),
        )
