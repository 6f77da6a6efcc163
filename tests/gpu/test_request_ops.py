"""The logprob, penalty and bitmask kernels compiled on the GPU at the 35B preset's vocabulary
(248,320, bf16 logits), one row and sixteen: the references' values (logprobs: every top id holding
its value, ties to the lower id; penalties: the same −∞ entries; masks: bit for bit), no host read,
and the same from a CUDA graph replay on new logits."""

import math

import pytest
import torch

from hybridspec.kernels.logprobs import triton as logprobs_triton
from hybridspec.kernels.penalties import reference as penalties_reference
from hybridspec.kernels.penalties import triton as penalties_triton
from tests.kernels.test_logprobs_triton import check_rows

pytestmark = pytest.mark.gpu

V = 248_320


def _logits(w: int, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(w, V, generator=gen) * 4).to(torch.bfloat16).cuda()


def _replayed(fn, logits: torch.Tensor, gen: torch.Generator):
    """fn() once, then captured with no host read allowed and replayed on new logits: (captured out, logits)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    logits.copy_(_logits(logits.shape[0], gen))
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("w", [1, 16])
def test_logprob_rows_on_the_gpu_and_in_a_graph(w):
    gen = torch.Generator().manual_seed(w)
    logits = _logits(w, gen)
    tokens = torch.randint(0, V, (w,), generator=gen).cuda()
    check_rows(logits.cpu(), tokens.cpu(), 20, logprobs_triton.logprob_rows(logits, tokens, 20).cpu(), atol=1e-4)
    out = _replayed(lambda: logprobs_triton.logprob_rows(logits, tokens, 20), logits, gen)
    check_rows(logits.cpu(), tokens.cpu(), 20, out.cpu(), atol=1e-4)


@pytest.mark.parametrize("w", [1, 16])
@pytest.mark.parametrize("min_tokens, margin", [(0.0, float("-inf")), (12.0, math.log(0.05))])
def test_penalized_logits_on_the_gpu_and_in_a_graph(w, min_tokens, margin):
    gen = torch.Generator().manual_seed(w + int(min_tokens))
    logits = _logits(w, gen)
    drafts = torch.randint(0, V, (15,), generator=gen).cuda()
    counts = torch.zeros(V)
    counts.scatter_add_(0, torch.randint(0, V, (200,), generator=gen), torch.ones(200))
    seen = torch.rand(V, generator=gen) < 0.001
    bias = torch.where(torch.rand(V, generator=gen) < 0.001, torch.randn(V, generator=gen), torch.zeros(V))
    end = torch.zeros(V, dtype=torch.bool)
    end[[0, 7, V - 1]] = True
    scalars = torch.tensor([0.5, 0.5, 1.2, 4.0, min_tokens, margin])
    state = tuple(t.cuda() for t in (counts, seen, bias, end, scalars))

    def check(got):
        want = penalties_reference.penalized_logits(logits, drafts, *state)
        assert torch.equal(got.isinf(), want.isinf())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)

    check(penalties_triton.penalized_logits(logits, drafts, *state))
    check(_replayed(lambda: penalties_triton.penalized_logits(logits, drafts, *state), logits, gen))


def test_masked_logits_on_the_gpu_and_in_a_graph():
    """A grammar's bitmask on 16 rows: the reference's result bit for bit, eagerly and replayed."""
    from hybridspec.kernels.bitmask import reference as bitmask_reference
    from hybridspec.kernels.bitmask import triton as bitmask_triton

    gen = torch.Generator().manual_seed(5)
    logits = _logits(16, gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (16, V // 32), generator=gen, dtype=torch.int32).cuda()
    assert torch.equal(bitmask_triton.masked_logits(logits, bitmask), bitmask_reference.masked_logits(logits, bitmask))
    out = _replayed(lambda: bitmask_triton.masked_logits(logits, bitmask), logits, gen)
    assert torch.equal(out, bitmask_reference.masked_logits(logits, bitmask))
