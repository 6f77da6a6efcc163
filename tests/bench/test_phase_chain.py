"""The phase-chain benchmark's kernels under the interpreter: two launches, and one launch with its
grid barrier (one program, which the interpreter can run alone), with and without B's first step
loaded before the barrier, all give W_B (W_A x)[:K_B] with y1 rounded to its dtype; the one launch
leaves its barrier's counters at zero for the next."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
phase_chain = pytest.importorskip("phase_chain")


@pytest.mark.parametrize("form", ["two", "one", "one-prefetch"])
def test_every_form_gives_both_products(form):
    g = torch.Generator().manual_seed(1)
    grid = 2 if form == "two" else 1
    wa, x = torch.randn(32 * grid, 64, generator=g), torch.randn(64, generator=g)
    wb = torch.randn(16 * grid, 32, generator=g)
    y1, y2 = torch.full((32 * grid,), float("nan")), torch.full((16 * grid,), float("nan"))
    if form == "two":
        phase_chain.two_launches(wa, x, y1, wb, y2, grid, pdl=False, widen=True)
    else:
        barrier = torch.zeros(2, dtype=torch.int32)
        phase_chain.one_launch(wa, x, y1, wb, y2, barrier, grid, prefetch=form == "one-prefetch", widen=True)
        assert barrier.tolist() == [0, 0]  # left as found: the next launch's barrier counts from zero
    torch.testing.assert_close(y1, wa @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y2, wb @ (wa @ x)[:32], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("early", [False, True])
def test_the_register_rows_form_gives_the_product(early):
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(32, 64, generator=g), torch.randn(80, generator=g)
    y = torch.full((32,), float("nan"))
    phase_chain.rows_launch(w, x, y, bn=8, early=early, warps=4, pdl=False)
    torch.testing.assert_close(y, w @ x[:64], rtol=1e-5, atol=1e-5)
