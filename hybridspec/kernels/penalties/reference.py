"""The penalised logits in PyTorch ops (`triton.py` has the same signature).

    logits [w, V] (any float dtype)   drafts [≥ w − 1] long: row i follows d_1 … d_i
    counts [V] fp32: occurrences of each token in the output so far   prompt_seen [V] bool
    bias [V] fp32   end [V] bool: the request's end tokens
    scalars [6] fp32: presence, frequency, repetition, emitted (output tokens so far), min_tokens,
                      min_p_margin (T · ln min_p, −inf when off)
    → [w, V] fp32

Per row i, with c = counts + (occurrences among d_1 … d_i):
    l / r where l > 0 else l · r, on tokens seen in the prompt or c > 0     (repetition r)
    l − f · c − p · [c > 0] + b                                              (frequency, presence, bias)
    l = −∞ on end tokens while emitted + i < min_tokens, unless no other token is above −∞
    l = −∞ where l < max l + margin                                          (min_p)
"""

from __future__ import annotations

import torch
from torch import Tensor


def penalized_logits(logits: Tensor, drafts: Tensor, counts: Tensor, prompt_seen: Tensor, bias: Tensor, end: Tensor,
                     scalars: Tensor) -> Tensor:
    """The penalised logits above."""
    presence, frequency, repetition, emitted, min_tokens, min_p_margin = scalars.view(6, 1)  # each [1]
    w = logits.shape[0]
    extra = torch.zeros(w, logits.shape[1], device=logits.device)  # [w, V]: row i's drafts d_1 … d_i
    if w > 1:
        before = torch.arange(w, device=logits.device)[:, None] > torch.arange(w - 1, device=logits.device)  # [w, w−1]
        extra.scatter_add_(1, drafts[: w - 1].expand(w, -1), before.float())
    c = counts + extra  # [w, V]
    seen = prompt_seen | (c > 0)
    out = logits.float()
    out = torch.where(seen, torch.where(out > 0, out / repetition, out * repetition), out)
    out = out - frequency * c - presence * (c > 0).float() + bias
    index = emitted + torch.arange(w, device=logits.device)  # [w]: the output index each row decides
    ban = (index < min_tokens)[:, None] & end  # [w, V]
    ban = ban & ((out > float("-inf")) & ~ban).any(-1, keepdim=True)  # never the last tokens still allowed
    out = out.masked_fill(ban, float("-inf"))
    return out.masked_fill(out < out.amax(-1, keepdim=True) + min_p_margin, float("-inf"))
