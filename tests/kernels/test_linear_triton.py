"""The out-projection + residual add + norm (`kernels/linear`) under TRITON_INTERPRET on CPU: against
the reference (fp32 within the sums' rounding; bf16 within the product's rounding, whose fp32 sum
order differs from torch's), the norm of the parts against their in-order sum, each row of a call
(16 rows, or several blocks of 16 over a batch) bit-equal to the same row run alone (batch
invariance), calls past MAX_ROWS equal to `F.linear` and the norm, the gated heads, and the
launcher's layout checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridspec.kernels.linear import reference
from hybridspec.kernels.linear import triton as linear_triton
from hybridspec.kernels.linear.triton import LinearTiles
from hybridspec.kernels.norm import reference as norm_reference
from hybridspec.kernels.norm import triton as norm_triton

SMALL = LinearTiles(block_n=16, span=128, block_k=64)  # several programs and steps on small shapes


def _bf16_spacing(a: torch.Tensor) -> torch.Tensor:
    """bf16's spacing at each |a|."""
    return torch.exp2(torch.floor(torch.log2(a.float().abs().clamp_min(1e-30))) - 7)


def _inputs(shape, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((*shape, k), generator=g).to(dtype)
    weight = (torch.randn((n, k), generator=g) / k**0.5).to(dtype)
    residual = torch.randn((*shape, n), generator=g).to(dtype)
    norm_weight = (torch.randn(n, generator=g) * 0.2).to(dtype)
    return x, weight, residual, norm_weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,k,n,tiles", [((1, 1), 300, 60, SMALL), ((1, 5), 256, 48, SMALL),
                                             ((2, 3), 100, 33, SMALL), ((1, 16), 1100, 70, LinearTiles())])
def test_linear_add_norm_matches_the_reference(dtype, shape, k, n, tiles):
    x, weight, residual, norm_weight = _inputs(shape, k, n, dtype, k + n)
    y, s = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6, tiles=tiles)
    assert y.shape == s.shape == residual.shape and y.dtype == s.dtype == dtype
    if dtype == torch.float32:
        y_ref, s_ref = reference.linear_add_norm(x, weight, residual, norm_weight, 1e-6)
        torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    else:  # the product's exact fp32 value rounded once, then the add and the norm as the reference rounds
        product = F.linear(x.double(), weight.double()).to(dtype)
        y_ref, s_ref = norm_reference.offset_rms_norm(product, norm_weight, 1e-6, residual)
        torch.testing.assert_close(s, s_ref, rtol=1.6e-2, atol=2e-2)
        torch.testing.assert_close(y, y_ref, rtol=1.6e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_of_parts_sums_them_in_order(dtype):
    g = torch.Generator().manual_seed(7)
    parts = torch.randn((5, 6, 40), generator=g) * 2
    residual = torch.randn((2, 3, 40), generator=g).to(dtype)
    weight = (torch.randn(40, generator=g) * 0.2).to(dtype)
    y, s = norm_triton.offset_rms_norm_of_parts(parts, residual, weight, 1e-6)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    y_ref, s_ref = norm_reference.offset_rms_norm(total.to(dtype).view(2, 3, 40), weight, 1e-6, residual)
    if dtype == torch.float32:
        assert torch.equal(s, s_ref)
        torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=1e-6)
    else:  # the interpreter rounds fp32 → bf16 towards zero: one spacing of the sum, one of s
        bound = _bf16_spacing(total.view(2, 3, 40)) + _bf16_spacing(s_ref)
        assert ((s.float() - s_ref.float()).abs() <= bound).all()
        torch.testing.assert_close(y, y_ref, rtol=1.6e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_row_is_the_row_run_alone(dtype):
    x, weight, residual, norm_weight = _inputs((1, 16), 200, 40, dtype, 11)
    y, s = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6, tiles=SMALL)
    for t in (0, 5, 15):
        y1, s1 = linear_triton.linear_add_norm(x[:, t:t + 1], weight, residual[:, t:t + 1], norm_weight, 1e-6,
                                               tiles=SMALL)
        assert torch.equal(y1, y[:, t:t + 1]) and torch.equal(s1, s[:, t:t + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_past_sixteen_and_batches_run_the_same_tiles(dtype):
    """[2, 20] rows: two batch rows of 20 tokens, three 16-row blocks; every token equal to itself
    run alone."""
    x, weight, residual, norm_weight = _inputs((2, 20), 96, 24, dtype, 13)
    y, s = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6, tiles=SMALL)
    for b, t in ((0, 0), (0, 17), (1, 3), (1, 19)):
        y1, s1 = linear_triton.linear_add_norm(x[b:b + 1, t:t + 1], weight, residual[b:b + 1, t:t + 1],
                                               norm_weight, 1e-6, tiles=SMALL)
        assert torch.equal(y1, y[b:b + 1, t:t + 1]) and torch.equal(s1, s[b:b + 1, t:t + 1])


def test_the_weights_read_after_the_wait_change_no_bit():
    x, weight, residual, norm_weight = _inputs((1, 5), 200, 40, torch.bfloat16, 21)
    early = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6, tiles=SMALL)
    late = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6,
                                         tiles=LinearTiles(block_n=16, span=128, block_k=64, early_weights=False))
    assert torch.equal(early[0], late[0]) and torch.equal(early[1], late[1])


