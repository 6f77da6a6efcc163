"""The routing pass (DESIGN A.9, n̄_all tables): greedy verification at length W = 16 (policy
`full`) recording the top-k experts of every token in every MoE layer. Per draft position i:
n0 = new Layer-0 experts of d_i, n>0 = new (layer, expert) pairs of d_i in MoE layers 1…L−1 —
"new" relative to the tokens (x0, d1, …, d_{i−1}) before it in the round's target input.
"""

from __future__ import annotations

from .capture import FullVerificationPass
from .common import PassContext, PromptIds, generate_fully_verified, new_experts_per_token, prompt_row


def routing_rows(run_id: str, prompt_id: str, rounds) -> list[dict]:
    rows = []
    for index, record in enumerate(rounds):
        layer0, *later = [new_experts_per_token(ids) for ids in record.expert_ids]  # per MoE layer, [w]
        for i in range(1, record.w):  # the draft tokens this round verified
            rows.append({"run_id": run_id, "prompt_id": prompt_id, "round_idx": index, "position": i,
                         "new_l0_experts": layer0[i], "new_later_pairs": sum(layer[i] for layer in later)})
    return rows


class RoutingPass(FullVerificationPass):
    name = "routing"
    record_routing = True

    def collect(self, ctx: PassContext, prompt: PromptIds) -> dict[str, list[dict]]:
        rounds = generate_fully_verified(ctx, prompt, self.policy, record_routing=True)
        return {"prompts": [prompt_row(ctx.run_id, prompt)], "routing_positions": routing_rows(ctx.run_id, prompt.id, rounds)}
