"""Mixture-of-Experts block: softmax top-k router, routed experts (fused 3-D weights), shared
expert scaled by `sigmoid(shared_expert_gate)`. The router and the experts are separate calls so
that Stage 0 can stop at the router boundary (DESIGN A.4)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...kernels.moe import SharedExpert
from ...kernels.moe import reference as moe_reference
from ..config import TargetConfig
from .norms import OffsetRMSNorm


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.linear_op: Callable[[Tensor, Tensor], Tensor] = F.linear  # the products (the drafter's backend's)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.linear_op(x, self.gate_proj.weight), self.linear_op(x, self.up_proj.weight)
        return self.linear_op(F.silu(gate) * up, self.down_proj.weight)


class Router(nn.Module):
    """Softmax top-k router; `op` turns the input and the router's weight into ids and weights
    (`kernels/moe`: the reference, or the Triton router, one launch for calls of up to 16 tokens)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))
        self.op = moe_reference.router

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, hidden] → expert ids [N, k] (long), routing weights [N, k] in x's dtype."""
        return self.op(x, self.weight, self.top_k, self.renormalize, x.dtype)


class Experts(nn.Module):
    """The routed experts' weights in the fused 3-D layout of the checkpoints: all of them, or under
    expert parallelism this process's `cfg.local_experts`."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        e, h, i = cfg.local_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, h))  # [E, 2I, hidden]
        self.down_proj = nn.Parameter(torch.zeros(e, h, i))  # [E, hidden, I]


class SparseMoE(nn.Module):
    """Router, routed experts and gated shared expert. `experts_op` computes the experts' sum
    (`kernels/moe`: the reference, or the Triton kernels with no host read). Under expert
    parallelism the experts held are [first_expert, first_expert + cfg.local_experts) of the
    router's ids, and the others' assignments add nothing here (another rank runs them)."""

    def __init__(self, cfg: TargetConfig, experts_op: Callable = moe_reference.moe_experts):
        super().__init__()
        self.experts_op = experts_op
        # the post-attention norm inside the router's launch (`kernels/moe`'s `norm_router`), set by the
        # model for its backend; where it is None or returns None, `norm_route` runs the norm, then the router
        self.norm_route_op: Callable | None = None
        self.first_expert = 0
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → (MoE output [B, T, hidden], expert ids [B, T, k]): `route`, then
        `run_experts`."""
        ids, weights = self.route(x)
        return self.run_experts(x, ids, weights), ids

    def shared(self) -> SharedExpert:
        """The shared expert's weights in the kernels' layout."""
        return SharedExpert(self.shared_expert.gate_proj.weight, self.shared_expert.up_proj.weight,
                            self.shared_expert.down_proj.weight, self.shared_expert_gate.weight)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → ids, weights [B, T, k]."""
        ids, weights = self.gate(x.reshape(-1, x.shape[-1]))
        return ids.view(*x.shape[:-1], -1), weights.view(*x.shape[:-1], -1)

    def norm_route(self, x: Tensor, residual: Tensor, norm: OffsetRMSNorm) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x, residual [B, T, hidden] → (ids, weights [B, T, k], h, s [B, T, hidden]): the routing of
        h = norm(s), s = x + residual, `norm` being the decoder layer's post-attention norm, applied
        inside the router's launch where the backend can (h is the experts' input)."""
        flat = x.reshape(-1, x.shape[-1])
        fused = None
        if self.norm_route_op is not None:
            fused = self.norm_route_op(flat, norm.weight, norm.eps, residual.reshape(flat.shape), self.gate.weight,
                                       self.gate.top_k, self.gate.renormalize, x.dtype)
        if fused is None:
            h, s = norm.add_norm(x, residual)
            return (*self.route(h), h, s)
        ids, weights, h, s = fused
        lead = x.shape[:-1]
        return ids.view(*lead, -1), weights.view(*lead, -1), h.view_as(x), s.view_as(x)

    def run_experts(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """x [B, T, hidden] with its routing → MoE output [B, T, hidden] (routed + gated shared)."""
        out = self.experts_op(x.reshape(-1, x.shape[-1]), ids.reshape(-1, ids.shape[-1]),
                              weights.reshape(-1, weights.shape[-1]), self.experts.gate_up_proj,
                              self.experts.down_proj, self.shared(), first_expert=self.first_expert)
        return out.view_as(x)