def test_calls_past_max_rows_take_the_library_product(monkeypatch):
    monkeypatch.setattr(linear_triton, "MAX_ROWS", 16)
    x, weight, residual, norm_weight = _inputs((1, 17), 64, 32, torch.float32, 3)
    y, s = linear_triton.linear_add_norm(x, weight, residual, norm_weight, 1e-6)
    y_ref, s_ref = norm_triton.offset_rms_norm(F.linear(x, weight), norm_weight, 1e-6, residual)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)


def test_the_launcher_names_what_is_wrong():
    x, weight, residual, norm_weight = _inputs((1, 2), 64, 32, torch.float32, 5)
    with pytest.raises(ValueError, match="weight"):
        linear_triton.linear_add_norm(x, weight[:, :60], residual, norm_weight, 1e-6)
    with pytest.raises(ValueError, match="residual"):
        linear_triton.linear_add_norm(x, weight, residual[..., :30], norm_weight, 1e-6)
    with pytest.raises(ValueError, match="share a dtype"):
        linear_triton.linear_add_norm(x, weight.double(), residual, norm_weight, 1e-6)
    heads, gate = x.view(1, 2, 2, 32), x.view(1, 2, 2, 32)
    with pytest.raises(ValueError, match="gate's dtype"):
        linear_triton.linear_add_norm(heads, weight, residual, norm_weight, 1e-6, gate=gate,
                                      gate_weight=torch.ones(32, dtype=torch.float64))
    with pytest.raises(ValueError, match="power of two"):
        LinearTiles(block_n=24)
    with pytest.raises(ValueError, match="multiple"):
        LinearTiles(span=64, block_k=128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_dtype", ["same", "float32"])
@pytest.mark.parametrize("tiles", [SMALL, LinearTiles(block_n=16, span=128, block_k=128),
                                   LinearTiles(block_n=16, span=64, block_k=64)])
def test_the_gated_heads_match_the_reference(dtype, x_dtype, tiles):
    """x = raw heads [.., H, dv] normed and gated inside the parts kernel where the tiles hold whole
    heads (dv 32 in spans of 64 or 128), through the gated norm's own launch where they do not (the
    last shape's span of 64 with dv 64 holds one; `dv=48` below none)."""
    g = torch.Generator().manual_seed(17)
    for dv in (32, 64, 48):
        heads = 4
        x = torch.randn((1, 3, heads, dv), generator=g) * 2
        x = x if x_dtype == "float32" else x.to(dtype)
        gate = (torch.randn((1, 3, heads, dv), generator=g) * 3).to(dtype)
        gate_weight = (1 + 0.3 * torch.randn(dv, generator=g)).to(dtype)
        weight = (torch.randn((40, heads * dv), generator=g) / (heads * dv) ** 0.5).to(dtype)
        residual = torch.randn((1, 3, 40), generator=g).to(dtype)
        norm_weight = (torch.randn(40, generator=g) * 0.2).to(dtype)
        args = (x, weight, residual, norm_weight, 1e-6)
        kw = dict(gate=gate, gate_weight=gate_weight, gate_eps=1e-5)
        y, s = linear_triton.linear_add_norm(*args, **kw, tiles=tiles)
        assert y.dtype == s.dtype == dtype and y.shape == s.shape == residual.shape
        if dtype == torch.float32:
            y_ref, s_ref = reference.linear_add_norm(*args, **kw)
            torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        elif dv & (dv - 1) == 0:  # against the gated norm's own launch then the product: the same
            # roundings (the interpreter's towards zero included), the heads' sums of squares in another
            # order (dv = 48 takes that two-step path itself; its values are checked in fp32 above)
            normed = norm_triton.gated_rms_norm(x, gate, gate_weight, 1e-5).reshape(1, 3, heads * dv)
            y_ref, s_ref = linear_triton.linear_add_norm(normed, weight, residual, norm_weight, 1e-6, tiles=tiles)
            torch.testing.assert_close(s, s_ref, rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(y, y_ref, rtol=1e-2, atol=1e-2)
            assert (s == s_ref).float().mean() > 0.9
        rows = [linear_triton.linear_add_norm(x[:, t:t + 1], weight, residual[:, t:t + 1], norm_weight, 1e-6,
                                              gate=gate[:, t:t + 1], gate_weight=gate_weight, gate_eps=1e-5,
                                              tiles=tiles)[0] for t in range(3)]
        assert torch.equal(torch.cat(rows, dim=1), y)  # batch invariance


# ------------------------------------------------------------------------------ input projections
INPUT_SMALL = LinearTiles(block_n=16, span=64, block_k=64)  # several programs and depth steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,k,n,tiles", [((1, 1), 300, 60, INPUT_SMALL), ((1, 5), 256, 48, INPUT_SMALL),
                                             ((2, 3), 100, 33, INPUT_SMALL),
                                             ((1, 16), 512, 70, linear_triton.INPUT_TILES)])
