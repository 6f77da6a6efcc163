"""The cost-profile pass (the paper's Table 4 and Figure 1b): where one verification pass of w tokens
spends its device time, and how its latency follows the distinct experts it routes to.

- For each w of `WIDTHS` (those ≤ W): the device time of one pass after a prefill of the first
  calibration prompt, by part — `gdn` and `attention` (each token mixer, projections included),
  `moe` (router, routed and shared experts), `other` (embedding, norms between blocks, LM head) —
  from torch.profiler (`workbench.profiling`), and the pass's latency (a CUDA graph's replay on a
  GPU). Then the drafter's pass (its context extension by one round's features and one block
  proposal) as part `drafter`.
- `calls` verification calls of random blocks, the lengths taken in turn: each call's latency and
  the distinct (MoE layer, expert) pairs its tokens route to (from the same pass with its routing
  recorded); the paper reports a correlation of 0.999 on its A100 runs.

Not part of `--passes all` (it runs the profiler): `capture --passes profile`. Every pass starts
from the same committed state (the round's static form: a null pending commit over W tokens and
the whole cache as the key span, as the resident round runs), so no sample changes what the next
one sees. Units: one per w (`w=…`), the drafter (`drafter`), and blocks of calls (`calls=b`).
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from ..workbench.profiling import part_times, profile_calls, ranged, replayable
from ..workbench.timing import sample_latencies
from .common import PassContext, Unit

WIDTHS = (1, 2, 4, 6, 8, 10, 12, 15, 16)
QUICK_WIDTHS = (1, 4, 8, 16)
PARTS = ("gdn", "attention", "moe", "other")
CONTEXT_TOKENS, QUICK_CONTEXT_TOKENS = 1024, 64
CALLS, QUICK_CALLS = 90, 8
CALL_BLOCK = 10  # calls per unit
PROFILE_REPS, LATENCY_SAMPLES = 5, 7
QUICK_PROFILE_REPS, QUICK_LATENCY_SAMPLES = 2, 3


@contextlib.contextmanager
def module_ranges(target):
    """Every token mixer and MLP block of `target` runs inside a profiler range named by its part;
    undone on exit (the instance attributes removed, the class's methods show through again)."""
    patched = []
    for layer in target.layers:
        mixer = layer.linear_attn if layer.is_gdn else layer.self_attn
        patched.append((mixer, "forward", "gdn" if layer.is_gdn else "attention"))
        for method in ("forward", "route", "run_experts") if layer.is_moe else ("forward",):  # nested: one part
            patched.append((layer.mlp, method, "moe" if layer.is_moe else "other"))
    for obj, attr, name in patched:
        setattr(obj, attr, ranged(getattr(obj, attr), name))
    try:
        yield
    finally:
        for obj, attr, _ in patched:
            delattr(obj, attr)


def distinct_pairs(routing: list[torch.Tensor]) -> int:
    """Distinct (MoE layer, expert) pairs of one pass's routing (one [B, T, k] tensor per layer)."""
    return sum(int(ids.unique().numel()) for ids in routing)


class ProfilePass:
    name = "profile"

    def _widths(self, ctx: PassContext) -> list[int]:
        return [w for w in (QUICK_WIDTHS if ctx.config.quick else WIDTHS) if w <= ctx.max_length]

    def _counts(self, ctx: PassContext) -> tuple[int, int]:
        """(profiled passes per w, latency samples per timing)."""
        return (QUICK_PROFILE_REPS, QUICK_LATENCY_SAMPLES) if ctx.config.quick else (PROFILE_REPS, LATENCY_SAMPLES)

    def _calls(self, ctx: PassContext) -> int:
        return QUICK_CALLS if ctx.config.quick else CALLS

    def params(self, ctx: PassContext) -> dict:
        return {**ctx.base_params(), "widths": self._widths(ctx), "parts": list(PARTS), "calls": self._calls(ctx),
                "profile_reps": self._counts(ctx)[0], "latency_samples": self._counts(ctx)[1],
                "context_prompt": ctx.prompts[0].id,
                "context_tokens": QUICK_CONTEXT_TOKENS if ctx.config.quick else CONTEXT_TOKENS}

    def units(self, ctx: PassContext) -> list[Unit]:
        blocks = -(-self._calls(ctx) // CALL_BLOCK)
        return ([Unit(f"w={w}", ("w", w)) for w in self._widths(ctx)] + [Unit("drafter", ("drafter", 0))]
                + [Unit(f"calls={b}", ("calls", b)) for b in range(blocks)])

    def prepare(self, ctx: PassContext) -> None:
        target, W = ctx.session.target, ctx.max_length
        budget = QUICK_CONTEXT_TOKENS if ctx.config.quick else CONTEXT_TOKENS
        ids = list(ctx.prompts[0].ids)
        context = (ids * (budget // max(1, len(ids)) + 1))[:budget]  # the first prompt, repeated to the budget
        self.context_tokens = len(context)
        cache = target.new_cache(max_len=len(context) + 2 * W, tokens_per_pass=max(64, W))
        target.prefill(torch.tensor([context], device=ctx.device), cache)
        target.enter_static(cache, W)
        self.cache = cache
        self.block = torch.zeros(1, W, dtype=torch.long, device=ctx.device)
        self.generator = torch.Generator().manual_seed(ctx.config.seed)
        self.block.copy_(torch.randint(0, target.cfg.vocab_size, (1, W), generator=self.generator))
        self.replays: dict[int, object] = {}

    def _pass(self, ctx: PassContext, w: int, record_routing: bool = False):
        self.cache.pending = [True] * len(self.cache.pending)  # re-arm the null commit: the same state each time
        return ctx.session.target.forward_pass(self.block[:, :w], self.cache, record_routing=record_routing)

    def _latency(self, ctx: PassContext, w: int) -> float:
        if w not in self.replays:
            self.replays[w] = replayable(lambda: self._pass(ctx, w), ctx.device)
        replay = self.replays[w]

        def call():
            self.cache.pending = [True] * len(self.cache.pending)
            replay()

        return statistics.median(sample_latencies(call, samples=self._counts(ctx)[1], warmup=1, device=ctx.device))

    def collect(self, ctx: PassContext, item: tuple[str, int]) -> dict[str, list[dict]]:
        kind, value = item
        if kind == "w":
            return {"cost_profile": self._profile_rows(ctx, value)}
        if kind == "drafter":
            return {"cost_profile": [self._drafter_row(ctx)]}
        return {"profile_calls": self._call_rows(ctx, value)}

    def _profile_rows(self, ctx: PassContext, w: int) -> list[dict]:
        target = ctx.session.target
        with module_ranges(target):
            reps = self._counts(ctx)[0]
            prof = profile_calls(lambda: self._pass(ctx, w), reps, ctx.device)
        times, counts, how = part_times(prof, PARTS, reps)
        latency = self._latency(ctx, w)
        return [{"run_id": ctx.run_id, "w": w, "part": part, "kernel_us": times[part], "kernels": counts[part],
                 "latency_us": latency, "context_tokens": self.context_tokens, "attribution": how} for part in PARTS]

    def _drafter_row(self, ctx: PassContext) -> dict:
        target, drafter = ctx.session.target, ctx.session.drafter
        drafter.reset(self.context_tokens + 2 * ctx.max_length)
        width = len(drafter.feature_layers) * target.cfg.hidden_size
        dtype = target.embed_tokens.weight.dtype
        gen = torch.Generator().manual_seed(ctx.config.seed + 1)
        drafter.extend(torch.randn(1, self.context_tokens, width, generator=gen).to(ctx.device, dtype))
        features = torch.randn(1, ctx.max_length, width, generator=gen).to(ctx.device, dtype)
        accepted = torch.full((1,), ctx.max_length // 2, dtype=torch.long, device=ctx.device)
        anchor = self.block[0, :1].clone()
        start = drafter.position.clone()

        def run():
            drafter.position.copy_(start)
            drafter.extend(features, accepted)
            drafter.propose(anchor)

        reps, samples = self._counts(ctx)
        prof = profile_calls(ranged(run, "drafter"), reps, ctx.device)
        times, counts, how = part_times(prof, ("drafter", "other"), reps)
        latency = statistics.median(sample_latencies(run, samples=samples, warmup=1, device=ctx.device))
        return {"run_id": ctx.run_id, "w": drafter.cfg.block_size, "part": "drafter", "kernel_us": times["drafter"],
                "kernels": counts["drafter"], "latency_us": latency, "context_tokens": self.context_tokens, "attribution": how}

    def _call_rows(self, ctx: PassContext, block: int) -> list[dict]:
        target, widths, W = ctx.session.target, self._widths(ctx), ctx.max_length
        gen = torch.Generator().manual_seed(ctx.config.seed * 1000 + block)
        rows = []
        for i in range(block * CALL_BLOCK, min((block + 1) * CALL_BLOCK, self._calls(ctx))):
            w = widths[i % len(widths)]
            self.block.copy_(torch.randint(0, target.cfg.vocab_size, (1, W), generator=gen))
            pairs = distinct_pairs(self._pass(ctx, w, record_routing=True).expert_ids)
            rows.append({"run_id": ctx.run_id, "call_idx": i, "w": w, "distinct_pairs": pairs,
                         "latency_us": self._latency(ctx, w)})
        return rows

