"""The Stage-0 pass (DESIGN A.9, `s`): latency of `target.stage0` (Layer-0 GDN + router) against the
number of Stage-0 tokens u = 1…W, after a prefill of a fixed context; warm-up calls excluded.

Stage 0 never changes committed state (it fills round buffers only), so every sample runs against
the same context. A unit is one measurement block: every u, in a random order seeded by
(seed, block), `per_block` samples each; `prepare` runs the warm-up calls of every u (unrecorded).
"""

from __future__ import annotations

import torch

from ..workbench.timing import sample_latencies
from .common import PassContext, Unit, block_order

CONTEXT_TOKENS = 64
BLOCKS, PER_BLOCK, WARMUP = 10, 3, 5  # 30 samples per u
QUICK_BLOCKS, QUICK_PER_BLOCK, QUICK_WARMUP = 4, 2, 2


def _counts(ctx: PassContext) -> tuple[int, int, int]:
    """(blocks, samples per block, warm-up calls) of the pass."""
    return (QUICK_BLOCKS, QUICK_PER_BLOCK, QUICK_WARMUP) if ctx.config.quick else (BLOCKS, PER_BLOCK, WARMUP)


class Stage0Pass:
    name = "stage0"

    def params(self, ctx: PassContext) -> dict:
        blocks, per_block, warmup = _counts(ctx)
        return {**ctx.base_params(), "lengths": list(range(1, ctx.max_length + 1)), "samples": blocks * per_block,
                "blocks": blocks, "per_block": per_block, "order": "seeded random per block", "warmup": warmup,
                "context_prompt": ctx.prompts[0].id, "context_tokens": CONTEXT_TOKENS}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"block={b}", b) for b in range(_counts(ctx)[0])]

    def prepare(self, ctx: PassContext) -> None:
        target = ctx.session.target
        context = list(ctx.prompts[0].ids[:CONTEXT_TOKENS])  # the same context in every shard
        self.context_tokens = len(context)
        self.cache = target.new_cache(max_len=len(context) + ctx.max_length + 1, tokens_per_pass=64)
        target.prefill(torch.tensor([context], device=ctx.device), self.cache)
        gen = torch.Generator().manual_seed(ctx.config.seed)
        self.tokens = torch.randint(0, target.cfg.vocab_size, (1, ctx.max_length), generator=gen).to(ctx.device)
        for u in range(1, ctx.max_length + 1):  # unrecorded warm-up of every u
            sample_latencies(self._call(ctx, u), samples=1, warmup=_counts(ctx)[2], device=ctx.device)

    def _call(self, ctx: PassContext, u: int):
        target, tokens = ctx.session.target, self.tokens[:, :u]  # [1, u]
        return lambda: target.stage0(tokens, self.cache)

    def collect(self, ctx: PassContext, block: int) -> dict[str, list[dict]]:
        _, per_block, _ = _counts(ctx)
        rows = []
        for order, u in enumerate(block_order(list(range(1, ctx.max_length + 1)), ctx.config.seed, block)):
            latencies = sample_latencies(self._call(ctx, u), samples=per_block, warmup=0, device=ctx.device)
            rows += [{"run_id": ctx.run_id, "u": u, "sample_idx": block * per_block + i, "latency_us": t,
                      "context_tokens": self.context_tokens, "block": block, "block_order": order}
                     for i, t in enumerate(latencies)]
        return {"stage0_timings": rows}
