"""The register-slice product (`kernels/linear`, under TRITON_INTERPRET=1 on CPU tensors) against
its reference and the float64 product: one to four tokens, awkward widths (K and R not powers of
two, slices wider than the weight), bf16 and fp32, leading batch dimensions; the dispatcher
`linear` takes the kernel for one or two tokens and the library product beyond, with the same
result shape; bad arguments are named."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.linear import reference
from hybridspec.kernels.norm import reference as norm_reference
from tests.tolerance import assert_close

pytest.importorskip("triton")

from hybridspec.kernels.linear import triton as linear_triton  # noqa: E402
from hybridspec.kernels.linear.rows import launch_rows_linear  # noqa: E402
from hybridspec.kernels.linear.rows_gated import launch_rows_gated_linear  # noqa: E402
from hybridspec.kernels.norm.gated import gated_rms_norm  # noqa: E402

RATIO = {torch.float32: 1e-6, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, r, k, block_n, warps", [
    (1, 64, 256, None, 4), (2, 33, 100, None, 4), (3, 5, 2048, 2, 2), (4, 40, 72, 8, 1), (1, 3, 48, 16, 4),
    (2, 7, 2048, None, 4), (1, 5, 3000, 1, 4),
])
def test_rows_linear_matches_the_reference(dtype, t, r, k, block_n, warps):
    g = torch.Generator().manual_seed(t * 1000 + r + k)
    x = torch.randn(t, k, generator=g).to(dtype)
    w = (torch.randn(r, k, generator=g) / k ** 0.5).to(dtype)
    y = linear_triton.rows_linear(x, w, block_n, warps)
    assert y.dtype == dtype and y.shape == (t, r)
    assert_close(f"{t}x{r}x{k}", x.double() @ w.double().T, y, RATIO[dtype])
    assert_close(f"{t}x{r}x{k} vs reference", reference.rows_linear(x, w).double(), y, RATIO[dtype])


def test_slice_rows_fills_the_slice_with_whole_rows():
    assert linear_triton.slice_rows(2048, 2) == 1 and linear_triton.slice_rows(4096, 2) == 1
    assert linear_triton.slice_rows(256, 2) == 8 and linear_triton.slice_rows(100, 4) == 16


@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 2, 96), (2, 1, 96), (1, 3, 96), (5, 96)])
def test_linear_takes_the_kernel_for_few_tokens_and_the_library_beyond(shape, monkeypatch):
    g = torch.Generator().manual_seed(len(shape))
    x, w = torch.randn(*shape, generator=g), torch.randn(24, 96, generator=g)
    calls = []
    monkeypatch.setattr(linear_triton, "rows_linear", lambda *a: calls.append(a) or reference.rows_linear(*a))
    with torch.no_grad():  # as the runtime calls it
        y = linear_triton.linear(x, w)
        assert y.shape == (*shape[:-1], 24)
        torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
        assert len(calls) == (x.numel() // 96 <= linear_triton.SMALL_TOKENS)
        calls.clear()
        linear_triton.linear(x, w.T.contiguous().T)  # a strided weight: the library product
        assert not calls


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


def _norm_inputs(t, k, r, dtype, residual, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, t, k, generator=g).to(dtype)
    res = torch.randn(1, t, k, generator=g).to(dtype) if residual else None
    nw = (0.1 * torch.randn(k, generator=g)).to(dtype)
    w = (torch.randn(r, k, generator=g) / k ** 0.5).to(dtype)
    return x, res, nw, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, r, k, residual", [(1, 33, 100, True), (2, 7, 2048, True), (1, 5, 3000, False),
                                               (2, 64, 256, False), (3, 9, 96, True)])
def test_norm_linear_matches_the_norm_then_the_product(dtype, t, r, k, residual, monkeypatch):
    """One or two tokens: one launch (no norm kernel) whose product equals the reference's within the
    norm's rounding and whose s is the reference's bit for bit; three tokens: the norm kernel, then
    `linear`."""
    x, res, nw, w = _norm_inputs(t, k, r, dtype, residual, t * 7 + r + k)
    norm_calls = []
    monkeypatch.setattr(linear_triton.norm_triton, "offset_rms_norm",
                        lambda *a: norm_calls.append(a) or norm_reference.offset_rms_norm(*a))
    with torch.no_grad():
        y, s = linear_triton.norm_linear(x, nw, 1e-6, res, w)
    y_ref, s_ref = reference.norm_linear(x, nw, 1e-6, res, w)
    assert len(norm_calls) == (t > linear_triton.SMALL_TOKENS)
    assert y.dtype == dtype and y.shape == (1, t, r) and s.shape == x.shape
    if dtype == torch.float32 or not interpreted():  # the interpreter rounds fp32 → bf16 towards zero
        assert torch.equal(s, s_ref)
    else:
        assert_close("s", s_ref, s, RATIO[dtype])
    assert_close(f"norm_linear {t}x{r}x{k}", y_ref, y, RATIO[dtype])


@pytest.mark.parametrize("o_dtype, dtype", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                            (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("t, hv, d, r", [(1, 3, 24, 17), (2, 4, 32, 40), (1, 32, 128, 3), (3, 2, 16, 5)])
def test_gated_linear_matches_the_gated_norm_then_the_product(o_dtype, dtype, t, hv, d, r, monkeypatch):
    """o and a strided z (a slice of a wider projection, as the GDN layer hands them): one launch for
    one or two tokens, the gated norm's kernel and `linear` beyond; the reference's result within
    the norm's rounding."""
    g = torch.Generator().manual_seed(t * 100 + hv * 10 + d)
    o = torch.randn(1, t, hv, d, generator=g).to(o_dtype)
    wide = torch.randn(1, t, hv * d + 11, generator=g).to(dtype)
    z = wide[..., 5 : 5 + hv * d].view(1, t, hv, d)
    nw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    w = (torch.randn(r, hv * d, generator=g) / (hv * d) ** 0.5).to(dtype)
    norm_calls = []
    monkeypatch.setattr(linear_triton.norm_triton, "gated_rms_norm",
                        lambda *a: norm_calls.append(a) or norm_reference.gated_rms_norm(*a))
    with torch.no_grad():
        y = linear_triton.gated_linear(o, z, nw, 1e-6, w)
    assert len(norm_calls) == (t > linear_triton.SMALL_TOKENS)
    assert y.dtype == dtype and y.shape == (1, t, r)
    # one launch: the unfused launches' result (the interpreter's bf16 roundings, towards zero, on
    # both sides), then the reference's, whose four roundings per value the interpreter takes the
    # other way; beyond SMALL_TOKENS the (patched) reference norm, then the product
    fused = t <= linear_triton.SMALL_TOKENS
    norm = gated_rms_norm if fused else norm_reference.gated_rms_norm
    assert_close(f"gated_linear {t}x{hv}x{d}", reference.rows_linear(norm(o, z, nw, 1e-6).reshape(1, t, -1), w), y,
                 RATIO[dtype])
    ratio = 3e-2 if fused and dtype == torch.bfloat16 and interpreted() else RATIO[dtype]
    assert_close(f"gated_linear {t}x{hv}x{d} vs reference", reference.gated_linear(o, z, nw, 1e-6, w), y, ratio)


def test_normalised_products_name_bad_arguments():
    x, res, nw, w = _norm_inputs(1, 32, 8, torch.float32, True, 0)
    with pytest.raises(ValueError, match="norm weight"):
        launch_rows_linear(x[0], w, torch.empty(1, 8), 1, 4, {"USE_GDC": False},
                           norm=(nw[:16], 1e-6, res[0], torch.empty(1, 32)))
    o = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="contiguous"):
        launch_rows_gated_linear(o, o, torch.ones(16), 1e-6, torch.randn(32, 16).T, torch.empty(1, 32), 1, 4,
                                 {"USE_GDC": False})
