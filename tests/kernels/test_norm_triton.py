"""The Triton RMS norms (the target's offset and gated norms, the drafter's plain norm) against their
PyTorch references (under TRITON_INTERPRET on CPU): fp32 equal within fp32 rounding of the row sums;
bf16 within one unit in the last place per rounding step (the interpreter rounds fp32 → bf16
towards zero where a GPU rounds to nearest, so the interpreter's bf16 results sit up to one ulp per
cast from the reference's); the residual sum exact; a row's result independent of the other rows in
the call (batch invariance)."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.norm import reference
from hybridspec.kernels.norm import triton as norm_triton


def _ulps_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return (ia - ib).abs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 5, 48), (1, 16, 256), (3, 0, 32)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_offset_rms_norm_matches_the_reference(dtype, shape, with_residual):
    g = torch.Generator().manual_seed(sum(shape) + with_residual)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    residual = torch.randn(shape, generator=g).to(dtype) if with_residual else None
    weight = (torch.randn(shape[-1], generator=g) * 0.2).to(dtype)
    y, s = norm_triton.offset_rms_norm(x, weight, 1e-6, residual)
    y_ref, s_ref = reference.offset_rms_norm(x, weight, 1e-6, residual)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    if dtype == torch.float32 or not interpreted():
        assert torch.equal(s, s_ref)  # the residual sum rounds exactly as torch's add
    elif x.numel():
        assert _ulps_bf16(s, s_ref).max() <= 1
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=1e-6)
    elif x.numel():  # one rounding (the result), two under the interpreter with a residual (its sum too)
        assert _ulps_bf16(y, y_ref).max() <= (2 if with_residual and interpreted() else 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 5, 48), (1, 16, 256), (3, 0, 32)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_plain_rms_norm_matches_the_reference(dtype, shape, with_residual):
    g = torch.Generator().manual_seed(7 + sum(shape) + with_residual)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    residual = torch.randn(shape, generator=g).to(dtype) if with_residual else None
    weight = (1 + torch.randn(shape[-1], generator=g) * 0.2).to(dtype)
    y, s = norm_triton.rms_norm(x, weight, 1e-6, residual)
    y_ref, s_ref = reference.rms_norm(x, weight, 1e-6, residual)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    if dtype == torch.float32 or not interpreted():
        assert torch.equal(s, s_ref)
    elif x.numel():
        assert _ulps_bf16(s, s_ref).max() <= 1
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=1e-6)
    elif x.numel():  # two roundings (the normalized value, its product with the weight, which carries the
        # first's error on), one more under the interpreter, one more again with its residual sum
        assert _ulps_bf16(y, y_ref).max() <= 2 + interpreted() + (with_residual and interpreted())


def test_plain_rms_norm_is_the_drafters_module():
    from hybridspec.runtime.layers.norms import RMSNorm

    g = torch.Generator().manual_seed(8)
    module = RMSNorm(40, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        module.weight.copy_(1 + 0.3 * torch.randn(40, generator=g))
    x = torch.randn(3, 40, generator=g).to(torch.bfloat16)
    assert torch.equal(module(x), reference.rms_norm(x, module.weight, 1e-6)[0])
    module.op = norm_triton.rms_norm
    y = module(x)
    assert _ulps_bf16(y, reference.rms_norm(x, module.weight, 1e-6)[0]).max() <= 2 + interpreted()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_dtype", ["same", "float32"])
def test_gated_rms_norm_matches_the_reference(dtype, x_dtype):
    g = torch.Generator().manual_seed(3)
    shape = (1, 7, 4, 96)  # [B, T, heads, dv]: one row per head
    x = torch.randn(shape, generator=g) * 2
    x = x if x_dtype == "float32" else x.to(dtype)
    gate = (torch.randn(shape, generator=g) * 4).to(dtype)  # silu over a wide range
    weight = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype)
    y, y_ref = norm_triton.gated_rms_norm(x, gate, weight, 1e-6), reference.gated_rms_norm(x, gate, weight, 1e-6)
    assert y.dtype == dtype and y.shape == shape
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    else:  # four roundings (x, the normalized value, its product with the weight, the result)
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=6 * 2**-8, atol=4e-3)


def test_gated_norm_reads_a_strided_gate_without_a_copy_of_its_own():
    # the gate as a slice of a fused projection output: each token's heads at the fused row's stride
    g = torch.Generator().manual_seed(6)
    fused = torch.randn(2, 5, 40 + 4 * 24 + 8, generator=g)
    gate = fused[..., 40 : 40 + 96].reshape(2, 5, 4, 24)
    assert not gate.is_contiguous()
    x, weight = torch.randn(2, 5, 4, 24, generator=g), 1 + 0.1 * torch.randn(24, generator=g)
    torch.testing.assert_close(norm_triton.gated_rms_norm(x, gate, weight, 1e-6),
                               reference.gated_rms_norm(x, gate, weight, 1e-6), rtol=1e-5, atol=1e-6)


def test_each_row_is_independent_of_the_rest_of_the_call():
    g = torch.Generator().manual_seed(4)
    x, r = torch.randn(1, 16, 80, generator=g), torch.randn(1, 16, 80, generator=g)
    weight = 0.1 * torch.randn(80, generator=g)
    y_all, s_all = norm_triton.offset_rms_norm(x, weight, 1e-6, r)
    for t in (1, 3, 11):
        y, s = norm_triton.offset_rms_norm(x[:, :t], weight, 1e-6, r[:, :t])
        assert torch.equal(y, y_all[:, :t]) and torch.equal(s, s_all[:, :t])
    gate = torch.randn(1, 16, 80, generator=g)
    assert torch.equal(norm_triton.gated_rms_norm(x[:, 5:6], gate[:, 5:6], weight, 1e-6),
                       norm_triton.gated_rms_norm(x, gate, weight, 1e-6)[:, 5:6])


def test_bad_shapes_are_named():
    x, w = torch.randn(2, 8), torch.zeros(8)
    with pytest.raises(ValueError, match="weight"):
        norm_triton.offset_rms_norm(x, torch.zeros(9), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        norm_triton.offset_rms_norm(x, w, 1e-6, torch.randn(2, 9))
    with pytest.raises(ValueError, match="contiguous"):
        norm_triton.offset_rms_norm(torch.randn(8, 2).t(), w, 1e-6)
    with pytest.raises(ValueError, match="dtype"):
        norm_triton.rms_norm(x, w.double(), 1e-6)
    with pytest.raises(ValueError, match="gate"):
        norm_triton.gated_rms_norm(x, torch.randn(3, 8), w, 1e-6)
