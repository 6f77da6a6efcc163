"""The drafter's block statistics in one launch (`kernels/sampling/statistics.py`, under
TRITON_INTERPRET on CPU) against the PyTorch reference: the same tokens, confidence and entropy
within fp32 rounding, over vocabularies of one and several blocks, in fp32 and bf16; ties to the
lowest id across blocks; a peaked row (entropy near zero) and a flat one (entropy log V)."""

from __future__ import annotations

import math

import pytest
import torch

from hybridspec.kernels.sampling import BLOCK_V, reference
from hybridspec.kernels.sampling.statistics import draft_statistics


@pytest.mark.parametrize("rows, vocab", [(1, 37), (3, BLOCK_V), (15, 2 * BLOCK_V + 301)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_statistics_match_the_reference(rows, vocab, dtype):
    g = torch.Generator().manual_seed(rows + vocab)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    tokens, confidence, entropy = draft_statistics(logits)
    _, ref_confidence, ref_entropy = reference.draft_statistics(logits)
    assert tokens.dtype == torch.long and confidence.dtype == entropy.dtype == torch.float32
    ids = torch.arange(vocab)
    lowest = torch.where(logits == logits.max(-1, keepdim=True).values, ids, vocab).min(-1).values
    assert torch.equal(tokens, lowest)  # bf16 logits tie: the lowest id holding the row's maximum
    torch.testing.assert_close(confidence, ref_confidence, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_lowest_id_across_blocks():
    logits = torch.zeros(2, 2 * BLOCK_V + 5)
    logits[0, [BLOCK_V + 3, 2 * BLOCK_V + 1, 7]] = 5.0  # the lowest id sits in the first block
    logits[1, [2 * BLOCK_V + 4, BLOCK_V + 9]] = 5.0  # in the second
    tokens, confidence, _ = draft_statistics(logits)
    assert tokens.tolist() == [7, BLOCK_V + 9]
    denominator = logits.shape[1] - 3 + 3 * math.exp(5.0), logits.shape[1] - 2 + 2 * math.exp(5.0)
    torch.testing.assert_close(confidence, torch.tensor([math.exp(5.0) / d for d in denominator]), rtol=1e-5, atol=0)


def test_peaked_and_flat_rows():
    vocab = BLOCK_V + 100
    logits = torch.zeros(2, vocab)
    logits[0, BLOCK_V + 50] = 60.0  # nearly all the mass on one token: entropy ≈ 2.2e-21, nothing cancels
    tokens, confidence, entropy = draft_statistics(logits)
    p = torch.softmax(logits[0].double(), -1)
    exact = -(p * p.log()).sum().item()
    assert tokens[0] == BLOCK_V + 50 and abs(confidence[0].item() - 1.0) < 1e-6
    assert abs(entropy[0].item() - exact) <= 0.05 * exact  # log S of S = 1 + 4e-23 is lost to fp32, not T / S
    assert abs(confidence[1].item() - 1 / vocab) < 1e-9 and abs(entropy[1].item() - math.log(vocab)) < 1e-5


def test_bad_logits_are_named():
    with pytest.raises(ValueError, match=r"\[D, V\]"):
        draft_statistics(torch.zeros(4))
    with pytest.raises(ValueError, match="unit column stride"):
        draft_statistics(torch.zeros(8, 4).t())
