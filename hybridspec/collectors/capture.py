"""The capture pass (DESIGN A.9): greedy rounds that verify all D draft tokens (policy `full`).

Per round: w0, u, w, A, A_D (`accepted_full`), emitted, truncated and the phase latencies; per draft
position i = 1…D: the token, conf_i, h_i, `A_D ≥ i` and the Layer-0 experts d_i adds to those of
(x0, d1, …, d_{i−1}). Every round verifies all D draft tokens, also near the output limit
(`generate_fully_verified`). Nothing is excluded here; rounds cut short by EOS or the output limit
keep `truncated = true` (the acceptance fitter drops them).
"""

from __future__ import annotations

from ..runtime.policies import make_policy
from .common import (PassContext, PromptIds, Unit, generate_fully_verified, known_acceptance, microseconds,
                     new_experts_per_token, prompt_row)


def round_rows(run_id: str, prompt_id: str, rounds) -> tuple[list[dict], list[dict]]:
    """(rounds rows, draft_positions rows) of one generation's RoundRecords."""
    round_out, position_out = [], []
    for index, record in enumerate(rounds):
        s = record.seconds
        round_out.append({
            "run_id": run_id, "prompt_id": prompt_id, "round_idx": index, "w0": record.w0, "u": record.u,
            "w": record.w, "accepted": record.accepted, "accepted_full": record.accepted_full,
            "emitted": record.emitted, "truncated": record.truncated, "latency_us": microseconds(s["total"]),
            "draft_us": microseconds(s.get("draft")), "stage0_us": microseconds(s.get("stage0")),
            "stage1_us": microseconds(s.get("stage1")), "commit_us": microseconds(s.get("commit")),
        })
        fresh = new_experts_per_token(record.layer0_experts)  # index t = target-input token t
        for i, (token, conf, entropy) in enumerate(zip(record.draft_tokens, record.confidence, record.entropy), 1):
            position_out.append({
                "run_id": run_id, "prompt_id": prompt_id, "round_idx": index, "position": i, "token_id": token,
                "confidence": conf, "entropy": entropy, "accepted": known_acceptance(i, record.accepted, record.w),
                "new_l0_experts": fresh[i] if i < len(fresh) else None,  # d_i ran in Stage 0 only if i < u
            })
    return round_out, position_out


class FullVerificationPass:
    """A pass over the prompts with every draft token verified (policy `full`), one unit a prompt."""

    record_routing = False

    def params(self, ctx: PassContext) -> dict:
        return {**ctx.base_params(), "policy": "full", "max_new_tokens": ctx.config.new_tokens,
                "draft_len": ctx.draft_len, "warmup_generations": 1}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"prompt:{p.id}", p) for p in ctx.prompts]

    def prepare(self, ctx: PassContext) -> None:
        self.policy = make_policy("full", ctx.draft_len)
        warm = ctx.prompts[0]  # one short generation: first-call costs stay out of the rows
        ctx.session.engine.generate(list(warm.ids), policy=self.policy, max_new_tokens=min(8, ctx.config.new_tokens),
                                    eos_ids=ctx.session.eos_ids, record_routing=self.record_routing)


class CapturePass(FullVerificationPass):
    name = "capture"

    def collect(self, ctx: PassContext, prompt: PromptIds) -> dict[str, list[dict]]:
        run_id = ctx.run_id
        rounds, positions = round_rows(run_id, prompt.id, generate_fully_verified(ctx, prompt, self.policy))
        return {"prompts": [prompt_row(run_id, prompt)], "rounds": rounds, "draft_positions": positions}
