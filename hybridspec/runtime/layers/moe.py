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


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """The softmax top-k router's weight and settings (the call is `SparseMoE.route`)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))


class Experts(nn.Module):
    """The routed experts' weights in the fused 3-D layout of the checkpoints."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, h))  # [E, 2I, hidden]
        self.down_proj = nn.Parameter(torch.zeros(e, h, i))  # [E, hidden, I]


class SparseMoE(nn.Module):
    """Router, routed experts and gated shared expert. `route_op` routes (and may compute the shared
    expert's activation in the same call), `experts_op` computes the experts' sum (`kernels/moe`:
    the references, or the Triton kernels with no host read); the model sets both per backend."""

    def __init__(self, cfg: TargetConfig, experts_op: Callable = moe_reference.moe_experts,
                 route_op: Callable = moe_reference.route):
        super().__init__()
        self.experts_op = experts_op
        self.route_op = route_op
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def _shared(self) -> SharedExpert:
        return SharedExpert(self.shared_expert.gate_proj.weight, self.shared_expert.up_proj.weight,
                            self.shared_expert.down_proj.weight, self.shared_expert_gate.weight)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """x [B, T, hidden] → ids, weights [B, T, k], and the shared expert's activation [B, T, Is]
        when the route op computed it (else None: `run_experts` computes it)."""
        flat = x.reshape(-1, x.shape[-1])
        ids, weights, act = self.route_op(flat, self.gate.weight, self.gate.top_k, self.gate.renormalize, x.dtype,
                                          self._shared())
        lead = x.shape[:-1]
        return ids.view(*lead, -1), weights.view(*lead, -1), None if act is None else act.view(*lead, -1)

    def run_experts(self, x: Tensor, ids: Tensor, weights: Tensor, shared_act: Tensor | None = None) -> Tensor:
        """x [B, T, hidden] with its routing (and the shared expert's activation, if `route` gave it)
        → MoE output [B, T, hidden] (routed + gated shared)."""
        out = self.experts_op(x.reshape(-1, x.shape[-1]), ids.reshape(-1, ids.shape[-1]),
                              weights.reshape(-1, weights.shape[-1]), self.experts.gate_up_proj,
                              self.experts.down_proj, self._shared(),
                              shared_act=None if shared_act is None else shared_act.reshape(-1, shared_act.shape[-1]))
        return out.view_as(x)
