"""The stream-balance benchmark's product under the interpreter: every split of the rows over the
programs (shares that do not fill their last tile, more programs than tiles' worth of rows) gives
W x."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
stream_balance = pytest.importorskip("stream_balance")


@pytest.mark.parametrize("grid, bn", [(3, 16), (5, 32), (40, 16), (1, 64)])
def test_every_split_gives_the_product(grid, bn):
    g = torch.Generator().manual_seed(grid + bn)
    w, x = torch.randn(75, 96, generator=g), torch.randn(96, generator=g)
    y = torch.full((75,), float("nan"))
    stream_balance.product(w, x, y, grid, bn, widen=True)
    torch.testing.assert_close(y, w @ x, rtol=1e-5, atol=1e-5)
