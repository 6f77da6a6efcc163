"""The few-row Triton product against the library's (under TRITON_INTERPRET on CPU): fp32 within
fp32 rounding of the sums, bf16 within one rounding of the fp32 result; a row's result the same
alone or among others (batch invariance); longer calls take the library product."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.linear import reference
from hybridspec.kernels.linear import triton as linear_triton


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("k,n", [(4096, 40), (200, 33), (64, 16), (1000, 7)])
def test_few_row_product_matches_the_library(rows, k, n):
    g = torch.Generator().manual_seed(rows * k + n)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, k, generator=g).to(dtype)
        weight = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
        y = linear_triton.linear(x, weight)
        want = torch.nn.functional.linear(x.float(), weight.float())
        assert y.dtype == dtype and y.shape == (rows, n)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
        torch.testing.assert_close(y.float(), want, **tol)


def test_rows_are_independent_and_long_calls_use_the_library():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 320, generator=g).to(torch.bfloat16)
    weight = torch.randn(48, 320, generator=g).to(torch.bfloat16)
    together = linear_triton.linear(x, weight)
    for r in (0, 9, 15):
        assert torch.equal(linear_triton.linear(x[r : r + 1], weight), together[r : r + 1])
    long = torch.randn(20, 320, generator=g)
    assert torch.equal(linear_triton.linear(long, weight.float()), reference.linear(long, weight.float()))
