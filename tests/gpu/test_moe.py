"""The Triton MoE kernels compiled on the GPU, at the 35B shapes (bf16) and in fp32: equal to the
float64 oracle within the precision of their inputs (prefill lengths above 64 tokens included), no
host read (`torch.cuda.set_sync_debug_mode("error")` turns one into an error), the call replays in
a CUDA graph on new inputs and new routing."""

import pytest
import torch

from hybridspec.kernels.moe import triton as moe_triton
from tests.kernels.moe_cases import expert_parts, moe_inputs, moe_oracle, poisoned_allocations
from tests.tolerance import assert_close

pytestmark = pytest.mark.gpu

SHAPES = {"35b": (256, 8, 2048, 512, 512), "small-fp32": (64, 4, 96, 48, 40)}  # E, k, H, I, Is


def _cuda(args: dict) -> dict:
    """The tensors of a call's arguments (alone or in a tuple) on the GPU; other values as they are."""
    def moved(v):
        if isinstance(v, torch.Tensor):
            return v.cuda()
        if isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v):
            return type(v)(*(t.cuda() for t in v))
        return v

    return {k: moved(v) for k, v in args.items()}


@pytest.mark.parametrize("n", [1, 2, 4, 16, 24, 40, 70])
@pytest.mark.parametrize("shape", SHAPES)
def test_equal_to_the_oracle_on_the_gpu(shape, n):
    """Within the precision of the inputs, on NaN-poisoned memory."""
    e, k, h, i, i_s = SHAPES[shape]
    dtype = torch.bfloat16 if shape == "35b" else torch.float32
    args = moe_inputs(n, k, e, h, i, i_s, dtype=dtype, seed=n)
    with poisoned_allocations():  # an act column or output the launches leave unwritten shows as NaN
        got = moe_triton.moe_experts(**_cuda(args))
    assert torch.isfinite(got).all()
    assert_close(f"{shape} N={n}", moe_oracle(**args), got, 1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("n", [1, 2, 16, 70])
def test_expert_parallel_parts_sum_to_the_oracle_on_the_gpu(n):
    """Four processes' parts of the 35B call compiled (a quarter of the experts each, the shared
    expert on process 0): each part's rows of experts held elsewhere add nothing and the parts sum
    to the oracle, on NaN-poisoned memory (an unwritten output or counter shows)."""
    e, k, h, i, i_s = SHAPES["35b"]
    args = moe_inputs(n, k, e, h, i, i_s, dtype=torch.bfloat16, seed=n + 100)
    with poisoned_allocations():
        parts = [moe_triton.moe_experts(**_cuda(part)) for part in expert_parts(args, 4)]
    assert all(torch.isfinite(p).all() for p in parts)
    total = torch.stack([p.double() for p in parts]).sum(0)
    assert_close(f"35b expert-parallel N={n}", moe_oracle(**args), total, 1e-2)


def test_no_host_read_and_graph_replay_on_new_routing():
    e, k, h, i, i_s = SHAPES["35b"]
    args = _cuda(moe_inputs(16, k, e, h, i, i_s, dtype=torch.bfloat16))
    moe_triton.moe_experts(**args)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_triton.moe_experts(**args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_triton.moe_experts(**args)
    fresh = moe_inputs(16, k, e, h, i, i_s, dtype=torch.bfloat16, seed=7)
    for name in ("x", "ids", "weights"):
        args[name].copy_(fresh[name])
    graph.replay()
    assert_close("graph replay", moe_oracle(**{**fresh, **{n: args[n].cpu() for n in ("gate_up", "down")},
                                             "shared": type(args["shared"])(*(t.cpu() for t in args["shared"]))}),
                 out, 1e-2)
