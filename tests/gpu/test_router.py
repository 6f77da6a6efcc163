"""The Triton router compiled on the GPU at the 35B and 122B router shapes: the reference's experts
in its order, weights within fp32 rounding (bf16: one rounding), no host read, replays in a CUDA
graph."""

import pytest
import torch

from hybridspec.kernels.moe import reference
from hybridspec.kernels.moe import router as moe_router
from hybridspec.kernels.norm.offset import offset_rms_norm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [1, 16, 512])
@pytest.mark.parametrize("experts,top_k", [(256, 8), (512, 10)])
def test_equal_to_the_reference_on_the_gpu(tokens, experts, top_k):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    logits = 2 * torch.randn(tokens, experts, generator=g, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, weights = moe_router.router_topk(logits, top_k, True, torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ids_ref, weights_ref = reference.router_topk(logits, top_k, True, torch.bfloat16)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(weights.float(), weights_ref.float(), rtol=8e-3, atol=1e-3)


def test_replays_in_a_cuda_graph():
    logits = torch.randn(8, 256, device="cuda")
    moe_router.router_topk(logits, 8, True, torch.float32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, weights = moe_router.router_topk(logits, 8, True, torch.float32)
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    ids_ref, weights_ref = reference.router_topk(logits, 8, True, torch.float32)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("tokens", [1, 2, 16])
@pytest.mark.parametrize("experts,top_k,hidden", [(256, 8, 2048), (512, 10, 2048), (256, 8, 3072)])
def test_one_launch_router_on_the_gpu(tokens, experts, top_k, hidden):
    """Compiled: logits within bf16 rounding of F.linear's, a top-k of their softmax, no host read,
    and a graph replay on new inputs gives what an eager call gives."""
    g = torch.Generator(device="cuda").manual_seed(tokens + experts)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(experts, hidden, device="cuda", generator=g) / hidden ** 0.5).to(torch.bfloat16)
    logits = torch.empty(tokens, experts, device="cuda", dtype=torch.bfloat16)
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, weights = moe_router.router(x, weight, top_k, True, torch.bfloat16, logits=logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(logits.float(), torch.nn.functional.linear(x.float(), weight.float()), rtol=8e-3, atol=8e-3)
    probs = torch.softmax(logits.float(), -1)
    chosen = probs.gather(1, ids)
    assert bool((chosen.min(1).values >= probs.scatter(1, ids, -1.0).max(1).values).all())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_ids, g_weights = moe_router.router(x, weight, top_k, True, torch.bfloat16)
    x.copy_(torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16))
    graph.replay()
    want = moe_router.router(x, weight, top_k, True, torch.bfloat16)
    assert torch.equal(g_ids, want[0]) and torch.equal(g_weights, want[1])


@pytest.mark.parametrize("tokens", [1, 2])
def test_norm_router_on_the_gpu(tokens):
    """bf16 at the 35B shapes, the calls the register-slice form takes (one token): s the norm
    kernel's bit for bit, h within one bf16 rounding of it, the experts a top-k of the softmax of h's
    logits, no host read; a graph replay equals an eager call. Two tokens take the tile router, so
    the call is left to the caller (None)."""
    hidden, experts, top_k = 2048, 256, 8
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x, res = (torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16() for _ in range(2))
    nw = (0.1 * torch.randn(hidden, device="cuda", generator=g)).bfloat16()
    weight = (torch.randn(experts, hidden, device="cuda", generator=g) / hidden ** 0.5).bfloat16()
    if tokens > moe_router.ROUTER_TILES.rows_tokens:
        assert moe_router.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.bfloat16) is None
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, weights, h, s = moe_router.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    h_ref, s_ref = offset_rms_norm(x, nw, 1e-6, res)
    assert torch.equal(s, s_ref)
    assert (h.float() - h_ref.float()).abs().le(h_ref.float().abs() * 2 ** -7 + 1e-6).all()
    probs = torch.softmax(torch.nn.functional.linear(h.float(), weight.float()), -1)
    chosen = probs.gather(1, ids)
    assert bool((chosen.min(1).values >= probs.scatter(1, ids, -1.0).max(1).values - 1e-3).all())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = moe_router.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.bfloat16)
    x.copy_(torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16())
    graph.replay()
    want = moe_router.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(replayed, want))
