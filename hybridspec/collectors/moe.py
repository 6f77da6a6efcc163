"""The MoE expert bench (DESIGN A.9, `η`): one MoE layer of the model (its real weights and shapes),
16 rows × top-k token–expert assignments held fixed, the number of distinct experts swept from
top-k to min(16·k, E); latency samples of the layer's expert computation (routed + shared).

The routing is constructed, not computed: assignment j (row j // k, slot j % k) goes to expert
S[j mod n] of a seeded permutation S, which gives exactly n distinct experts and k distinct
experts per row whenever k ≤ n ≤ 16·k. On CUDA each n is timed as the replay of its CUDA graph, as
the resident round runs the experts (an eager call would time its Python launches instead); with
--no-graphs, where the round runs eagerly, and elsewhere the call itself. A unit is one measurement
block: every n, in a random order seeded by (seed, block), `per_block` samples each
(`common.block_counts`); `prepare` runs the warm-up calls (unrecorded).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..workbench.profiling import replayable
from ..workbench.timing import sample_latencies, timing_params
from .common import PassContext, Unit, block_counts, block_order

ROWS = 16
QUICK_POINTS = 6  # distinct-expert counts with --quick


def routing_with_distinct(n_rows: int, top_k: int, n_distinct: int, num_experts: int, seed: int = 0) -> Tensor:
    """Expert ids [n_rows, top_k] using exactly `n_distinct` experts, each row's k ids distinct."""
    if not top_k <= n_distinct <= min(n_rows * top_k, num_experts):
        raise ValueError(f"n_distinct={n_distinct} outside {top_k}..{min(n_rows * top_k, num_experts)}")
    chosen = torch.randperm(num_experts, generator=torch.Generator().manual_seed(seed))[:n_distinct]
    slots = torch.arange(n_rows * top_k).view(n_rows, top_k)  # [rows, k]: k consecutive slots per row
    return chosen[slots % n_distinct]


def distinct_sweep(top_k: int, num_experts: int, quick: bool) -> list[int]:
    """top-k … min(16·k, E): every count, or about QUICK_POINTS evenly spread with --quick."""
    low, high = top_k, min(ROWS * top_k, num_experts)
    if not quick or high - low + 1 <= QUICK_POINTS:
        return list(range(low, high + 1))
    step = (high - low) / (QUICK_POINTS - 1)
    return sorted({round(low + i * step) for i in range(QUICK_POINTS)})


class MoePass:
    name = "moe"

    def _layer(self, ctx: PassContext) -> int:
        return next(i for i, layer in enumerate(ctx.session.target.layers) if layer.is_moe)

    def _sweep(self, ctx: PassContext) -> list[int]:
        cfg = ctx.session.target.cfg
        return distinct_sweep(cfg.num_experts_per_tok, cfg.num_experts, ctx.config.quick)

    def params(self, ctx: PassContext) -> dict:
        cfg, (blocks, per_block, warmup) = ctx.session.target.cfg, block_counts(ctx)
        return {**ctx.timed_params(), "layer": self._layer(ctx), "n_rows": ROWS, "top_k": cfg.num_experts_per_tok,
                "num_experts": cfg.num_experts, "distinct": self._sweep(ctx), "samples": blocks * per_block,
                "blocks": blocks, "per_block": per_block, "order": "seeded random per block", "warmup": warmup,
                **timing_params(ctx.device, ctx.config.graphs)}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"block={b}", b) for b in range(block_counts(ctx)[0])]

    def prepare(self, ctx: PassContext) -> None:
        target = ctx.session.target
        self.layer = self._layer(ctx)
        self.mlp = target.layers[self.layer].mlp
        p = target.embed_tokens.weight
        gen = torch.Generator().manual_seed(ctx.config.seed)
        self.x = torch.randn(1, ROWS, target.cfg.hidden_size, generator=gen).to(device=p.device, dtype=p.dtype)
        for n in self._sweep(ctx):  # unrecorded warm-up of every n
            sample_latencies(self._call(ctx, n), samples=1, warmup=block_counts(ctx)[2], device=ctx.device)
        self.calls = {n: replayable(self._call(ctx, n), ctx.device, graphs=ctx.config.graphs)
                      for n in self._sweep(ctx)}

    def _call(self, ctx: PassContext, n: int):
        cfg = ctx.session.target.cfg
        k = cfg.num_experts_per_tok
        ids = routing_with_distinct(ROWS, k, n, cfg.num_experts, ctx.config.seed).to(ctx.device)[None]  # [1, 16, k]
        weights = torch.full(ids.shape, 1.0 / k, dtype=self.x.dtype, device=ctx.device)
        return lambda: self.mlp.run_experts(self.x, ids, weights)

    def collect(self, ctx: PassContext, block: int) -> dict[str, list[dict]]:
        _, per_block, _ = block_counts(ctx)
        k = ctx.session.target.cfg.num_experts_per_tok
        rows = []
        for order, n in enumerate(block_order(self._sweep(ctx), ctx.config.seed, block)):
            latencies = sample_latencies(self.calls[n], samples=per_block, warmup=0, device=ctx.device)
            rows += [{"run_id": ctx.run_id, "layer": self.layer, "n_rows": ROWS, "n_assignments": ROWS * k,
                      "n_distinct_experts": n, "sample_idx": block * per_block + i, "latency_us": t, "block": block,
                      "block_order": order} for i, t in enumerate(latencies)]
        return {"moe_bench": rows}
