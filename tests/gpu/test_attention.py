"""The Triton gated attention compiled on the GPU at the 35B shapes (16 query heads, 2 KV heads,
head dim 256) over a 1,100-key cache: within bf16 (fp32) rounding of a float64 oracle, no worse
than the PyTorch reference; bitwise repeatable; no host read; one captured CUDA graph right at
every context length it is replayed at (the length read on the device)."""

import pytest
import torch

from hybridspec.kernels.attention import reference
from hybridspec.kernels.attention import triton as attention_triton
from tests.kernels.test_attention_triton import oracle

pytestmark = pytest.mark.gpu

S, H, H_KV, D = 1100, 16, 2, 256


def _inputs(T, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, gate = (torch.randn(1, T, H, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    key, value = (torch.randn(1, S, H_KV, D, generator=g, device="cuda").to(dtype) for _ in range(2))
    return q, gate, key, value


@pytest.mark.parametrize("T", [1, 2, 8, 16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_the_oracle_on_the_gpu(T, dtype):
    q, gate, key, value = _inputs(T, dtype, seed=T)
    for p in (0, 517, S - T):
        position = torch.tensor([p], device="cuda")
        got = attention_triton.gated_attention(q, gate, key, value, position)
        ref = reference.gated_attention(q, gate, key, value, position, p + T)
        want = oracle(q.cpu(), gate.cpu(), key.cpu(), value.cpu(), p)
        err, err_ref = (got.double().cpu() - want).abs().max(), (ref.double().cpu() - want).abs().max()
        bound = 2 * err_ref + (2 ** -8 if dtype == torch.bfloat16 else 1e-5)
        assert err <= bound, (p, float(err), float(err_ref))


def test_repeatable_without_host_reads_and_replayable_at_every_length():
    q, gate, key, value = _inputs(16, torch.bfloat16)
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
