"""The register-slice product (`kernels/linear`, under TRITON_INTERPRET=1 on CPU tensors) against
its reference and the float64 product: one to four tokens, awkward widths (K and R not powers of
two, slices wider than the weight), bf16 and fp32, leading batch dimensions; the dispatcher
`linear` takes the kernel for one or two tokens and the library product beyond, with the same
result shape; bad arguments are named."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridspec.kernels.linear import reference
from tests.tolerance import assert_close

pytest.importorskip("triton")

from hybridspec.kernels.linear import triton as linear_triton  # noqa: E402

RATIO = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, r, k, block_n, warps", [
    (1, 64, 256, None, 4), (2, 33, 100, None, 4), (3, 5, 2048, 2, 2), (4, 40, 72, 8, 1), (1, 3, 48, 16, 4),
    (2, 7, 2048, None, 4), (1, 5, 3000, 1, 4), (16, 40, 192, None, 4), (11, 7, 100, None, 4),
])
def test_rows_linear_matches_the_reference(dtype, t, r, k, block_n, warps):
    g = torch.Generator().manual_seed(t * 1000 + r + k)
    x = torch.randn(t, k, generator=g).to(dtype)
    w = (torch.randn(r, k, generator=g) / k ** 0.5).to(dtype)
    y = linear_triton.rows_linear(x, w, block_n, warps)
    assert y.dtype == dtype and y.shape == (t, r)
    assert_close(f"{t}x{r}x{k}", x.double() @ w.double().T, y, RATIO[dtype])
    # the reference carries its own rounding (its sum order is the CPU library's): each within RATIO of
    # the float64 product, so within twice that of each other
    assert_close(f"{t}x{r}x{k} vs reference", reference.rows_linear(x, w).double(), y, 2 * RATIO[dtype])


def test_slice_rows_fills_the_slice_with_whole_rows():
    assert linear_triton.slice_rows(2048, 2) == 1 and linear_triton.slice_rows(4096, 2) == 1
    assert linear_triton.slice_rows(256, 2) == 8 and linear_triton.slice_rows(100, 4) == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 2, 96), (2, 1, 96), (1, 3, 96), (5, 96), (2, 8, 96), (17, 96)])
def test_linear_takes_the_kernel_for_few_tokens_and_the_library_beyond(shape, dtype, monkeypatch):
    """bf16: the kernel for one or two tokens; fp32: up to FP32_TOKENS tokens by a small weight."""
    g = torch.Generator().manual_seed(len(shape))
    x, w = torch.randn(*shape, generator=g).to(dtype), torch.randn(24, 96, generator=g).to(dtype)
    calls = []
    monkeypatch.setattr(linear_triton, "rows_linear", lambda *a: calls.append(a) or reference.rows_linear(*a))
    tokens = x.numel() // 96
    takes = tokens <= (linear_triton.FP32_TOKENS if dtype == torch.float32 else linear_triton.SMALL_TOKENS)
    with torch.no_grad():  # as the runtime calls it
        y = linear_triton.linear(x, w)
        assert y.shape == (*shape[:-1], 24)
        torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
        assert len(calls) == takes
        calls.clear()
        linear_triton.linear(x, w.T.contiguous().T)  # a strided weight: the library product
        assert not calls
        monkeypatch.setattr(linear_triton, "FP32_WEIGHT", w.numel() - 1)  # a larger fp32 weight than it takes
        linear_triton.linear(x, w)
        assert len(calls) == (tokens <= linear_triton.SMALL_TOKENS)


def test_linear_leaves_what_the_kernel_does_not_take_to_the_library(monkeypatch):
    """K = 0, float64, autograd, and more tokens than SMALL_TOKENS: F.linear's result, no kernel."""
    monkeypatch.setattr(linear_triton, "rows_linear", lambda *a: pytest.fail("took the kernel"))
    assert linear_triton.linear(torch.randn(1, 0), torch.randn(4, 0)).eq(0).all()
    x, w = torch.randn(1, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(linear_triton.linear(x, w), F.linear(x, w))
    w32 = torch.randn(4, 16, requires_grad=True)
    assert linear_triton.linear(torch.randn(1, 16), w32).grad_fn is not None


def test_bad_arguments_are_named():
    x, w = torch.randn(1, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match="contiguous"):
        linear_triton.rows_linear(x, torch.randn(32, 8).T)
    with pytest.raises(ValueError, match="does not match"):
        linear_triton.rows_linear(torch.randn(1, 31), w)
    with pytest.raises(ValueError, match="does not match"):
        linear_triton.rows_linear(x.double(), w)
    with pytest.raises(ValueError, match="at most"):
        linear_triton.rows_linear(torch.randn(linear_triton.MAX_TOKENS + 1, 32), w)
