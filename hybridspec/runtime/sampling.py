"""Target-side token choice: greedy, or temperature / top-k / top-p sampling, and the verification
of a draft by the point-mass rule (DESIGN A.6, Proposition 2).

The drafter proposes its argmax, a point mass, so the exact speculative rule is: accept d_i iff
ξ_i ≤ p^t_i(d_i); at the first rejection emit from p^t_i with d_i removed and renormalised; if all
are accepted emit from p^t_{w}. The draws ξ are the only randomness and no length rule reads them.

Every draw is a counter-based uniform, a hash of (request seed, position of the token being
decided, lane): lane 0 is ξ of the acceptance test, lane 1 + v the uniform of token v in an
exponential race (`kernels/sampling/reference.py`). No generator state: the draws are the same on
the host and on the device, in eager code and in a CUDA graph, and a sampled request is
reproducible from its seed whatever policy decodes it. Each position's draws decide one emitted
token only (a position examined past the first rejection of a round is decided again, from the
same draws, in a later round, but nothing emitted depended on them before), so the point-mass rule
stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels.sampling.reference import point_mass, race, sampling_probs


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # the seed is hashed as a long tensor
GREEDY_BELOW = 1e-5  # temperatures below it decode greedily, as vLLM (logits / T would overflow fp32)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 (or below GREEDY_BELOW) → greedy
    top_k: int = 0  # 0 → off
    top_p: float = 1.0
    seed: int = 0
    presence_penalty: float = 0.0  # `penalties.py`: also under greedy decoding
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, bias in [−100, 100]
    min_tokens: int = 0  # the end tokens are masked until the output has this many tokens
    min_p: float = 0.0  # sampled requests: tokens below min_p × the most likely one's probability are cut

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be finite and ≥ 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be a 64-bit integer, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be ≥ 0, got {self.min_tokens}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        """Whether a penalty, a logit bias, min_tokens or min_p changes the logits (`penalties.py`)."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
                or bool(self.logit_bias) or self.min_tokens > 0 or (self.min_p > 0 and not self.greedy))

    @property
    def filtered(self) -> bool:
        """Whether top-k or top-p cut the distribution (a sort over the vocabulary)."""
        return self.top_k > 0 or self.top_p < 1


def _tensors(params: SamplingParams, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(seed, 1 / temperature, top_k, top_p) as [1] tensors on `device`."""
    return (torch.tensor([params.seed], dtype=torch.long, device=device),
            torch.tensor([1.0 / params.temperature], device=device),
            torch.tensor([params.top_k], dtype=torch.long, device=device),
            torch.tensor([params.top_p], device=device))


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] → p^t [..., V] after temperature, top-k and top-p (fp32)."""
    _, inv_t, top_k, top_p = _tensors(params, logits.device)
    return sampling_probs(logits, inv_t, top_k, top_p, params.filtered)


def choose(logits: Tensor, params: SamplingParams, position: int) -> int:
    """One token from logits [V] for the token at `position` of the sequence."""
    if params.greedy:
        return int(torch.argmax(logits))
    seed = _tensors(params, logits.device)[0]
    at = torch.tensor([position], dtype=torch.long, device=logits.device)
    return int(race(target_probs(logits[None], params), seed, at)[0])


def verify_greedy(draft: Tensor, logits: Tensor) -> tuple[int, int]:
    """draft [w−1], logits [w, V] → (A, x_new): A leading drafts equal the target argmax."""
    y = torch.argmax(logits, dim=-1)  # y_i after (x0, d1 … d_{i−1})
    matches = (draft == y[:-1]).int()
    accepted = int(torch.cumprod(matches, 0).sum()) if matches.numel() else 0
    return accepted, int(y[accepted])


def verify_point_mass(draft: Tensor, logits: Tensor, params: SamplingParams, position: int) -> tuple[int, int]:
    """Point-mass rule over draft [w−1] with target logits [w, V] (row 0 decides the token at
    `position`) → (A, x_new)."""
    seed = _tensors(params, logits.device)[0]
    at = torch.tensor([position], dtype=torch.long, device=logits.device)
    accepted, x_new = point_mass(draft.to(logits.device), target_probs(logits, params), seed, at)
    return int(accepted), int(x_new)
