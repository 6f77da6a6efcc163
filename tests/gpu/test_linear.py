"""`kernels/linear` compiled on the GPU at the 35B out-projection's shape ([T, 4096] × [4096, 2048]),
plain and with the GDN heads' gated norm (`gate=`), and at the GDN input projection's: within bf16
rounding of the library product and the norm (the product's fp32 sum order differs from cuBLAS's),
each row of a 16-row call bit-equal to the row run alone, fp32 within fp32 rounding (IEEE products,
no TF32), and the launches replay in a CUDA graph with the same results."""

import pytest
import torch
import torch.nn.functional as F

from hybridspec.kernels.linear import reference
from hybridspec.kernels.linear import triton as linear_triton
from hybridspec.kernels.norm import reference as norm_reference

pytestmark = pytest.mark.gpu


def _inputs(tokens, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + tokens)
    x = torch.randn(1, tokens, 4096, generator=g, device="cuda").to(dtype)
    w = (torch.randn(2048, 4096, generator=g, device="cuda") / 64).to(dtype)
    r = torch.randn(1, tokens, 2048, generator=g, device="cuda").to(dtype)
    nw = (0.2 * torch.randn(2048, generator=g, device="cuda")).to(dtype)
    return x, w, r, nw


@pytest.mark.parametrize("tokens", [1, 2, 5, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equal_to_the_reference_within_rounding(tokens, dtype):
    x, w, r, nw = _inputs(tokens, dtype)
    y, s = linear_triton.linear_add_norm(x, w, r, nw, 1e-6)
    if dtype == torch.float32:
        product = F.linear(x.double(), w.double()).float()
        y_ref, s_ref = norm_reference.offset_rms_norm(product, nw, 1e-6, r)
        torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    else:
        y_ref, s_ref = reference.linear_add_norm(x, w, r, nw, 1e-6)
        torch.testing.assert_close(s.float(), s_ref.float(), rtol=1.6e-2, atol=2e-2)
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=1.6e-2, atol=3e-2)
        assert (s != s_ref).float().mean() < 0.05  # the sums' order flips a rounding now and then


def test_rows_are_batch_invariant_and_graphs_replay_them():
    x, w, r, nw = _inputs(16, torch.bfloat16, seed=3)
    y, s = linear_triton.linear_add_norm(x, w, r, nw, 1e-6)
    for t in range(16):
        y1, s1 = linear_triton.linear_add_norm(x[:, t:t + 1], w, r[:, t:t + 1], nw, 1e-6)
        assert torch.equal(y1, y[:, t:t + 1]) and torch.equal(s1, s[:, t:t + 1]), t
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        linear_triton.linear_add_norm(x, w, r, nw, 1e-6)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_triton.linear_add_norm(x, w, r, nw, 1e-6)
    x2, _, r2, _ = _inputs(16, torch.bfloat16, seed=9)
    x.copy_(x2)
    r.copy_(r2)
    graph.replay()
    torch.cuda.synchronize()
    want = linear_triton.linear_add_norm(x, w, r, nw, 1e-6)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def _gated_inputs(tokens, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + tokens)
    heads = torch.randn(1, tokens, 32, 128, generator=g, device="cuda").to(torch.bfloat16)  # GDN output heads
    gate = (3 * torch.randn(1, tokens, 32, 128, generator=g, device="cuda")).to(torch.bfloat16)
    gw = (1 + 0.3 * torch.randn(128, generator=g, device="cuda")).to(torch.bfloat16)
    _, w, r, nw = _inputs(tokens, torch.bfloat16, seed)
    return heads, gate, gw, w, r, nw


def _gated(heads, gate, gw, w, r, nw):
    return linear_triton.linear_add_norm(heads, w, r, nw, 1e-6, gate=gate, gate_weight=gw, gate_eps=1e-6)


def test_the_gated_heads_against_the_norms_own_launch_rows_alone_graphs_and_pdl(monkeypatch):
    """The gate= path compiled (the heads normed in a [16, 4, 128] tile, the gate weight read before
    the PDL wait): within bf16 rounding of the gated norm's launch followed by the product; each row
    of a 16-row call equal to the row alone; a graph replay equal to an eager call; PDL on and off
    equal bit for bit."""
    from hybridspec.kernels import pdl
    from hybridspec.kernels.norm import triton as norm_triton

    heads, gate, gw, w, r, nw = _gated_inputs(16, seed=5)
    y, s = _gated(heads, gate, gw, w, r, nw)
    normed = norm_triton.gated_rms_norm(heads, gate, gw, 1e-6).flatten(-2)
    y_ref, s_ref = linear_triton.linear_add_norm(normed, w, r, nw, 1e-6)
    torch.testing.assert_close(s.float(), s_ref.float(), rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1.6e-2, atol=3e-2)
    assert (s != s_ref).float().mean() < 0.05
    for t in (0, 7, 15):
        y1, s1 = _gated(heads[:, t:t + 1], gate[:, t:t + 1], gw, w, r[:, t:t + 1], nw)
        assert torch.equal(y1, y[:, t:t + 1]) and torch.equal(s1, s[:, t:t + 1]), t
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _gated(heads, gate, gw, w, r, nw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _gated(heads, gate, gw, w, r, nw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], y) and torch.equal(out[1], s)
    monkeypatch.setattr(pdl, "ENABLED", False)
    y0, s0 = _gated(heads, gate, gw, w, r, nw)
    assert torch.equal(y0, y) and torch.equal(s0, s)


def test_the_input_projection_within_rounding_rows_alone_graphs_and_pdl(monkeypatch):
    """`linear` compiled at the 35B GDN input projection's shape ([T, 2048] × [2048, 12352]): within
    bf16 rounding of the library product, each row of a 16-row call equal to the row alone, a graph
    replay equal to an eager call, PDL on and off equal bit for bit."""
    from hybridspec.kernels import pdl

    g = torch.Generator(device="cuda").manual_seed(21)
    x = torch.randn(1, 16, 2048, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(12352, 2048, generator=g, device="cuda") / 45).to(torch.bfloat16)
    y = linear_triton.linear(x, w)
    torch.testing.assert_close(y.float(), F.linear(x, w).float(), rtol=1.6e-2, atol=2e-2)
    assert (y != F.linear(x, w)).float().mean() < 0.05
    for t in (0, 7, 15):
        assert torch.equal(linear_triton.linear(x[:, t:t + 1], w), y[:, t:t + 1]), t
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        linear_triton.linear(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_triton.linear(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, y)
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert torch.equal(linear_triton.linear(x, w), y)
