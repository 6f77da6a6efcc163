"""The GDN causal conv + SiLU kernel compiled on the GPU at the 35B shapes (8,192 conv channels
read from the fused 12,352-wide projection): against a float64 oracle that rounds where the kernel
rounds (the conv to bf16 before the SiLU, as the PyTorch path does), within one bf16 ulp except
where the fp32 conv and the float64 conv round to different bf16 neighbours (rare); fp32 within
fp32 rounding; x copied exactly; one launch that replays in a CUDA graph."""

import pytest
import torch

from hybridspec.kernels.gdn import reference
from hybridspec.kernels.gdn.conv import causal_conv_silu
from tests.kernels.test_gdn_conv import _ulps

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T", [1, 4, 16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equal_to_the_oracle_on_the_gpu(T, dtype):
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(1, T, 12352, generator=g, device="cuda").to(dtype)[..., :8192]
    state = torch.randn(1, 8192, 3, generator=g, device="cuda").to(dtype)
    weight = (0.5 * torch.randn(8192, 1, 4, generator=g, device="cuda")).to(dtype)
    x_out = torch.empty(1, T, 8192, device="cuda", dtype=dtype)
    got = causal_conv_silu(x, state, weight, x_out=x_out)
    want = reference.causal_conv_silu(x.double(), state.double(), weight.double())
    assert torch.equal(x_out, x)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    else:
        window = torch.cat((state.double(), x.double().transpose(1, 2)), dim=-1)
        conv = torch.nn.functional.conv1d(window, weight.double(), groups=x.shape[-1]).transpose(1, 2)
        rounded = torch.nn.functional.silu(conv.to(dtype).double())
        ulps = _ulps(got, rounded)
        assert (ulps > 1).double().mean() < 1e-3, float((ulps > 1).double().mean())
        assert ulps.max() <= 8, float(ulps.max())


def test_replays_in_a_cuda_graph():
    x = torch.randn(1, 16, 8192, device="cuda", dtype=torch.bfloat16)
    state = torch.randn(1, 8192, 3, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(8192, 1, 4, device="cuda", dtype=torch.bfloat16)
    causal_conv_silu(x, state, weight)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = causal_conv_silu(x, state, weight)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(y, causal_conv_silu(x, state, weight))
