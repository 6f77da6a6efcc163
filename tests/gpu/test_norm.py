"""The Triton RMS norms (the target's offset and gated norms, the drafter's plain one) compiled on
the GPU at the 35B shapes: bf16 results within two units in the last place of the PyTorch
reference on CUDA (the row sums' order differs, and a one-ulp flip of an intermediate rounding can
reach the result as two), on under 1 % of the elements; the residual sum bit-exact; fp32 within
fp32 rounding; one launch that replays in a CUDA graph."""

import pytest
import torch

from hybridspec.kernels.norm import reference
from hybridspec.kernels.norm import triton as norm_triton

pytestmark = pytest.mark.gpu


def _ulps(a, b):
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("tokens", [1, 8, 16, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equal_to_the_reference_on_the_gpu(tokens, dtype):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = (3 * torch.randn(1, tokens, 2048, generator=g, device="cuda")).to(dtype)
    r = torch.randn(1, tokens, 2048, generator=g, device="cuda").to(dtype)
    w = (0.2 * torch.randn(2048, generator=g, device="cuda")).to(dtype)
    (y, s), (y_ref, s_ref) = norm_triton.offset_rms_norm(x, w, 1e-6, r), reference.offset_rms_norm(x, w, 1e-6, r)
    assert torch.equal(s, s_ref)
    o = torch.randn(1, tokens, 32, 128, generator=g, device="cuda")  # GDN output heads, fp32 from the kernel
    gate = (4 * torch.randn(1, tokens, 32, 128, generator=g, device="cuda")).to(dtype)
    wg = (1 + 0.3 * torch.randn(128, generator=g, device="cuda")).to(dtype)
    z, z_ref = norm_triton.gated_rms_norm(o, gate, wg, 1e-6), reference.gated_rms_norm(o, gate, wg, 1e-6)
    wp = (1 + 0.2 * torch.randn(2048, generator=g, device="cuda")).to(dtype)  # the drafter's plain norm
    (p, ps), (p_ref, ps_ref) = norm_triton.rms_norm(x, wp, 1e-6, r), reference.rms_norm(x, wp, 1e-6, r)
    assert torch.equal(ps, ps_ref)
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(z, z_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p, p_ref, rtol=2e-6, atol=1e-6)
    else:
        for got, want in ((y, y_ref), (z, z_ref), (p, p_ref)):
            ulps = _ulps(got, want)
            assert ulps.max() <= 2 and (ulps > 0).float().mean() < 0.01, (ulps.max(), (ulps > 0).float().mean())


def test_replays_in_a_cuda_graph():
    x = torch.randn(1, 8, 2048, device="cuda", dtype=torch.bfloat16)
    r, w = torch.randn_like(x), torch.zeros(2048, device="cuda", dtype=torch.bfloat16)
    norm_triton.offset_rms_norm(x, w, 1e-6, r)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, s = norm_triton.offset_rms_norm(x, w, 1e-6, r)
    x.copy_(torch.randn_like(x))
    graph.replay()
    y_ref, s_ref = reference.offset_rms_norm(x, w, 1e-6, r)
    assert torch.equal(s, s_ref) and _ulps(y, y_ref).max() <= 1
