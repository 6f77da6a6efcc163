"""The log-probability rows in one launch (`kernels/logprobs/triton.py`, under TRITON_INTERPRET on
CPU) against the PyTorch reference: the chosen token's log-probability and the top values within
fp32 rounding, every top id holding its value, ties to the lower id (bf16 logits tie often),
vocabularies of one and several blocks, no alternatives at all, a block of −∞, `out` written in
place, bad arguments named."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.logprobs import reference
from hybridspec.kernels.logprobs.triton import BLOCK_V, logprob_rows


def check_rows(logits: torch.Tensor, tokens: torch.Tensor, top: int, got: torch.Tensor, atol: float = 1e-5) -> None:
    """got equals the log-probability rows of `logits` in float64 within atol (a sum of a large
    vocabulary's exponentials in fp32 rounds by about 1e-5 of the log-sum), and its ids are a valid top."""
    assert got.shape == (logits.shape[0], 1 + 2 * top) and got.dtype == torch.float32
    logp = torch.log_softmax(logits.double(), -1)
    want = torch.cat((logp.gather(1, tokens.view(-1, 1)), logp.topk(top, -1).values), 1)
    torch.testing.assert_close(got[:, : 1 + top].double(), want, rtol=0, atol=atol)
    ids = got[:, 1 + top :].long()
    for row in range(logits.shape[0]):
        chosen = ids[row].tolist()
        assert len(set(chosen)) == top  # distinct tokens
        torch.testing.assert_close(logp[row, ids[row]], got[row, 1 : 1 + top].double(), rtol=0, atol=atol)
        for j in range(top - 1):  # by decreasing value, equal values by increasing id
            key = (-got[row, 1 + j].item(), chosen[j]), (-got[row, 2 + j].item(), chosen[j + 1])
            assert key[0] < key[1], f"row {row}: {key}"
        if top:  # nothing left out is larger than the last kept, or equal with a lower id
            last, rest = logp[row, chosen[-1]], torch.ones(logits.shape[1], dtype=torch.bool)
            rest[ids[row]] = False
            assert bool((logp[row][rest] <= last).all())
            assert not bool(((logp[row] == last) & rest)[: chosen[-1]].any())


@pytest.mark.parametrize("rows, vocab", [(1, 37), (3, BLOCK_V), (16, 2 * BLOCK_V + 301)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_logprob_rows_match_the_reference(rows, vocab, dtype, top):
    g = torch.Generator().manual_seed(rows + vocab + top)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    check_rows(logits, tokens, top, logprob_rows(logits, tokens, top))


def test_ties_across_blocks_go_to_the_lower_id_and_a_block_of_minus_infinity_counts_nothing():
    V = 3 * BLOCK_V + 11
    logits = torch.zeros(2, V)
    logits[0, [2 * BLOCK_V + 1, BLOCK_V + 3, 7]] = 5.0
    logits[1, BLOCK_V : 2 * BLOCK_V] = float("-inf")  # a whole block masked
    logits[1, [3 * BLOCK_V + 2, 9]] = 2.0
    tokens = torch.tensor([BLOCK_V + 3, BLOCK_V + 5])
    got = logprob_rows(logits, tokens, 6)
    assert got[0, 7:].long().tolist() == [7, BLOCK_V + 3, 2 * BLOCK_V + 1, 0, 1, 2]
    assert got[1, 7:].long().tolist() == [9, 3 * BLOCK_V + 2, 0, 1, 2, 3]
    assert got[1, 0] == float("-inf")  # the chosen token was masked
    check_rows(logits[:1], tokens[:1], 6, got[:1])
    torch.testing.assert_close(got[1, 1:7], reference.logprob_rows(logits, tokens, 6)[1, 1:7])


def test_rows_with_fewer_finite_logits_than_top_take_each_token_once():
    """The rest of the top are −∞ tokens by id, each once (a block's and the row's selection take
    every token at most once)."""
    V = BLOCK_V + 50
    logits = torch.full((2, V), float("-inf"))
    logits[0, [30, 7]] = torch.tensor([1.0, 2.0])
    logits[1, BLOCK_V + 3] = 0.5  # in the second block
    got = logprob_rows(logits, torch.tensor([7, BLOCK_V + 3]), 5)
    assert got[0, 6:].long().tolist() == [7, 30, 0, 1, 2]
    assert got[1, 6:].long().tolist() == [BLOCK_V + 3, 0, 1, 2, 3]
    check_rows(logits, torch.tensor([7, BLOCK_V + 3]), 5, got)


def test_rows_are_written_into_out():
    logits = torch.randn(4, 300)
    tokens = torch.tensor([0, 5, 299, 7])
    out = torch.full((4, 1 + 2 * 3), 7.0)
    assert logprob_rows(logits, tokens, 3, out) is out
    torch.testing.assert_close(out, reference.logprob_rows(logits, tokens, 3))


def test_bad_arguments_are_named():
    logits, tokens = torch.randn(2, 40), torch.tensor([1, 2])
    with pytest.raises(ValueError, match="top must be in 0..40"):
        logprob_rows(logits, tokens, 41)
    with pytest.raises(ValueError, match="tokens must be 2 contiguous long"):
        logprob_rows(logits, tokens.int(), 3)
    with pytest.raises(ValueError, match="unit column stride"):
        logprob_rows(logits.t(), tokens, 3)
    with pytest.raises(ValueError, match="out must be contiguous fp32"):
        logprob_rows(logits, tokens, 3, torch.empty(2, 5))
