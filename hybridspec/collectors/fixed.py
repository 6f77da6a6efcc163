"""The fixed-length pass (DESIGN A.9, cost curve): each verification length w of the supported set
(2…W; --quick: a few) held fixed (`static:w`) over the calibration prompts; one latency per round.
Also w = 1: plain `ar` steps (no drafter pass), the reference the offline estimates divide by; the
cost fit uses w ≥ 2 only.

A unit is one (w, prompt). The first unit of each w in a process is preceded by an unrecorded
warm-up generation at that w (first-call costs; kernel compilation on a GPU).
"""

from __future__ import annotations

from ..runtime.policies import make_policy
from .common import PassContext, PromptIds, Unit, microseconds, prompt_row

QUICK_LENGTHS = (2, 4, 6, 8, 10, 12, 14, 16)
QUICK_PROMPTS_PER_CATEGORY = 1
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
        return subset_per_category(ctx.prompts, QUICK_PROMPTS_PER_CATEGORY) if ctx.config.quick else ctx.prompts

    def params(self, ctx: PassContext) -> dict:
        return {**ctx.base_params(), "lengths": supported_lengths(ctx.max_length, ctx.config.quick),
                "ar_steps": True,
                "fixed_prompt_ids": [p.id for p in self._prompts(ctx)], "max_new_tokens": ctx.config.new_tokens,
                "draft_len": ctx.draft_len, "warmup_generations_per_w": 1}

    def units(self, ctx: PassContext) -> list[Unit]:
        lengths = [AR_LENGTH, *supported_lengths(ctx.max_length, ctx.config.quick)]
        return [Unit(f"w={w}:prompt:{p.id}", (w, p)) for w in lengths for p in self._prompts(ctx)]

    def prepare(self, ctx: PassContext) -> None:
        self.warmed: set[int] = set()

    def _generate(self, ctx: PassContext, w: int, prompt: PromptIds, new_tokens: int):
        policy = make_policy("ar" if w == AR_LENGTH else f"static:{w}", ctx.draft_len)
        return ctx.session.engine.generate(list(prompt.ids), policy=policy, max_new_tokens=new_tokens,
                                           eos_ids=ctx.session.eos_ids)

    def collect(self, ctx: PassContext, item: tuple[int, PromptIds]) -> dict[str, list[dict]]:
        w, prompt = item
        if w not in self.warmed:
            self._generate(ctx, w, ctx.prompts[0], min(2 * w, ctx.config.new_tokens))
            self.warmed.add(w)
        result = self._generate(ctx, w, prompt, ctx.config.new_tokens)
        rows = [{"run_id": ctx.run_id, "w": w, "prompt_id": prompt.id, "round_idx": index,
                 "latency_us": microseconds(r.seconds["total"]), "executed_w": r.w, "accepted": r.accepted,
                 "emitted": r.emitted, "truncated": r.truncated} for index, r in enumerate(result.rounds)]
        return {"prompts": [prompt_row(ctx.run_id, prompt)], "fixed_length_timings": rows}
