"""The Triton router (softmax + top-k + renormalization in one launch) against its PyTorch
reference under TRITON_INTERPRET: the same experts in the same order, weights within fp32
rounding; ties go to the lower expert id; each token independent of the others in the call."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.moe import reference
from hybridspec.kernels.moe import router as moe_router


@pytest.mark.parametrize("experts,top_k", [(256, 8), (512, 10), (60, 4), (16, 1)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_router_matches_the_reference(experts, top_k, renormalize):
    g = torch.Generator().manual_seed(experts + top_k)
    logits = 3 * torch.randn(9, experts, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        ids, weights = moe_router.router_topk(logits, top_k, renormalize, dtype)
        ids_ref, weights_ref = reference.router_topk(logits, top_k, renormalize, dtype)
        assert ids.dtype == torch.long and weights.dtype == dtype
        assert torch.equal(ids, ids_ref)
        torch.testing.assert_close(weights.float(), weights_ref.float(), rtol=1e-5 if dtype == torch.float32 else 8e-3,
                                   atol=1e-7 if dtype == torch.float32 else 1e-3)


def test_ties_go_to_the_lower_id_and_tokens_are_independent():
    logits = torch.zeros(3, 32)
    logits[0, [5, 9, 20]] = 2.0  # a three-way tie for the top
    ids, weights = moe_router.router_topk(logits, 4, True, torch.float32)
    assert ids[0, :3].tolist() == [5, 9, 20] and ids[1].tolist() == [0, 1, 2, 3]
    assert torch.allclose(weights.sum(-1), torch.ones(3))
    alone = moe_router.router_topk(logits[2:], 4, True, torch.float32)
    assert torch.equal(alone[0], ids[2:]) and torch.equal(alone[1], weights[2:])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="top-20"):
        moe_router.router_topk(torch.zeros(2, 32), 20, True, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        moe_router.router_topk(torch.zeros(32, 2).t(), 2, True, torch.float32)
