"""Log-probabilities of emitted tokens, for requests that ask for them (`logprobs`, `top_logprobs`).

They are the target's raw log-probabilities, log softmax of its logits before temperature, top-k
and top-p (vLLM's default, `raw_logprobs`): the same whatever the sampling parameters, and those of
the row of the verification pass that decided the token. Every emitted token has its own row (d_i
is decided by row i − 1, x_new by row A), so a speculative round's logprobs are those an `ar`
decoding of the same tokens would give, up to the rounding of the different pass shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..kernels.logprobs import reference as logprobs_reference

MAX_TOP_LOGPROBS = 20  # the most alternatives a request may ask for per token (OpenAI's and vLLM's limit)
LOGPROB_FLOOR = -9999.0  # what a log-probability of −inf (or NaN) is written as in JSON, which has neither (vLLM's)


def finite(logprob: float | None) -> float | None:
    """`logprob` for JSON: −inf and NaN as LOGPROB_FLOOR, None as it is."""
    if logprob is None:
        return None
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


@dataclass
class TokenLogprobs:
    """Per emitted token: its log-probability and the `top` most likely tokens with theirs."""

    chosen: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # [token][rank]: (id, logprob)

    def __len__(self) -> int:
        return len(self.chosen)

    def extend(self, other: "TokenLogprobs") -> None:
        """Append `other`'s tokens (the next round's)."""
        self.chosen += other.chosen
        self.top += other.top

    def head(self, n: int) -> "TokenLogprobs":
        """The first n tokens' (a round cut short by EOS or the output limit)."""
        return TokenLogprobs(self.chosen[:n], self.top[:n])


def logprob_rows(logits: Tensor, tokens: Tensor, top: int, fused: bool = False, out: Tensor | None = None) -> Tensor:
    """logits [n, V], tokens [n] long (the token each row decided), top ≤ MAX_TOP_LOGPROBS →
    [n, 1 + 2·top] fp32: per row the token's log-probability, the top log-probabilities in
    descending order, then their token ids (as fp32: exact below 2^24); into `out` when given.
    `kernels/logprobs`, its Triton form (one launch) where `fused`. Device ops only, so the resident
    round computes it inside its graphs."""
    fn = logprobs_reference.logprob_rows
    if fused:
        from ..kernels.logprobs.triton import logprob_rows as fn
    return fn(logits, tokens, top, out)


def from_rows(rows: list[list[float]], top: int) -> TokenLogprobs:
    """The host's `TokenLogprobs` of `logprob_rows`' rows (read back as lists), keeping `top` alternatives
    of the rows' own (rows may carry more: the resident round computes MAX_TOP_LOGPROBS)."""
    width = (len(rows[0]) - 1) // 2 if rows else 0
    return TokenLogprobs([row[0] for row in rows],
                         [[(int(row[1 + width + r]), row[1 + r]) for r in range(top)] for row in rows])


def token_logprobs(logits: Tensor, tokens: list[int], top: int, fused: bool = False) -> TokenLogprobs:
    """logits [n, V] of the rows that decided `tokens` (n of them) → their `TokenLogprobs`."""
    ids = torch.tensor(tokens, dtype=torch.long, device=logits.device)
    return from_rows(logprob_rows(logits, ids, top, fused).tolist(), top)
