"""Presence, frequency and repetition penalties (OpenAI's and vLLM's), exact under speculation.

vLLM's definitions, applied to the target's logits before greedy choice or sampling:

    repetition r   on every token seen in the prompt or the output: l / r where l > 0, l · r elsewhere
    frequency  f   l − f · c_v, c_v the times token v occurs in the output so far
    presence   p   l − p · [c_v > 0]

A verification row decides the token after the anchor and the drafts before it, so its history is
the output so far plus those drafts: row i counts d_1 … d_i on top of the request's counts. The
penalised distribution of row i is then exactly the one an `ar` decoding would sample from after
accepting d_1 … d_i, and the acceptance rule stays exact. The request's counts live on the device
(`PenaltyState`) and are advanced by each round's emitted tokens, so the resident round keeps them
inside its graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PenaltyState:
    """One request's penalties and token history on the device."""

    counts: Tensor  # [V] fp32: occurrences of each token in the output so far
    prompt_seen: Tensor  # [V] bool: tokens of the prompt
    presence: Tensor  # [1] fp32
    frequency: Tensor  # [1] fp32
    repetition: Tensor  # [1] fp32

    @classmethod
    def allocate(cls, vocab: int, device) -> "PenaltyState":
        return cls(torch.zeros(vocab, device=device), torch.zeros(vocab, dtype=torch.bool, device=device),
                   torch.zeros(1, device=device), torch.zeros(1, device=device), torch.ones(1, device=device))

    def begin(self, prompt: list[int] | Tensor, presence: float, frequency: float, repetition: float) -> None:
        """Reset for a request: its prompt, no output yet, its penalty values."""
        self.counts.zero_()
        self.prompt_seen.zero_()
        ids = torch.as_tensor(prompt, dtype=torch.long, device=self.counts.device)
        self.prompt_seen[ids] = True
        self.presence.fill_(presence)
        self.frequency.fill_(frequency)
        self.repetition.fill_(repetition)

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
    return out - state.frequency * counts - state.presence * (counts > 0).float()
