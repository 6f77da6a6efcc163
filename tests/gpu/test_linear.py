"""The register-slice product compiled on the GPU at the 35B preset's projection shapes (bf16, one
and two tokens) and in fp32: equal to the float64 product within the precision of the inputs, no
host read, and a CUDA-graph replay on new inputs gives what an eager call gives. The products with
a norm inside against the norm kernel, then the product."""

import pytest
import torch

from hybridspec.kernels.linear import triton as linear_triton
from hybridspec.kernels.norm.gated import gated_rms_norm
from hybridspec.kernels.norm.offset import offset_rms_norm
from tests.tolerance import assert_close

pytestmark = pytest.mark.gpu

SHAPES = {"gdn in_proj": (12352, 2048), "attention qkv": (9216, 2048), "out_proj": (2048, 4096),
          "122b out_proj": (3072, 8192), "awkward": (1000, 1000)}


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_equal_to_the_product_without_host_reads_and_in_a_graph(shape, dtype, t):
    r, k = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(r + t)
    x = torch.randn(t, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(r, k, device="cuda", generator=g) / k ** 0.5).to(dtype)
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = linear_triton.linear(x, w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(f"{shape} T={t}", x.double() @ w.double().T, y, 8e-3 if dtype == torch.bfloat16 else 1e-6)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = linear_triton.linear(x, w)
    x.copy_(torch.randn(t, k, device="cuda", generator=g).to(dtype))
    graph.replay()
    assert torch.equal(replayed, linear_triton.linear(x, w))


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("shape", ["gdn in_proj", "attention qkv"])
def test_norm_linear_equals_the_norm_kernel_then_the_product(shape, t):
    """bf16 at the 35B shapes: s bit for bit the norm kernel's, the normalised rows within one bf16
    rounding of it (the row's sum of squares in another order), so the product within the
    product's tolerance of the unfused launches; no host read; a graph replay equals an eager call."""
    r, k = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(r + t)
    x, res = (torch.randn(1, t, k, device="cuda", generator=g).bfloat16() for _ in range(2))
    nw = (0.1 * torch.randn(k, device="cuda", generator=g)).bfloat16()
    w = (torch.randn(r, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y, s = linear_triton.norm_linear(x, nw, 1e-6, res, w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    h_ref, s_ref = offset_rms_norm(x, nw, 1e-6, res)
    assert torch.equal(s, s_ref)
    assert_close(f"{shape} T={t}", linear_triton.rows_linear(h_ref, w).double(), y, 8e-3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed, replayed_s = linear_triton.norm_linear(x, nw, 1e-6, res, w)
    x.copy_(torch.randn(1, t, k, device="cuda", generator=g).bfloat16())
    graph.replay()
    y_now, s_now = linear_triton.norm_linear(x, nw, 1e-6, res, w)
    assert torch.equal(replayed, y_now) and torch.equal(replayed_s, s_now)


@pytest.mark.parametrize("t", [1, 2])
def test_gated_linear_equals_the_gated_norm_kernel_then_the_product(t):
    """The GDN out-projection at the 35B shapes (32 heads of 128, fp32 o, bf16 gate sliced from the
    projection output): within the product's tolerance of the gated norm kernel then the product;
    a graph replay equals an eager call."""
    hv, d, r = 32, 128, 2048
    g = torch.Generator(device="cuda").manual_seed(t)
    o = torch.randn(1, t, hv, d, device="cuda", generator=g)
    wide = torch.randn(1, t, 12352, device="cuda", generator=g).bfloat16()
    z = wide[..., 8192 : 8192 + hv * d].view(1, t, hv, d)
    nw = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).bfloat16()
    w = (torch.randn(r, hv * d, device="cuda", generator=g) / (hv * d) ** 0.5).bfloat16()
    y = linear_triton.gated_linear(o, z, nw, 1e-6, w)
    unfused = linear_triton.rows_linear(gated_rms_norm(o, z, nw, 1e-6).reshape(1, t, -1), w)
    assert_close(f"gated T={t}", unfused.double(), y, 8e-3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = linear_triton.gated_linear(o, z, nw, 1e-6, w)
    o.copy_(torch.randn(1, t, hv, d, device="cuda", generator=g))
    graph.replay()
    assert torch.equal(replayed, linear_triton.gated_linear(o, z, nw, 1e-6, w))
