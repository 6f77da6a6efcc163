"""Plain-PyTorch references for the MoE block's experts (DESIGN B.4), layouts in `checks.py`.

For token n with experts ids[n, :] and routing weights w[n, :],

    out_n = sum_j w_nj · down_e (silu(gate_e x_n) * up_e x_n)            (e = ids[n, j])
          + sigmoid(x_n · gate_weight) · shared_down (silu(shared_gate x_n) * shared_up x_n)

`moe_experts` groups the assignments by expert and runs one matmul pair per distinct expert; it
reads the expert counts on the host (`tolist`), which is what makes it the fast choice on a CPU
and unusable inside a CUDA graph. `moe_experts_sync_free` computes the same sum with no host read
and shapes that do not depend on the routing, by gathering every assignment's weights (memory
N·k·3·I·H: a reference for tests, not a GPU path).

Under expert parallelism a process holds the experts [first_expert, first_expert + E) of the whole
set (`gate_up` and `down` are those E), `ids` stay the router's ids into the whole set, and an
assignment to an expert held elsewhere contributes nothing here: the ranks' outputs sum to the
whole block's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridspec.kernels.moe.checks import SharedExpert, check_moe_args
from hybridspec.kernels.norm import reference as norm_reference


def router_topk(logits: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Router logits [N, E] → expert ids [N, k] (long, by decreasing probability) and routing weights
    [N, k] in `dtype`: the top k of softmax(logits) in fp32, renormalized to sum 1 when asked."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights.to(dtype)


def router(x: Tensor, weight: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """x [N, H], router weight [E, H] → `router_topk` of the logits x Wᵀ (in x's dtype, as the model's
    linear layer returns them)."""
    return router_topk(F.linear(x, weight), top_k, renormalize, dtype)


def norm_router(x: Tensor, norm_weight: Tensor, eps: float, residual: Tensor | None, weight: Tensor, top_k: int,
                renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The MoE's input norm, then `router`: x, residual [N, H] (residual may be None), norm_weight [H]
    (zero-centred) → (ids [N, k], weights [N, k], h = offset_rms_norm(s) [N, H], s = x + residual)."""
    h, s = norm_reference.offset_rms_norm(x, norm_weight, eps, residual)
    return (*router(h, weight, top_k, renormalize, dtype), h, s)


def shared_expert(x: Tensor, shared: SharedExpert) -> Tensor:
    """x [N, H] → sigmoid(x · gate_weight) · shared MLP(x)  [N, H]."""
    mlp = F.linear(F.silu(F.linear(x, shared.gate)) * F.linear(x, shared.up), shared.down)
    return torch.sigmoid(F.linear(x, shared.gate_weight)) * mlp


def moe_experts(x: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                shared: SharedExpert | None = None, *, first_expert: int = 0) -> Tensor:
    """Routed experts (one grouped matmul per distinct expert held here) plus the gated shared
    expert  [N, H]."""
    e = check_moe_args("moe_experts", x, ids, weights, gate_up, down, shared)[2]
    out = torch.zeros_like(x)
    flat = ids.reshape(-1) - first_expert  # [N·k] index into the experts held here
    mine = (flat >= 0) & (flat < e)
    order = torch.argsort(torch.where(mine, flat, e), stable=True)  # assignments held elsewhere last
    counts = torch.bincount(flat[mine], minlength=e).tolist()
    token = order // ids.shape[1]  # [N·k] token of each sorted assignment
    w = weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token[start : start + count]
        gate, up = F.linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[expert]) * w[start : start + count, None]
        out.index_add_(0, rows, y.to(out.dtype))
        start += count
    return out if shared is None else out + shared_expert(x, shared)


def moe_experts_sync_free(x: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                          shared: SharedExpert | None = None, *, first_expert: int = 0) -> Tensor:
    """`moe_experts` with no host read: every assignment's expert weights gathered  [N, H]."""
    e = check_moe_args("moe_experts_sync_free", x, ids, weights, gate_up, down, shared)[2]
    local = ids - first_expert  # [N, k]
    mine = (local >= 0) & (local < e)
    local = local.clamp(0, e - 1)  # an expert held elsewhere: any row, weighted by zero below
    gate, up = torch.einsum("nh,nkih->nki", x, gate_up[local]).chunk(2, dim=-1)  # [N, k, I] each
    y = torch.einsum("nki,nkhi->nkh", F.silu(gate) * up, down[local])  # [N, k, H]
    out = (y * torch.where(mine, weights, 0)[..., None]).sum(1)
    return out if shared is None else out + shared_expert(x, shared)
