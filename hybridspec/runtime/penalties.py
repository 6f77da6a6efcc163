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

from ..kernels.penalties import SCALARS
from ..kernels.penalties import reference as penalties_reference
from .sampling import SamplingParams


@dataclass
class PenaltyState:
    """One request's penalties and token history on the device; the scalars are views of one
    `scalars` [6] fp32 tensor in `kernels.penalties.SCALARS` order."""

    counts: Tensor  # [V] fp32: occurrences of each token in the output so far
    prompt_seen: Tensor  # [V] bool: tokens of the prompt
    bias: Tensor  # [V] fp32: the logit bias
    end: Tensor  # [V] bool: the request's end tokens
    scalars: Tensor  # [6] fp32: presence, frequency, repetition, emitted, min_tokens, T · ln(min_p) (−inf when off)

    @classmethod
    def allocate(cls, vocab: int, device) -> "PenaltyState":
        def zeros(n: int, **kw) -> Tensor:
            return torch.zeros(n, device=device, **kw)

        return cls(zeros(vocab), zeros(vocab, dtype=torch.bool), zeros(vocab), zeros(vocab, dtype=torch.bool),
                   torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, float("-inf")], device=device))

    def scalar(self, name: str) -> Tensor:
        """The [1] view of one of `SCALARS`."""
        i = SCALARS.index(name)
        return self.scalars[i : i + 1]

    def begin(self, prompt: list[int], sampling: SamplingParams, end_ids: tuple[int, ...] = ()) -> None:
        """Reset for a request: its prompt, no output yet, its sampling parameters' values."""
        device = self.counts.device
        for tensor in (self.counts, self.prompt_seen, self.bias, self.end):
            tensor.zero_()
        self.prompt_seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        if sampling.logit_bias:
            ids, values = zip(*sampling.logit_bias)
            self.bias[torch.tensor(ids, device=device)] = torch.tensor(values, device=device)
        if end_ids:
            self.end[torch.tensor(end_ids, dtype=torch.long, device=device)] = True
        sampled_min_p = sampling.min_p > 0 and not sampling.greedy
        margin = sampling.temperature * math.log(sampling.min_p) if sampled_min_p else float("-inf")
        self.scalars.copy_(torch.tensor([sampling.presence_penalty, sampling.frequency_penalty,
                                         sampling.repetition_penalty, 0.0, sampling.min_tokens, margin]))

    def record(self, tokens: Tensor, m: Tensor | int | None = None) -> None:
        """Count emitted tokens [n] long; with m ([1] long or int), only the first m of them."""
        weight = torch.ones(tokens.shape[0], device=tokens.device)
        if m is not None:
            weight = (torch.arange(tokens.shape[0], device=tokens.device) < m).float()
        self.counts.scatter_add_(0, tokens, weight)
        self.scalar("emitted").add_(weight.sum())


def penalized(logits: Tensor, drafts: Tensor, state: PenaltyState, fused: bool = False) -> Tensor:
    """logits [w, V] of a pass whose row i follows drafts d_1 … d_i (drafts [≥ w − 1] long) → the
    penalised logits [w, V] fp32 (module docstring): `kernels/penalties`, its Triton form where
    `fused`. Device ops of fixed shapes only."""
    fn = penalties_reference.penalized_logits
    if fused:
        from ..kernels.penalties.triton import penalized_logits as fn
    return fn(logits, drafts, state.counts, state.prompt_seen, state.bias, state.end, state.scalars)
