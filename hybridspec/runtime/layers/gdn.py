"""Gated DeltaNet token mixer (DESIGN B.4), verifying T tokens against the committed state.

The layer never changes committed state: it reads its conv window and recurrent state
and leaves the compact factors and conv inputs of the T tokens in the round buffers; the model's
commit advances the state through the accepted prefix (DESIGN A.7, Eq. 7).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels.gdn import reference as gdn_reference
from ..cache import TargetCache
from ..config import TargetConfig
from .fusion import fuse_linears
from .norms import GatedRMSNorm


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: TargetConfig, verify: Callable):
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = cfg.gdn_conv_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, 2 * key_dim + value_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, eps=cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self._verify = verify
        self.conv_op = gdn_reference.causal_conv_silu  # the model sets the backend's (`kernels/gdn`)
        self.linear_op: Callable[[Tensor, Tensor], Tensor] = F.linear  # the projections' product (the model's)
        self._in_proj: Tensor | None = None  # the four input projections as one weight (`fuse_projections`)

    def fuse_projections(self) -> None:
        """The qkv, z, b and a projections as one GEMM (`fuse_linears`): one launch, one pass over x."""
        self._in_proj = fuse_linears(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(qkv, z, b, a) projections of x (separately where autograd is on: the fused tensor is not a
        parameter, the four views are)."""
        if self._in_proj is None or torch.is_grad_enabled():
            return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        sizes = (self.conv_dim, self.hv * self.dv, self.hv, self.hv)
        return self.linear_op(x, self._in_proj).split(sizes, dim=-1)

    def forward(self, x: Tensor, cache: TargetCache, index: int) -> Tensor:
        """x [B, T, hidden] → [B, T, hidden]; fills this layer's round buffers (row
        `index` of the cache's GDN tensors) for these T tokens."""
        B, T, _ = x.shape
        mixed, z, b, a = self._project(x)  # mixed: [B, T, conv_dim]
        # the conv inputs also go to the round buffer, from which the commit advances the window
        mixed = self.conv_op(mixed, cache.conv[index], self.conv1d.weight, x_out=cache.conv_in[index, :, :T])
        key_dim = self.hk * self.dk
        q, k, v = mixed.split((key_dim, key_dim, self.hv * self.dv), dim=-1)
        q, k = q.reshape(B, T, self.hk, self.dk), k.reshape(B, T, self.hk, self.dk)
        v = v.reshape(B, T, self.hv, self.dv)
        # the kernel L2-normalises q and k and forms the gates from the raw a, b [B, T, HV]:
        # log decay g = log α = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b)   (DESIGN B.4);
        # the compact factors land in the round buffers: z / |k|, g_cum and the raw k (`raw_keys`: exact
        # in the activation dtype, half the bytes of the normalised fp32 k with bf16 activations);
        # the previous round's commit of this layer, if still pending, is folded into the same launch
        o, _, _ = self._verify(q, k, v, a, b, self.A_log, self.dt_bias,
                               cache.ssm[index], self.dk**-0.5, z_out=cache.z[index, :, :T],
                               g_out=cache.g_cum[index, :, :T], k_out=cache.k[index, :, :T],
                               pending=cache.pending_commit(index), raw_keys=True)
        cache.mark_committed(index)  # the launch above folded the pending commit into this layer's state
        gate = z.reshape(B, T, self.hv, self.dv)
        o = self.norm(o, gate)  # [B, T, HV, dv] in x's dtype (o rounded to it first)
        return self.linear_op(o.reshape(B, T, -1), self.out_proj.weight)
