"""The end of a speculative round in PyTorch ops: `triton.finish_round`'s signature and outputs.

    report  [4 + W + 3D + W·k] fp32: m, w0, w_c, w, the emitted tokens [W] (d1 … dA, then x_new at A and
            past it), the drafts [D], their confidences [D] and entropies [D], Stage 0's Layer-0
            expert ids [W, k] (rows past U: −1)
"""

from __future__ import annotations

import torch
from torch import Tensor


def greedy_accepted(draft: Tensor, y: Tensor) -> Tensor:
    """A [1] long: the number of leading drafts d_i (draft [w−1]) equal to the target's y_i (y [w])."""
    matches = (draft == y[:-1]).long()
    return torch.cumprod(matches, 0).sum(0, keepdim=True)


def finish_round(drafts: Tensor, w: int, y: Tensor | None, accepted: Tensor | None, x_new: Tensor | None,
                 lengths: tuple[Tensor, Tensor, Tensor], confidence: Tensor, entropy: Tensor, layer0: Tensor,
                 report: Tensor, anchor: Tensor, remaining: Tensor, m: Tensor) -> None:
    """drafts [D] long (the block's d1 … dD), w the verified length; greedy: y [w] long (the target's
    argmax per row; accepted, x_new None), sampled: accepted, x_new [1] long (y None); lengths (w0,
    w_c, w) [1] long each; confidence, entropy [D] fp32; layer0 [U, k] long (U ≤ W rows of Stage 0's
    Layer-0 expert ids). Writes report (above), anchor [1] = x_new, remaining [1] −= m, m [1] = A + 1."""
    D = drafts.shape[0]
    W = D + 1
    if y is not None:
        accepted = greedy_accepted(drafts[: w - 1], y)
        x_new = y.gather(0, accepted)
    m.copy_(accepted + 1)
    index = torch.arange(W, device=drafts.device)
    emitted = torch.where(index < accepted, torch.cat((drafts, x_new)), x_new)  # [W]
    head = torch.cat((m, *lengths)).float()
    unused = torch.full((W - layer0.shape[0], layer0.shape[1]), -1, dtype=layer0.dtype, device=layer0.device)
    ids = torch.cat((layer0, unused)).flatten()
    report.copy_(torch.cat((head, emitted.float(), drafts.float(), confidence, entropy, ids.float())))
    anchor.copy_(x_new)
    remaining.sub_(m)

