"""The Triton MoE kernels compiled on the GPU, at the 35B shapes (bf16) and in fp32: equal to the
float64 oracle within the precision of their inputs (prefill lengths above 64 tokens included), no
host read (`torch.cuda.set_sync_debug_mode("error")` turns one into an error), the call replays in
a CUDA graph on new inputs and new routing, and `MoETuning.down_early_weights` gives the shipped
launches' bits."""

import pytest
import torch

from hybridspec.kernels.moe import triton as moe_triton
from tests.kernels.moe_cases import expert_parts, moe_inputs, moe_oracle, poisoned_allocations
from tests.tolerance import assert_close

pytestmark = pytest.mark.gpu

SHAPES = {"35b": (256, 8, 2048, 512, 512), "small-fp32": (64, 4, 96, 48, 40)}  # E, k, H, I, Is


def _cuda(args: dict) -> dict:
    return {k: (type(v)(*(t.cuda() for t in v)) if isinstance(v, tuple) else v.cuda()) if v is not None else None
            for k, v in args.items()}


@pytest.mark.parametrize("n", [1, 4, 16, 40, 70])
@pytest.mark.parametrize("shape", SHAPES)
def test_equal_to_the_oracle_on_the_gpu(shape, n):
    e, k, h, i, i_s = SHAPES[shape]
    dtype = torch.bfloat16 if shape == "35b" else torch.float32
    args = moe_inputs(n, k, e, h, i, i_s, dtype=dtype, seed=n)
    got = moe_triton.moe_experts(**_cuda(args))
    assert_close(f"{shape} N={n}", moe_oracle(**args), got, 1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("n", [1, 16, 70])
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


@pytest.mark.parametrize("n", [1, 4, 40, 70])
def test_down_early_weights_equal_the_shipped_launches_in_a_graph_on_the_gpu(n):
    """`MoETuning.down_early_weights` (each down program's expert and first weight tile read before
    the programmatic-dependent-launch wait), compiled at the 35B shapes (PDL on where the GPU has
    it): bit for bit the shipped launches' result, eager and replayed in a CUDA graph, with no host
    read."""
    from hybridspec.kernels.moe.tuning import MoETuning

    e, k, h, i, i_s = SHAPES["35b"]
    tuning = {64: MoETuning(down_early_weights=True)}
    args = _cuda(moe_inputs(n, k, e, h, i, i_s, dtype=torch.bfloat16, seed=n))
    want = moe_triton.moe_experts(**args)
    assert torch.equal(moe_triton.moe_experts(**args, tuning=tuning), want)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe_triton.moe_experts(**args, tuning=tuning)
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, want)


@pytest.mark.parametrize("n", [1, 16])
def test_the_shared_expert_beside_on_a_second_stream_eager_and_in_a_graph(n):
    """`SparseMoE.shared_beside_from` on the GPU at the 35B shapes: the block runs the shared expert
    on its second stream and the routed experts on the caller's, and joins them; eager calls equal the
    shared-slot block within bf16 rounding, and a CUDA graph of the block (both streams captured)
    replays bit for bit what the eager block gives on new inputs."""
    from hybridspec.runtime.layers import moe
    from hybridspec.runtime.loading import target_config

    cfg = target_config("qwen3.6-35b-a3b")
    gen = torch.Generator(device="cuda").manual_seed(3)
    with torch.device("meta"):
        block = moe.SparseMoE(cfg, moe_triton.moe_experts)
    block = block.to_empty(device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device="cuda") / p.shape[-1] ** 0.5)
    x = torch.randn(1, n, cfg.hidden_size, generator=gen, device="cuda").to(torch.bfloat16)
    slot, ids = block(x)
    streams = []  # (all ids −1: the shared expert alone, the stream the call ran on)

    def recorded(x, ids, *args, **kwargs):
        streams.append((bool((ids < 0).all()), torch.cuda.current_stream().cuda_stream))
        return moe_triton.moe_experts(x, ids, *args, **kwargs)

    block.experts_op, block.shared_beside_from = recorded, 1
    beside, beside_ids = block(x)
    side = moe._side_stream(x.device).cuda_stream
    assert streams == [(True, side), (False, torch.cuda.current_stream().cuda_stream)] and side != streams[1][1]
    block.experts_op = moe_triton.moe_experts  # the recorder reads ids on the host: not in a capture
    assert torch.equal(beside_ids, ids)
    assert_close(f"N={n}", slot.double(), beside.double(), 1e-2)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = block(x)
    x.copy_(torch.randn(1, n, cfg.hidden_size, generator=gen, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, block(x)[0])
