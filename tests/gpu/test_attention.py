"""The Triton gated attention compiled on the GPU at the 35B shapes (16 query heads, 2 KV heads,
head dim 256) over a 1,100-key cache: within bf16 (fp32) rounding of a float64 oracle, no worse
than the PyTorch reference; bitwise repeatable; no host read; one captured CUDA graph right at
every context length it is replayed at (the length read on the device), in a cache of 1,100
positions and in one of 32,768 (a server's context limit, far past the context)."""

import pytest
import torch

from hybridspec.kernels.attention import reference
from hybridspec.kernels.attention import triton as attention_triton
from tests.kernels.test_attention_triton import _prepare_case, _prepare_oracle, oracle

pytestmark = pytest.mark.gpu

S, H, H_KV, D = 1100, 16, 2, 256
LONG = 32768  # a cache sized for a server's context limit


def _inputs(T, dtype, seed=0, positions=S):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, gate = (torch.randn(1, T, H, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    key, value = (torch.randn(1, positions, H_KV, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    return q, gate, key, value


CASES = [(T, dtype, S) for T in (1, 2, 8, 16, 64) for dtype in (torch.bfloat16, torch.float32)]
CASES += [(T, torch.bfloat16, LONG) for T in (1, 16)]


@pytest.mark.parametrize(("T", "dtype", "positions"), CASES)
def test_matches_the_oracle_on_the_gpu(T, dtype, positions):
    q, gate, key, value = _inputs(T, dtype, seed=T, positions=positions)
    for p in (0, 517, S - T):
        position = torch.tensor([p], device="cuda")
        got = attention_triton.gated_attention(q, gate, key, value, position)
        ref = reference.gated_attention(q, gate, key, value, position, p + T)
        want = oracle(q.cpu(), gate.cpu(), key.cpu(), value.cpu(), p)
        err, err_ref = (got.double().cpu() - want).abs().max(), (ref.double().cpu() - want).abs().max()
        bound = 2 * err_ref + (2 ** -8 if dtype == torch.bfloat16 else 1e-5)
        assert err <= bound, (p, float(err), float(err_ref))


@pytest.mark.parametrize("positions", [S, LONG])
def test_repeatable_without_host_reads_and_replayable_at_every_length(positions):
    q, gate, key, value = _inputs(16, torch.bfloat16, positions=positions)
    position = torch.tensor([300], device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [attention_triton.gated_attention(q, gate, key, value, position) for _ in range(50)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(torch.equal(outs[0], out) for out in outs[1:])  # (torch.equal itself reads the host)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention_triton.gated_attention(q, gate, key, value, position)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_triton.gated_attention(q, gate, key, value, position)
    for p in (0, 17, 300, 1023, S - 16):
        position.fill_(p)
        graph.replay()
        assert torch.equal(out, attention_triton.gated_attention(q, gate, key, value, position)), p


@pytest.mark.parametrize("positions", [S, LONG])
def test_block_attention_on_the_gpu(positions):
    """The drafter's attention (16 queries, 32 heads on 4 KV heads of 128, bf16, every query over
    [0, p + 16)): no further from the float64 oracle than the reference, graph replays right at
    every context length."""
    g = torch.Generator(device="cuda").manual_seed(positions)
    q = torch.randn(1, 16, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
    key, value = (torch.randn(1, positions, 4, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    position = torch.tensor([0], device="cuda")
    graph = torch.cuda.CUDAGraph()
    attention_triton.block_attention(q, key, value, position)  # compiled before the capture
    with torch.cuda.graph(graph):
        out = attention_triton.block_attention(q, key, value, position)
    for p in (0, 517, S - 16):
        position.fill_(p)
        graph.replay()
        got = attention_triton.block_attention(q, key, value, position)
        assert torch.equal(out, got), p
        ref = reference.block_attention(q, key, value, position, p + 16)
        want = oracle(q.cpu(), None, key[:, :p + 16].cpu(), value[:, :p + 16].cpu(), p, causal=False)
        err, err_ref = (got.double().cpu() - want).abs().max(), (ref.double().cpu() - want).abs().max()
        assert err <= 2 * err_ref + 2 ** -8, (p, float(err), float(err_ref))


@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norm_rope_store_on_the_gpu(T, dtype):
    """The q/k norms, RoPE and cache writes in one launch at the 35B shapes (rotary 64 of 256):
    within the roundings' bound of the float64 definition (rounding to nearest), values bitwise."""
    case = (1, T, H, H_KV, D, 64, S, S - T - 3)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in _prepare_case(*case, dtype, seed=T)]
    q, k, v, q_weight, k_weight, eps, cos, sin, key, value, position = args
    got = attention_triton.norm_rope_store(*args)
    p = S - T - 3
    assert torch.equal(value[:, p : p + T], v) and value[:, :p].isnan().all() and value[:, p + T :].isnan().all()
    for out, x, w in ((got, q, q_weight), (key[:, p : p + T], k, k_weight)):
        x, w, c, s_ = x.cpu(), w.cpu(), cos[p : p + T].cpu(), sin[p : p + T].cpu()
        normed = _prepare_oracle(x, w, eps, torch.ones(T, 0), torch.zeros(T, 0))
        partner = torch.cat((normed[..., 32:64], normed[..., :32], normed[..., 64:] * 0), dim=-1)
        scale = (normed.abs() + partner.abs()) * (2**-8 if dtype == torch.bfloat16 else 2**-20)
        assert ((out.double().cpu() - _prepare_oracle(x, w, eps, c, s_)).abs() <= 3 * scale + 1e-6).all()


def test_norm_rope_store_replays_in_a_graph_at_every_position():
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in
            _prepare_case(1, 4, H, H_KV, D, 64, S, 0, torch.bfloat16, seed=5)]
    key, value, position = args[8], args[9], args[10]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attention_triton.norm_rope_store(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_triton.norm_rope_store(*args)
    for p in (0, 517, S - 4):
        key.fill_(float("nan"))
        position.fill_(p)
        graph.replay()
        fresh_key = torch.full_like(key, float("nan"))
        want = attention_triton.norm_rope_store(*args[:8], fresh_key, value, position)
        assert torch.equal(out, want) and torch.equal(key.nan_to_num(), fresh_key.nan_to_num()), p
        assert not key[:, p : p + 4].isnan().any() and key[:, :p].isnan().all(), p
