"""The Stage-0 pass (DESIGN A.9, `s`): latency of `target.stage0` (Layer-0 GDN + router) against the
number of Stage-0 tokens u = 1…W, after a prefill of a fixed context; warm-up calls excluded.

Stage 0 never changes committed state (it fills round buffers only), so every sample runs against
the same context. The cache is put in the resident round's static form (a pending null commit of
Layer 0 over the whole block, folded by every call), so each sample does the work Stage 0 does in a
round. On CUDA each u is timed as the replay of its CUDA graph, as the resident round runs it (an
eager call would time its Python launches instead); with --no-graphs, where the round runs eagerly,
and elsewhere the call itself. A unit is one measurement block: every u, in a random order seeded
by (seed, block), `per_block` samples each (`common.block_counts`); `prepare` runs the warm-up
calls of every u (unrecorded).
"""

from __future__ import annotations

import torch

from ..workbench.profiling import replayable
from ..workbench.timing import sample_latencies, timing_params
from .common import PassContext, Unit, block_counts, block_order

CONTEXT_TOKENS = 64


class Stage0Pass:
    name = "stage0"

    def params(self, ctx: PassContext) -> dict:
        blocks, per_block, warmup = block_counts(ctx)
        return {**ctx.timed_params(), "lengths": list(range(1, ctx.max_length + 1)), "samples": blocks * per_block,
                "blocks": blocks, "per_block": per_block, "order": "seeded random per block", "warmup": warmup,
                "context_prompt": ctx.prompts[0].id, "context_tokens": CONTEXT_TOKENS,
                **timing_params(ctx.device, ctx.config.graphs)}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"block={b}", b) for b in range(block_counts(ctx)[0])]

    def prepare(self, ctx: PassContext) -> None:
        target = ctx.session.target
        context = list(ctx.prompts[0].ids[:CONTEXT_TOKENS])  # the same context in every shard
        self.context_tokens = len(context)
        W = ctx.max_length
        cache = target.new_cache(max_len=len(context) + W + 1, tokens_per_pass=64)
        target.prefill(torch.tensor([context], device=ctx.device), cache)
        target.enter_static(cache, W)  # Layer 0 folds the same (null) pending commit each call
        self.cache = cache
        gen = torch.Generator().manual_seed(ctx.config.seed)
        self.tokens = torch.randint(0, target.cfg.vocab_size, (1, W), generator=gen).to(ctx.device)
        for u in range(1, W + 1):  # unrecorded warm-up of every u
            sample_latencies(self._stage0(ctx, u), samples=1, warmup=block_counts(ctx)[2], device=ctx.device)
        self.calls = {u: self._timed(ctx, u) for u in range(1, W + 1)}

    def _stage0(self, ctx: PassContext, u: int):
        target, tokens = ctx.session.target, self.tokens[:, :u]  # [1, u]

        def call():
            self.cache.pending[0] = True  # re-arm the null commit: the same work each call
            target.stage0(tokens, self.cache)

        return call

    def _timed(self, ctx: PassContext, u: int):
        replay = replayable(self._stage0(ctx, u), ctx.device, graphs=ctx.config.graphs)

        def call():
            self.cache.pending[0] = True
            replay()

        return call

    def collect(self, ctx: PassContext, block: int) -> dict[str, list[dict]]:
        _, per_block, _ = block_counts(ctx)
        rows = []
        for order, u in enumerate(block_order(list(range(1, ctx.max_length + 1)), ctx.config.seed, block)):
            latencies = sample_latencies(self.calls[u], samples=per_block, warmup=0, device=ctx.device)
            rows += [{"run_id": ctx.run_id, "u": u, "sample_idx": block * per_block + i, "latency_us": t,
                      "context_tokens": self.context_tokens, "block": block, "block_order": order}
                     for i, t in enumerate(latencies)]
        return {"stage0_timings": rows}
