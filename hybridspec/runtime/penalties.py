"""What a request changes in the target's logits before greedy choice or sampling, exact under
speculation: vLLM's penalties, OpenAI's logit bias, vLLM's min_tokens and min_p, in this order:

    repetition r   on every token seen in the prompt or the output: l / r where l > 0, l · r elsewhere
    frequency  f   l − f · c_v, c_v the times token v occurs in the output so far
    presence   p   l − p · [c_v > 0]
    logit bias b   l + b_v
    min_tokens n   l = −∞ for the request's end tokens (EOS, stop_token_ids) while the token decided
                   is among the first n of the output, unless they are all a grammar still allows
    min_p q        l = −∞ where p_v < q · max p at the request's temperature T, i.e. where
                   l_v < max l + T · ln q (sampled requests; top-k and top-p then cut the rest)

A verification row decides the token after the anchor and the drafts before it, so its history is
the output so far plus those drafts: row i counts d_1 … d_i on top of the request's counts. The
penalised distribution of row i is then exactly the one an `ar` decoding would sample from after
accepting d_1 … d_i, and the acceptance rule stays exact. The request's counts live on the device
(`PenaltyState`) and are advanced by each round's emitted tokens, so the resident round keeps them
inside its graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .sampling import SamplingParams


@dataclass
class PenaltyState:
    """One request's penalties and token history on the device."""

    counts: Tensor  # [V] fp32: occurrences of each token in the output so far
    prompt_seen: Tensor  # [V] bool: tokens of the prompt
    presence: Tensor  # [1] fp32
    frequency: Tensor  # [1] fp32
    repetition: Tensor  # [1] fp32
    bias: Tensor  # [V] fp32: the logit bias
    end: Tensor  # [V] bool: the request's end tokens
    min_tokens: Tensor  # [1] fp32
    min_p_margin: Tensor  # [1] fp32: T · ln(min_p), −inf when off

    @classmethod
    def allocate(cls, vocab: int, device) -> "PenaltyState":
        def zeros(n: int, **kw) -> Tensor:
            return torch.zeros(n, device=device, **kw)

        return cls(zeros(vocab), zeros(vocab, dtype=torch.bool), zeros(1), zeros(1), torch.ones(1, device=device),
                   zeros(vocab), zeros(vocab, dtype=torch.bool), zeros(1), torch.full((1,), float("-inf"), device=device))

    def begin(self, prompt: list[int], sampling: SamplingParams, end_ids: tuple[int, ...] = ()) -> None:
        """Reset for a request: its prompt, no output yet, its sampling parameters' values."""
        device = self.counts.device
        for tensor in (self.counts, self.prompt_seen, self.bias, self.end):
            tensor.zero_()
        self.prompt_seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        self.presence.fill_(sampling.presence_penalty)
        self.frequency.fill_(sampling.frequency_penalty)
        self.repetition.fill_(sampling.repetition_penalty)
        if sampling.logit_bias:
            ids, values = zip(*sampling.logit_bias)
            self.bias[torch.tensor(ids, device=device)] = torch.tensor(values, device=device)
        if end_ids:
            self.end[torch.tensor(end_ids, dtype=torch.long, device=device)] = True
        self.min_tokens.fill_(sampling.min_tokens)
        sampled_min_p = sampling.min_p > 0 and not sampling.greedy
        self.min_p_margin.fill_(sampling.temperature * math.log(sampling.min_p) if sampled_min_p else float("-inf"))

    def record(self, tokens: Tensor, m: Tensor | int | None = None) -> None:
        """Count emitted tokens [n] long; with m ([1] long or int), only the first m of them."""
        weight = torch.ones(tokens.shape[0], device=tokens.device)
        if m is not None:
            weight = (torch.arange(tokens.shape[0], device=tokens.device) < m).float()
        self.counts.scatter_add_(0, tokens, weight)


def penalized(logits: Tensor, drafts: Tensor, state: PenaltyState) -> Tensor:
    """logits [w, V] of a pass whose row i follows drafts d_1 … d_i (drafts [≥ w − 1] long) → the
    penalised logits [w, V] fp32 (module docstring). Device ops of fixed shapes only."""
    w = logits.shape[0]
    extra = torch.zeros(w, logits.shape[1], device=logits.device)  # [w, V]: row i's drafts d_1 … d_i
    if w > 1:
        before = torch.arange(w, device=logits.device)[:, None] > torch.arange(w - 1, device=logits.device)  # [w, w−1]
        extra.scatter_add_(1, drafts[: w - 1].expand(w, -1), before.float())
    counts = state.counts + extra  # [w, V]
    seen = state.prompt_seen | (counts > 0)
    out = logits.float()
    out = torch.where(seen, torch.where(out > 0, out / state.repetition, out * state.repetition), out)
    out = out - state.frequency * counts - state.presence * (counts > 0).float() + state.bias
    index = state.counts.sum() + torch.arange(w, device=logits.device)  # [w]: output index each row decides
    ban = (index < state.min_tokens)[:, None] & state.end  # [w, V]
    ban = ban & ((out > float("-inf")) & ~ban).any(-1, keepdim=True)  # never the last tokens a grammar allows
    out = out.masked_fill(ban, float("-inf"))
    return out.masked_fill(out < out.amax(-1, keepdim=True) + state.min_p_margin, float("-inf"))
