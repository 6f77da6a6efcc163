"""The Stage-0 pass (DESIGN A.9, `s`): latency of `target.stage0` (Layer-0 GDN + router) against the
number of Stage-0 tokens u = 1…W, after a prefill of a fixed context; warm-up calls excluded.

Stage 0 never changes committed state (it fills round buffers only), so every sample runs against
the same context. A unit is one u.
"""

from __future__ import annotations

import torch

from ..workbench.timing import sample_latencies
from .common import PassContext, Unit

CONTEXT_TOKENS = 64
SAMPLES, WARMUP = 30, 5
QUICK_SAMPLES, QUICK_WARMUP = 8, 2


def _counts(ctx: PassContext) -> tuple[int, int]:
    return (QUICK_SAMPLES, QUICK_WARMUP) if ctx.config.quick else (SAMPLES, WARMUP)


class Stage0Pass:
    name = "stage0"

    def params(self, ctx: PassContext) -> dict:
        samples, warmup = _counts(ctx)
        return {**ctx.base_params(), "lengths": list(range(1, ctx.max_length + 1)), "samples": samples,
                "warmup": warmup, "context_prompt": ctx.prompts[0].id, "context_tokens": CONTEXT_TOKENS}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"u={u}", u) for u in range(1, ctx.max_length + 1)]

    def prepare(self, ctx: PassContext) -> None:
        target = ctx.session.target
        context = list(ctx.prompts[0].ids[:CONTEXT_TOKENS])  # the same context in every shard
        self.context_tokens = len(context)
        self.cache = target.new_cache(max_len=len(context) + ctx.max_length + 1, tokens_per_pass=64)
        target.prefill(torch.tensor([context], device=ctx.device), self.cache)
        gen = torch.Generator().manual_seed(ctx.config.seed)
        self.tokens = torch.randint(0, target.cfg.vocab_size, (1, ctx.max_length), generator=gen).to(ctx.device)

    def collect(self, ctx: PassContext, u: int) -> dict[str, list[dict]]:
        samples, warmup = _counts(ctx)
        target, tokens = ctx.session.target, self.tokens[:, :u]  # [1, u]
        latencies = sample_latencies(lambda: target.stage0(tokens, self.cache), samples=samples, warmup=warmup,
                                     device=ctx.device)
        return {"stage0_timings": [{"run_id": ctx.run_id, "u": u, "sample_idx": i, "latency_us": t,
                                    "context_tokens": self.context_tokens} for i, t in enumerate(latencies)]}
