"""Plain-PyTorch reference of `triton.l2_prefetch`: a prefetch only moves bytes into the L2 cache
ahead of their reader, so no value changes and there is nothing to compute."""

from __future__ import annotations

from torch import Tensor


def l2_prefetch(t: Tensor, *, line: int = 128) -> None:
    """t: any tensor; nothing happens."""
    del t, line
