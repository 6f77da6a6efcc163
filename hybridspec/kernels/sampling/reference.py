"""Keyed draws, the target's sampling distribution and the point-mass rule in plain PyTorch
(`runtime.sampling` explains the rule).

Every draw is a counter-based uniform, a hash of (request seed, position of the token being
decided, lane): lane 0 is ξ of the acceptance test, lane 1 + v the uniform of token v in an
exponential race (the token is argmax_v p_v / E_v with E_v = −log u_v, which samples v with
probability p_v / Σ p, so a residual needs no renormalisation). No generator state: the draws are
the same on the host and on the device, in eager code and in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
ACCEPT_LANE = 0  # ξ of the acceptance test; lane 1 + v: token v's uniform in the race


def _mul32(x: Tensor, c: int) -> Tensor:
    """x · c mod 2^32 for x in [0, 2^32) held in int64, without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash (the `lowbias32` constants of Wellons' hash prospector)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(seed: Tensor, positions: Tensor, lanes: Tensor) -> Tensor:
    """Uniforms in (0, 1) (fp32, 24 random bits), a function of (seed, position, lane) alone:
    seed [1] long (any 64-bit value), positions [R] long, lanes [N] long → [R, N]."""
    s = seed.long()
    key = _mix32((s & MASK32) ^ 0x9E3779B9)
    key = _mix32(key ^ ((s >> 32) & MASK32))
    key = _mix32(key ^ (positions.long() & MASK32))  # [R]
    h = _mix32(key[:, None] ^ (lanes.long() & MASK32)[None, :])
    return ((h >> 8).float() + 0.5) * 2.0**-24


def race(weights: Tensor, seed: Tensor, positions: Tensor) -> Tensor:
    """One token per row of weights [R, V] (non-negative, not necessarily normalised), drawn with
    probability proportional to its weight from the keyed uniforms of (seed, positions [R]) → [R]."""
    lanes = 1 + torch.arange(weights.shape[-1], device=weights.device)
    exponential = -torch.log(keyed_uniforms(seed, positions, lanes))
    return torch.argmax(weights / exponential, dim=-1)


def sampling_probs(logits: Tensor, inv_temperature: Tensor, top_k: Tensor, top_p: Tensor, filtered: bool) -> Tensor:
    """logits [..., V] → p^t [..., V] (fp32): softmax of logits / temperature, then, when
    `filtered`, the top-k tokens (exactly k: ties go to the lower id) renormalised and cut to the
    smallest prefix whose mass reaches top_p (top_k 0: every token). The parameters are tensors
    ([1] or 0-d) so that one CUDA graph serves any value; `filtered` (a sort over V) is chosen per
    request: top_k > 0 or top_p < 1."""
    probs = torch.softmax(logits.float() * inv_temperature, dim=-1)
    if not filtered:
        return probs
    V = probs.shape[-1]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(V, device=probs.device)
    sorted_p = sorted_p * (rank < torch.where(top_k > 0, top_k, V))
    sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
    sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


def point_mass(draft: Tensor, probs: Tensor, seed: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """The point-mass rule on the device: draft [w−1] long, target probabilities probs [w, V] (row i
    decides the token at position start + i; start [1] long) → (A [1] long, x_new [1] long)."""
    w, V = probs.shape
    positions = start + torch.arange(w, device=probs.device)  # [w]
    if w > 1:
        xi = keyed_uniforms(seed, positions[:-1], torch.full((1,), ACCEPT_LANE, device=probs.device))[:, 0]
        kept = (xi <= probs[:-1].gather(1, draft.view(-1, 1))[:, 0]).long()
        accepted = torch.cumprod(kept, 0).sum(0, keepdim=True)  # [1]
    else:
        accepted = torch.zeros(1, dtype=torch.long, device=probs.device)
    row = probs.index_select(0, accepted)  # [1, V]: the residual's row, or the last one
    rejected = torch.cat((draft.view(-1), torch.full((1,), -1, dtype=torch.long, device=probs.device)))
    rejected = rejected.index_select(0, accepted)  # [1]: d_A, or −1 when every draft was accepted
    row = row.masked_fill(torch.arange(V, device=probs.device) == rejected[:, None], 0.0)
    return accepted, race(row, seed, positions.index_select(0, accepted))


def point_mass_from_logits(draft: Tensor, logits: Tensor, inv_temperature: Tensor, seed: Tensor,
                           start: Tensor) -> tuple[Tensor, Tensor]:
    """`point_mass` over p^t = softmax(logits / temperature): draft [w−1] long, logits [w, V],
    inv_temperature [1] fp32, seed [1] long, start [1] long → (A [1] long, x_new [1] long)."""
    return point_mass(draft, torch.softmax(logits.float() * inv_temperature, dim=-1), seed, start)


def point_mass_filtered(draft: Tensor, logits: Tensor, inv_temperature: Tensor, top_k: Tensor, top_p: Tensor,
                        seed: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """`point_mass` over p^t = `sampling_probs`(logits, …, filtered): the top_k tokens of
    softmax(logits / temperature) renormalised and cut to top_p; top_k, top_p [1] → (A [1], x_new [1])."""
    return point_mass(draft, sampling_probs(logits, inv_temperature, top_k, top_p, True), seed, start)


def draft_statistics(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """logits [D, V] (the drafter's block) → tokens [D] long (the argmax), confidence [D] fp32 (its
    softmax probability) and entropy [D] fp32 (nats) of softmax(logits) in fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top_logp, tokens = logp.max(dim=-1)
    return tokens, top_logp.exp(), -(logp.exp() * logp).sum(-1)
