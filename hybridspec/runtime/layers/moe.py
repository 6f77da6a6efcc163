"""Mixture-of-Experts block: softmax top-k router, routed experts (fused 3-D weights), shared
expert scaled by `sigmoid(shared_expert_gate)`. The router and the experts are separate calls so
that Stage 0 can stop at the router boundary (DESIGN A.4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, cfg.hidden_size))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, hidden] → expert ids [N, k] (long), routing weights [N, k] in x's dtype."""
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return ids, weights.to(x.dtype)


class Experts(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, h))  # [E, 2I, hidden]
        self.down_proj = nn.Parameter(torch.zeros(e, h, i))  # [E, hidden, I]

    def forward(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """x [N, hidden], ids/weights [N, k] → Σ_k weight · expert(x)  [N, hidden].

        Torch backend: one grouped matmul per distinct expert (a host read of the expert counts)."""
        out = torch.zeros_like(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.gate_up_proj.shape[0]).tolist()
        token = order // ids.shape[1]  # [N·k] token of each sorted assignment
        w = weights.reshape(-1)[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = token[start : start + count]
            gate, up = F.linear(x[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert]) * w[start : start + count, None]
            out.index_add_(0, rows, y.to(out.dtype))
            start += count
        return out


class SparseMoE(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → ids, weights [B, T, k]."""
        ids, weights = self.gate(x.reshape(-1, x.shape[-1]))
        return ids.view(*x.shape[:-1], -1), weights.view(*x.shape[:-1], -1)

    def run_experts(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """x [B, T, hidden] with its routing → MoE output [B, T, hidden] (routed + gated shared)."""
        flat = x.reshape(-1, x.shape[-1])
        routed = self.experts(flat, ids.reshape(-1, ids.shape[-1]), weights.reshape(-1, weights.shape[-1]))
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return (routed + shared).view_as(x)
