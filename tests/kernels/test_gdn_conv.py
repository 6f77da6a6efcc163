"""The GDN causal conv + SiLU kernel (under TRITON_INTERPRET on CPU) and its reference against a
float64 oracle: fp32 within fp32 rounding; bf16 within a few units in the last place (the
interpreter rounds fp32 → bf16 towards zero where a GPU rounds to nearest); the copy of x exact;
x read through the strided slice of the fused projection; bad shapes named."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.gdn import reference
from hybridspec.kernels.gdn.conv import causal_conv_silu


def _inputs(B, T, C, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, C + 37, generator=g).to(dtype)  # x is a slice of a wider projection
    state = torch.randn(B, C, K - 1, generator=g).to(dtype)
    weight = (torch.randn(C, 1, K, generator=g) * 0.5).to(dtype)
    return fused[..., :C], state, weight


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got − want| in units of the last place of bf16 at want's magnitude."""
    exponent = torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -20)))
    return (got.double() - want).abs() / 2.0 ** (exponent - 7)


@pytest.mark.parametrize("B, T, C, K", [(1, 1, 200, 4), (1, 2, 130, 4), (2, 7, 256, 4), (1, 16, 300, 4),
                                        (1, 40, 64, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_oracle_and_copies_x(B, T, C, K, dtype):
    x, state, weight = _inputs(B, T, C, K, dtype, seed=T + C)
    want = reference.causal_conv_silu(x.double(), state.double(), weight.double())
    x_out = torch.zeros(B, T, C, dtype=dtype)
    got = causal_conv_silu(x, state, weight, x_out=x_out)
    ref = reference.causal_conv_silu(x, state, weight)
    assert got.shape == (B, T, C) and got.dtype == dtype and got.is_contiguous() and torch.equal(x_out, x)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ref.double(), want, rtol=1e-6, atol=1e-6)
    else:  # two roundings (the conv, the SiLU), each up to one ulp plus the interpreter's truncation
        assert _ulps(got, want).max() <= 4, float(_ulps(got, want).max())


def test_the_first_tokens_read_the_state():
    """With x = 0, token t's conv is Σ_{j ≥ t+1} w_j state_{j−…}: the state alone feeds the first K − 1 tokens."""
    x, state, weight = _inputs(1, 5, 32, 4, torch.float32)
    zero = torch.zeros_like(x)
    got = causal_conv_silu(zero, state, weight)
    want = reference.causal_conv_silu(zero, state, weight)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert got[0, 3:].abs().max() == 0  # past the window: silu(0) = 0


def test_bad_shapes_are_named():
    x, state, weight = _inputs(1, 3, 32, 4, torch.float32)
    with pytest.raises(ValueError, match="do not fit"):
        causal_conv_silu(x, state[..., :2], weight)
    with pytest.raises(ValueError, match="unit channel stride"):
        causal_conv_silu(x.transpose(1, 2).contiguous().transpose(1, 2), state, weight)