def test_linear_matches_the_reference(dtype, shape, k, n, tiles):
    """fp32 within the sums' rounding; bf16 within one rounding of the exact product (the fp32 sum
    runs in another order than torch's)."""
    x, weight, _, _ = _inputs(shape, k, n, dtype, k + n)
    y = linear_triton.linear(x, weight, tiles=tiles)
    assert y.shape == (*shape, n) and y.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(y, reference.linear(x, weight), rtol=1e-5, atol=1e-5)
    else:
        exact = F.linear(x.double(), weight.double())
        assert ((y.double() - exact).abs() <= 2 * _bf16_spacing(exact) + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_equal_the_row_alone(dtype):
    """Batch invariance: every row of a [4, 9] call (three 16-row blocks) equals the same row run
    alone, bit for bit, whatever the other rows hold."""
    x, weight, _, _ = _inputs((4, 9), 200, 40, dtype, 3)
    together = linear_triton.linear(x, weight, tiles=INPUT_SMALL)
    for b in range(4):
        for t in (0, 5, 8):
            alone = linear_triton.linear(x[b, t:t + 1], weight, tiles=INPUT_SMALL)
            assert torch.equal(together[b, t:t + 1], alone), (b, t)


def test_linear_reads_the_first_tile_early_or_late_to_the_same_bits():
    x, weight, _, _ = _inputs((1, 3), 200, 40, torch.bfloat16, 5)
    late = LinearTiles(block_n=16, span=64, block_k=64, early_weights=False)
    assert torch.equal(linear_triton.linear(x, weight, tiles=INPUT_SMALL), linear_triton.linear(x, weight, tiles=late))


def test_linear_past_its_row_bound_is_f_linear():
    x, weight, _, _ = _inputs((1, linear_triton.LINEAR_MAX_ROWS + 1), 64, 24, torch.float32, 9)
    assert torch.equal(linear_triton.linear(x, weight), F.linear(x, weight))


@pytest.mark.parametrize("case, match", [
    ("wide-weight", r"is not \[N, 64\]"),
    ("strided-weight", "weight rows must be contiguous"),
    ("dtypes", "must share a dtype"),
    ("strided-x", "x must be contiguous"),
    ("no-depth", "no depth"),
])
def test_linear_names_what_is_wrong(case, match):
    x, weight, _, _ = _inputs((1, 2), 64, 24, torch.float32, 11)
    if case == "wide-weight":
        weight = torch.zeros(24, 65)
    elif case == "strided-weight":
        weight = torch.zeros(64, 24).t()
    elif case == "dtypes":
        weight = weight.to(torch.bfloat16)
    elif case == "no-depth":
        x, weight = torch.zeros(1, 2, 0), torch.zeros(24, 0)
    else:
        x = torch.zeros(1, 2, 128)[..., ::2]
    with pytest.raises(ValueError, match=match):
        linear_triton.linear(x, weight)
