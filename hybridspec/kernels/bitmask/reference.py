"""The bitmask's rows applied to logits in PyTorch ops (`triton.py` has the same signature).

    logits [w, V] (any float dtype)   bitmask [w, ⌈V/32⌉] int32 → [w, V] fp32, −inf where refused
"""

from __future__ import annotations

import torch
from torch import Tensor


def unpack(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bitmask [w, ⌈V/32⌉] int32 → allowed [w, V] bool."""
    ids = torch.arange(vocab_size, device=bitmask.device)
    return ((bitmask.index_select(1, ids >> 5) >> (ids & 31)) & 1).bool()


def masked_logits(logits: Tensor, bitmask: Tensor) -> Tensor:
    """logits [w, V] → fp32 logits with the tokens `bitmask` refuses at −inf."""
    return logits.float().masked_fill(~unpack(bitmask, logits.shape[1]), float("-inf"))
