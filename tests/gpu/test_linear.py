"""The register-slice product compiled on the GPU at the 35B preset's projection shapes (bf16, one
and two tokens) and in fp32: equal to the float64 product within the precision of the inputs, no
host read, and a CUDA-graph replay on new inputs gives what an eager call gives."""

import pytest
import torch

from hybridspec.kernels.linear import triton as linear_triton
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
