"""A grammar's bitmask on logits in one launch (`kernels/bitmask/triton.py`, under TRITON_INTERPRET
on CPU) equals the PyTorch reference bit for bit, and both refuse exactly the tokens whose bit is
clear (bit 31 of a word, the sign, included); vocabularies that end inside a word and inside a
block; bad arguments named."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.bitmask import reference
from hybridspec.kernels.bitmask.triton import BLOCK_V, masked_logits


@pytest.mark.parametrize("w, vocab", [(1, 37), (4, BLOCK_V), (16, 2 * BLOCK_V + 301)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_logits_equal_the_reference(w, vocab, dtype):
    g = torch.Generator().manual_seed(w + vocab)
    logits = (torch.randn(w, vocab, generator=g) * 4).to(dtype)
    allowed = torch.rand(w, vocab, generator=g) < 0.3
    allowed[:, 31::32] = True  # the sign bit of every word
    padded = torch.zeros(w, -(-vocab // 32) * 32, dtype=torch.bool)
    padded[:, :vocab] = allowed
    weights = torch.tensor([1 << j for j in range(31)] + [-(1 << 31)], dtype=torch.int64)
    bitmask = (padded.view(w, -1, 32).long() * weights).sum(-1).to(torch.int32)  # [w, ⌈V/32⌉]
    got = masked_logits(logits, bitmask)
    want = reference.masked_logits(logits, bitmask)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(got.isinf(), ~allowed) and torch.equal(got[allowed], logits.float()[allowed])


def test_bad_arguments_are_named():
    logits = torch.randn(2, 40)
    with pytest.raises(ValueError, match=r"bitmask must be contiguous int32 \(2, 2\)"):
        masked_logits(logits, torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="unit column stride"):
        masked_logits(logits.t(), torch.zeros(40, 1, dtype=torch.int32))
