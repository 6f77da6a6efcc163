"""The log-probability rows in PyTorch ops (`triton.py` has the same signature).

    logits [n, V] (any float dtype)   tokens [n] long   top ≤ V
    → [n, 1 + 2·top] fp32: log p(token), the top log-probabilities by decreasing value, their ids (as
      fp32: exact below 2^24)

log p = x − max x − log Σ exp(x − max x), in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logprob_rows(logits: Tensor, tokens: Tensor, top: int, out: Tensor | None = None) -> Tensor:
    """The rows above; written into `out` ([n, 1 + 2·top] fp32) when given."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    chosen = logp.gather(1, tokens.view(-1, 1))  # [n, 1]
    values, ids = torch.topk(logp, top, dim=-1) if top else (logp[:, :0], tokens.view(-1, 1)[:, :0])
    rows = torch.cat((chosen, values, ids.float()), dim=1)
    return rows if out is None else out.copy_(rows)
