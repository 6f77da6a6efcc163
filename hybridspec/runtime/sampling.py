"""Target-side token choice: greedy, or temperature / top-k / top-p sampling, and the verification
of a draft by the point-mass rule (DESIGN A.6, Proposition 2).

The drafter proposes its argmax, a point mass, so the exact speculative rule is: accept d_i iff
ξ_i ≤ p^t_i(d_i); at the first rejection emit from p^t_i with d_i removed and renormalised; if all
are accepted emit from p^t_{w}. The draws ξ are the only randomness and no length rule reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 → greedy
    top_k: int = 0  # 0 → off
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] → p^t [..., V] after temperature, top-k and top-p (fp32)."""
    logits = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def choose(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from logits [V]."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(target_probs(logits, params).cpu(), 1, generator=generator))


def verify_greedy(draft: Tensor, logits: Tensor) -> tuple[int, int]:
    """draft [w−1], logits [w, V] → (A, x_new): A leading drafts equal the target argmax."""
    y = torch.argmax(logits, dim=-1)  # y_i after (x0, d1 … d_{i−1})
    matches = (draft == y[:-1]).int()
    accepted = int(torch.cumprod(matches, 0).sum()) if matches.numel() else 0
    return accepted, int(y[accepted])


def verify_point_mass(draft: Tensor, logits: Tensor, params: SamplingParams,
                      generator: torch.Generator | None) -> tuple[int, int]:
    """Point-mass rule over draft [w−1] with target logits [w, V] → (A, x_new)."""
    probs = target_probs(logits, params).cpu()  # [w, V]; host generator
    xi = torch.rand(draft.shape[0], generator=generator, device="cpu") if draft.numel() else None
    for i in range(draft.shape[0]):
        d = int(draft[i])
        if float(xi[i]) <= float(probs[i, d]):
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return draft.shape[0], int(torch.multinomial(probs[-1], 1, generator=generator))
