"""Mixture-of-Experts block: softmax top-k router, routed experts (fused 3-D weights), shared
expert scaled by `sigmoid(shared_expert_gate)`. The router and the experts are separate calls so
that Stage 0 can stop at the router boundary (DESIGN A.4)."""

from __future__ import annotations

import contextlib
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
    router's ids, and the others' assignments add nothing here (another rank runs them).

    `shared_beside_from` (None: never): for calls of at least that many tokens (B · T), `forward`
    runs the shared expert as a call of its own beside the router and the routed experts (on a
    second CUDA stream, forked before the router and joined before the sum), instead of as one more
    program row of the routed experts' launches; at batch 1, 2 keeps one-token passes as they are and
    changes verification passes."""

    def __init__(self, cfg: TargetConfig, experts_op: Callable = moe_reference.moe_experts):
        super().__init__()
        self.experts_op = experts_op
        self.first_expert = 0
        self.shared_beside_from: int | None = None
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → (MoE output [B, T, hidden], expert ids [B, T, k]): `route`, then
        `run_experts`; from `shared_beside_from` tokens on, the shared expert beside both."""
        flat = x.reshape(-1, x.shape[-1])
        if self.shared_beside_from is None or flat.shape[0] < self.shared_beside_from:
            ids, weights = self.route(x)
            return self.run_experts(x, ids, weights), ids
        main = torch.cuda.current_stream(x.device) if x.is_cuda else None
        side = _side_stream(x.device) if x.is_cuda else None
        if side is not None and side.cuda_stream == main.cuda_stream:  # never forked onto itself
            side = None
        shared_out = torch.empty_like(flat)  # [N, hidden], allocated on the main stream, written beside it
        if side is not None:
            side.wait_stream(main)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            none_held = torch.full((flat.shape[0], 1), -1, dtype=torch.long, device=x.device)  # [N, 1]: no expert
            shared_out.copy_(self._experts(flat, none_held, flat.new_empty(flat.shape[0], 1), self.shared()))
        try:
            ids, weights = self.route(x)
            routed = self._experts(flat, ids.reshape(-1, ids.shape[-1]), weights.reshape(-1, weights.shape[-1]), None)
        finally:  # joined even when a call raises, so a capture reports that error, not an unjoined stream
            if side is not None:
                main.wait_stream(side)
        return routed.add_(shared_out).view_as(x), ids

    def shared(self) -> SharedExpert:
        """The shared expert's weights in the kernels' layout."""
        return SharedExpert(self.shared_expert.gate_proj.weight, self.shared_expert.up_proj.weight,
                            self.shared_expert.down_proj.weight, self.shared_expert_gate.weight)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, hidden] → ids, weights [B, T, k]."""
        ids, weights = self.gate(x.reshape(-1, x.shape[-1]))
        return ids.view(*x.shape[:-1], -1), weights.view(*x.shape[:-1], -1)

    def run_experts(self, x: Tensor, ids: Tensor, weights: Tensor) -> Tensor:
        """x [B, T, hidden] with its routing → MoE output [B, T, hidden] (routed + gated shared)."""
        out = self._experts(x.reshape(-1, x.shape[-1]), ids.reshape(-1, ids.shape[-1]),
                            weights.reshape(-1, weights.shape[-1]), self.shared())
        return out.view_as(x)

    def _experts(self, x: Tensor, ids: Tensor, weights: Tensor, shared: SharedExpert | None) -> Tensor:
        """`experts_op` on x [N, hidden], ids / weights [N, k] over the experts held here (the weights
        are never read for ids −1: none held)."""
        return self.experts_op(x, ids, weights, self.experts.gate_up_proj, self.experts.down_proj, shared,
                               first_expert=self.first_expert)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The second stream of a CUDA device that `SparseMoE.forward` runs the shared expert on: from
    torch's pool of high-priority streams, apart from the default-priority ones that CUDA-graph
    capture and warm-up take, so it is never the stream being captured (and the short side chain is
    scheduled ahead of the routed one's programs)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device, priority=-1)
    return _SIDE_STREAMS[device]
