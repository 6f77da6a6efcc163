"""Weights read into the L2 cache on a side stream while the decoding stream runs the short,
latency-bound kernels before the product that reads them (the GDN conv, recurrent step and gated
norm before the output projection; the attention before its output projection; the post-attention
norm and router before the shared expert). Those kernels leave the memory bus mostly idle; the
product then finds part or all of its weight in the L2. The bytes crossing HBM are the same; only
idle bus time is used.

Only passes captured into a CUDA graph prefetch (the side stream is a branch of the graph, forked
after the product before and joined at the end of the pass: `join`); eager passes, which the host
drives launch by launch, do not. The values are the same either way: a prefetch is a hint."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

MAX_TOKENS = 0  # passes of at most this many tokens prefetch (0: none)
LINE = 128  # bytes per prefetch instruction (`kernels/prefetch`: 128 per line, larger in bulk)
MLP = True  # with the mixer's output projection, the MoE block's router and shared expert weights


class WeightPrefetch:
    """`issue(tokens, *weights)`: in a captured pass of at most MAX_TOKENS tokens, the weights' bytes
    on their way into the L2 on a side stream that starts where the capturing stream is now;
    `join()`: the capturing stream waits for the side stream (each pass calls it before it ends)."""

    def __init__(self, op: Callable[..., None]):
        self.op = op  # `kernels/prefetch`'s l2_prefetch
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._forked: torch.cuda.Stream | None = None

    def issue(self, tokens: int, *weights: Tensor) -> None:
        if tokens > MAX_TOKENS or not weights or not weights[0].is_cuda or not torch.cuda.is_current_stream_capturing():
            return
        main = torch.cuda.current_stream()
        side = self._streams.get(main.device)
        if side is None:
            side = self._streams[main.device] = torch.cuda.Stream(device=main.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for w in weights:
                self.op(w, line=LINE)
        self._forked = side

    def join(self) -> None:
        if self._forked is not None:
            torch.cuda.current_stream().wait_stream(self._forked)
            self._forked = None
