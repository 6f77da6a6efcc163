"""The few-row Triton product compiled on the GPU at the 35B projection shapes: within bf16
rounding of an fp32 product, rows independent of each other, replays in a CUDA graph."""

import pytest
import torch

from hybridspec.kernels.linear import triton as linear_triton

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("k,n", [(4096, 2048), (2048, 12352), (2048, 9216)])
def test_few_row_product_on_the_gpu(rows, k, n):
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    y = linear_triton.linear(x, w)
    torch.testing.assert_close(y.float(), torch.nn.functional.linear(x.float(), w.float()), rtol=8e-3, atol=8e-3)
    assert torch.equal(linear_triton.linear(x[:1], w), y[:1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_triton.linear(x, w)
    x.copy_(torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16))
    graph.replay()
    assert torch.equal(out, linear_triton.linear(x, w))
