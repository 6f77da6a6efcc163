"""The fixed-length pass (DESIGN A.9, cost curve): each verification length w of the supported set
(2…W; --quick: a few) held fixed (`static:w`) over the calibration prompts; one latency per round.
Also w = 1: plain `ar` steps (no drafter pass), the reference the offline estimates divide by; the
cost fit uses w ≥ 2 only.

A unit is one prompt, a measurement block: it decodes the prompt once at every length, the lengths
in a random order seeded by (seed, block), so that drift of the machine spreads over every length
alike (`block`, `block_order` record the order). Before its first unit a process runs one
unrecorded warm-up generation at every length (first-call costs; kernel compilation on a GPU).
"""

from __future__ import annotations

from ..runtime.policies import make_policy
from .common import PassContext, PromptIds, Unit, block_order, microseconds, prompt_row

QUICK_LENGTHS = (2, 4, 6, 8, 10, 12, 14, 16)
QUICK_FIXED_PROMPTS_PER_CATEGORY = 1  # blocks per category with --quick (of the campaign's prompts)
AR_LENGTH = 1  # the `ar` rows: one target token per step, no draft


def supported_lengths(max_length: int, quick: bool) -> list[int]:
    """W0 = {2, …, W}; --quick keeps a few of them (and always W)."""
    if not quick:
        return list(range(2, max_length + 1))
    return sorted({w for w in QUICK_LENGTHS if w <= max_length} | {max_length})


def subset_per_category(prompts: list[PromptIds], per_category: int) -> list[PromptIds]:
    """The first `per_category` prompts of each category, in file order."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        if seen.get(p.category, 0) < per_category:
            seen[p.category] = seen.get(p.category, 0) + 1
            out.append(p)
    return out


class FixedPass:
    name = "fixed"

    def _prompts(self, ctx: PassContext) -> list[PromptIds]:
        return subset_per_category(ctx.prompts, QUICK_FIXED_PROMPTS_PER_CATEGORY) if ctx.config.quick else ctx.prompts

    def _lengths(self, ctx: PassContext) -> list[int]:
        return [AR_LENGTH, *supported_lengths(ctx.max_length, ctx.config.quick)]

    def params(self, ctx: PassContext) -> dict:
        return {**ctx.timed_params(), "lengths": supported_lengths(ctx.max_length, ctx.config.quick),
                "ar_steps": True, "order": "seeded random per block (one block per prompt)",
                "fixed_prompt_ids": [p.id for p in self._prompts(ctx)], "max_new_tokens": ctx.config.new_tokens,
                "draft_len": ctx.draft_len, "warmup_generations_per_w": 1}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"block={b}:prompt:{p.id}", (b, p)) for b, p in enumerate(self._prompts(ctx))]

    def prepare(self, ctx: PassContext) -> None:
        for w in self._lengths(ctx):  # unrecorded: first-call costs of every length
            self._generate(ctx, w, ctx.prompts[0], min(2 * w, ctx.config.new_tokens))

    def _generate(self, ctx: PassContext, w: int, prompt: PromptIds, new_tokens: int):
        policy = make_policy("ar" if w == AR_LENGTH else f"static:{w}", ctx.draft_len)
        return ctx.session.engine.generate(list(prompt.ids), policy=policy, max_new_tokens=new_tokens,
                                           eos_ids=ctx.session.eos_ids)

    def collect(self, ctx: PassContext, item: tuple[int, PromptIds]) -> dict[str, list[dict]]:
        block, prompt = item
        rows = []
        for order, w in enumerate(block_order(self._lengths(ctx), ctx.config.seed, block)):
            result = self._generate(ctx, w, prompt, ctx.config.new_tokens)
            rows += [{"run_id": ctx.run_id, "w": w, "prompt_id": prompt.id, "round_idx": index,
                      "latency_us": microseconds(r.seconds["total"]), "executed_w": r.w, "accepted": r.accepted,
                      "emitted": r.emitted, "truncated": r.truncated, "block": block, "block_order": order}
                     for index, r in enumerate(result.rounds)]
        return {"prompts": [prompt_row(ctx.run_id, prompt)], "fixed_length_timings": rows}
