"""The penalised logits in two launches (`kernels/penalties/triton.py`, under TRITON_INTERPRET on
CPU) against the PyTorch reference: every row after its own drafts, with repetition, frequency,
presence, bias, min_tokens (banning, past it, and the row where nothing else is left) and min_p;
vocabularies of one and several blocks, fp32 and bf16 logits; one row without drafts; bad arguments
named."""

from __future__ import annotations

import math

import pytest
import torch

from hybridspec.kernels.penalties import reference
from hybridspec.kernels.penalties.triton import BLOCK_V, penalized_logits


def _state(V: int, g: torch.Generator, *, emitted: float, min_tokens: float, margin: float):
    counts = torch.zeros(V)
    history = torch.randint(0, V, (int(emitted),), generator=g)
    counts.scatter_add_(0, history, torch.ones(history.shape[0]))
    seen = torch.zeros(V, dtype=torch.bool)
    seen[torch.randint(0, V, (20,), generator=g)] = True
    bias = torch.zeros(V)
    bias[torch.randint(0, V, (5,), generator=g)] = torch.randn(5, generator=g) * 3
    end = torch.zeros(V, dtype=torch.bool)
    end[[0, V - 1]] = True
    scalars = torch.tensor([0.8, 0.3, 1.3, emitted, min_tokens, margin])
    return counts, seen, bias, end, scalars


@pytest.mark.parametrize("w, vocab", [(1, 37), (4, BLOCK_V), (16, 2 * BLOCK_V + 301)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("min_tokens, margin", [(0.0, float("-inf")), (9.0, float("-inf")), (7.0, math.log(0.05))])
def test_penalized_logits_match_the_reference(w, vocab, dtype, min_tokens, margin):
    g = torch.Generator().manual_seed(w + vocab)
    logits = (torch.randn(w, vocab, generator=g) * 4).to(dtype)
    drafts = torch.randint(0, vocab, (15,), generator=g)
    drafts[2] = drafts[0]  # a token the rows count twice
    drafts[1] = vocab - 1  # an end token among the drafts
    state = _state(vocab, g, emitted=5.0, min_tokens=min_tokens, margin=margin)
    got = penalized_logits(logits, drafts, *state)
    want = reference.penalized_logits(logits, drafts, *state)
    assert got.dtype == torch.float32 and got.shape == (w, vocab)
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if min_tokens > 5:  # rows deciding output index 5, 6, … below min_tokens ban the end tokens
        banned = min(w, int(min_tokens) - 5)
        assert bool(got[:banned, [0, vocab - 1]].isinf().all())
        assert margin > float("-inf") or not bool(got[banned:, 0].isinf().any())  # min_p may drop it too


def test_a_row_with_only_end_tokens_left_keeps_them():
    V = BLOCK_V + 9
    logits = torch.full((2, V), float("-inf"))
    logits[:, [3, V - 2]] = 1.0  # the end tokens are the only finite ones (a grammar that must end)
    logits[1, 11] = 0.5
    end = torch.zeros(V, dtype=torch.bool)
    end[[3, V - 2]] = True
    state = (torch.zeros(V), torch.zeros(V, dtype=torch.bool), torch.zeros(V), end,
             torch.tensor([0.0, 0.0, 1.0, 0.0, 4.0, float("-inf")]))
    got = penalized_logits(logits, torch.tensor([5]), *state)
    assert got[0, [3, V - 2]].tolist() == [1.0, 1.0]  # nothing else left: min_tokens does not ban them
    assert got[1, [3, V - 2]].isinf().all() and got[1, 11] == 0.5  # token 11 is left: banned
    torch.testing.assert_close(got, reference.penalized_logits(logits, torch.tensor([5]), *state))


def test_bad_arguments_are_named():
    logits = torch.randn(3, 50)
    state = _state(50, torch.Generator().manual_seed(0), emitted=2.0, min_tokens=0.0, margin=float("-inf"))
    with pytest.raises(ValueError, match="drafts must be at least 2 long"):
        penalized_logits(logits, torch.tensor([1]), *state)
    with pytest.raises(ValueError, match="prompt_seen must be contiguous torch.bool"):
        penalized_logits(logits, torch.tensor([1, 2]), state[0], state[1].float(), *state[2:])
    with pytest.raises(ValueError, match=r"scalars must be contiguous torch.float32 \[6\]"):
        penalized_logits(logits, torch.tensor([1, 2]), *state[:4], state[4][:5])
