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


@pytest.mark.parametrize("tokens", [1, 3, 16])
@pytest.mark.parametrize("experts,top_k,hidden", [(256, 8, 2048), (512, 10, 200), (60, 4, 96), (16, 1, 64)])
def test_one_launch_router_matches_the_reference(tokens, experts, top_k, hidden):
    """Logits within one rounding of F.linear's (the hidden spans sum in another order); from those
    very logits a top-k of the reference's softmax (every chosen probability ≥ every other, by
    decreasing probability, equal ones by lower id: bf16 logits tie often, and torch.topk orders
    ties as it likes) with the reference's renormalized weights; fp32 and bf16."""
    g = torch.Generator().manual_seed(tokens * experts + hidden)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(tokens, hidden, generator=g).to(dtype)
        weight = (torch.randn(experts, hidden, generator=g) / hidden ** 0.5).to(dtype)
        logits = torch.empty(tokens, experts, dtype=dtype)
        ids, weights = moe_router.router(x, weight, top_k, True, dtype, logits=logits)
        want = torch.nn.functional.linear(x.float(), weight.float())
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
        torch.testing.assert_close(logits.float(), want, **tol)
        probs = torch.softmax(logits.float(), -1)
        for n in range(tokens):
            chosen = probs[n, ids[n]]
            others = probs[n][torch.ones(experts, dtype=torch.bool).index_fill_(0, ids[n], False)]
            assert len(set(ids[n].tolist())) == top_k and (others.numel() == 0 or chosen.min() >= others.max())
            order = sorted(range(top_k), key=lambda j: (-float(chosen[j]), int(ids[n, j])))
            assert order == list(range(top_k))
        torch.testing.assert_close(weights.float(), (probs.gather(1, ids) / probs.gather(1, ids).sum(-1, keepdim=True)),
                                   rtol=1e-5 if dtype == torch.float32 else 8e-3,
                                   atol=1e-7 if dtype == torch.float32 else 1e-3)


TILES = [moe_router.ROUTER_TILES, moe_router.RouterTiles(SPLIT=8, warps=1, tail_rows="call"),
         moe_router.ROUTER_TILES.replace(packed_rows=16), moe_router.ROUTER_TILES.replace(packed_rows=0)]


@pytest.mark.parametrize("tokens", [1, 2, 16])
@pytest.mark.parametrize("experts,top_k", [(256, 8), (60, 4), (16, 16)])
def test_packed_and_two_step_argmax_choose_the_same_experts_and_weights(tokens, experts, top_k):
    """The packed (probability, expert) keys give bit for bit the ids and weights of the two
    reductions per round, on bf16 logits with exact ties (twin experts) and with every expert chosen."""
    g = torch.Generator().manual_seed(experts + top_k)
    x = torch.randint(-2, 3, (tokens, 64), generator=g).to(torch.bfloat16)
    weight = torch.randint(-1, 2, (experts // 2, 64), generator=g).repeat_interleave(2, 0).to(torch.bfloat16)
    base = moe_router.ROUTER_TILES  # experts 2i and 2i + 1 are twins: the top expert's twin ties with it
    packed = moe_router.router(x, weight, top_k, True, torch.float32, tiles=base.replace(packed_rows=16))
    two_step = moe_router.router(x, weight, top_k, True, torch.float32, tiles=base.replace(packed_rows=0))
    assert torch.equal(packed[0], two_step[0]) and torch.equal(packed[1], two_step[1])
    chosen = torch.nn.functional.linear(x.float(), weight.float()).gather(1, packed[0])  # [tokens, k] logits
    assert bool((chosen[:, 1:] == chosen[:, :-1]).any()), "no tie among the chosen: the test lost its point"
    if experts == top_k:
        assert torch.equal(packed[0].sort(1).values, torch.arange(experts).expand(tokens, -1))


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"be{t.BE}-s{t.SPLIT}-w{t.warps}-{t.tail_rows}-p{t.packed_rows}")
def test_one_launch_router_is_batch_invariant_and_leaves_its_counter_at_zero(tiles):
    """In the tile form a token routes the same alone or among 15 others, and every call leaves the
    arrival counter at zero for the next one; at every launch shape
    the sweep offers, with the top-k tile of a fixed 16 rows or of the call's rows, and the same
    experts and weights as the shipped shape."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=g).to(torch.bfloat16)
    weight = (torch.randn(128, 256, generator=g) / 16).to(torch.bfloat16)
    together = moe_router.router(x, weight, 8, True, torch.bfloat16, tiles=tiles)
    for n in (0, 7, 15):
        alone = moe_router.router(x[n : n + 1], weight, 8, True, torch.bfloat16, tiles=tiles)
        assert torch.equal(alone[0], together[0][n : n + 1]) and torch.equal(alone[1], together[1][n : n + 1])
    assert int(moe_router._counter(x.device)) == 0
    shipped = moe_router.router(x[:3], weight, 8, True, torch.float32)
    other = moe_router.router(x[:3], weight, 8, True, torch.float32, tiles=tiles)
    assert torch.equal(shipped[0], other[0])
    torch.testing.assert_close(shipped[1], other[1], rtol=1e-5, atol=1e-6)


def test_prefill_sized_calls_take_the_two_step_path():
    g = torch.Generator().manual_seed(4)
    x, weight = torch.randn(40, 64, generator=g), torch.randn(32, 64, generator=g)
    ids, weights = moe_router.router(x, weight, 4, False, torch.float32)
    ids_ref, weights_ref = reference.router(x, weight, 4, False, torch.float32)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("block_e, warps", [(1, 4), (4, 2), (64, 1)])
@pytest.mark.parametrize("experts, top_k", [(256, 8), (48, 10), (7, 7)])
def test_register_slice_router_matches_the_reference_and_is_batch_invariant(block_e, warps, experts, top_k):
    """The register-slice form (calls of one or two tokens): the reference's experts and weights,
    logits within rounding; a token alone routes bit for bit as beside another; the counter left
    at zero; on fp32 logits with no near-ties, the same experts as the tile form."""
    tiles = moe_router.RouterTiles(rows_tokens=2, rows_be=block_e, rows_warps=warps, packed_rows=2)
    g = torch.Generator().manual_seed(experts + top_k)
    x = torch.randn(2, 96, generator=g)
    weight = torch.randn(experts, 96, generator=g) / 10
    logits = torch.empty(2, experts)
    ids, weights = moe_router.router(x, weight, top_k, True, torch.float32, logits=logits, tiles=tiles)
    ids_ref, weights_ref = reference.router(x, weight, top_k, True, torch.float32)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logits, x @ weight.T, rtol=1e-5, atol=1e-6)
    assert int(moe_router._counter(x.device)) == 0
    xb = x.to(torch.bfloat16)
    together = moe_router.router(xb, weight.to(torch.bfloat16), top_k, True, torch.bfloat16, tiles=tiles)
    for n in (0, 1):
        alone = moe_router.router(xb[n : n + 1], weight.to(torch.bfloat16), top_k, True, torch.bfloat16, tiles=tiles)
        assert torch.equal(alone[0], together[0][n : n + 1]) and torch.equal(alone[1], together[1][n : n + 1])
    tile_ids = moe_router.router(x, weight, top_k, True, torch.float32, tiles=tiles.replace(rows_tokens=0))[0]
    assert torch.equal(tile_ids, ids)


@pytest.mark.parametrize("tokens, residual", [(1, True), (2, True), (1, False), (3, True)])
@pytest.mark.parametrize("experts, top_k, hidden", [(256, 8, 96), (40, 10, 100)])
def test_norm_router_routes_from_the_norm_of_the_residual_sum(tokens, residual, experts, top_k, hidden):
    """fp32: the reference's experts, weights, h and s for the calls the register-slice form takes
    (here up to two tokens: its programs normalise the rows, program 0 stores h and s); None for
    larger ones, which the caller routes by the norm's op and the router."""
    tiles = moe_router.RouterTiles(rows_tokens=2, rows_be=4, rows_warps=2, packed_rows=2)
    g = torch.Generator().manual_seed(tokens * 10 + experts + hidden)
    x = torch.randn(tokens, hidden, generator=g)
    res = torch.randn(tokens, hidden, generator=g) if residual else None
    nw = 0.1 * torch.randn(hidden, generator=g)
    weight = torch.randn(experts, hidden, generator=g) / 10
    fused = moe_router.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.float32, tiles=tiles)
    assert (fused is None) == (tokens > 2)
    if fused is None:
        return
    ids, weights, h, s = fused
    ids_ref, weights_ref, h_ref, s_ref = reference.norm_router(x, nw, 1e-6, res, weight, top_k, True, torch.float32)
    assert torch.equal(ids, ids_ref) and torch.equal(s, s_ref)
    torch.testing.assert_close(weights, weights_ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
    assert int(moe_router._counter(x.device)) == 0


def test_a_norm_the_register_slice_form_does_not_take_is_refused():
    x, weight = torch.randn(3, 64), torch.randn(16, 64)
    with pytest.raises(ValueError, match="norm_router"):
        moe_router.router(x, weight, 2, True, torch.float32, norm=(torch.zeros(64), 1e-6, None, x, x))


@pytest.mark.parametrize("fields, message", (({"tail_rows": "calls"}, "tail_rows must be"), ({"BE": 24}, "BE must be"),
                                             ({"warps": 0}, "warps must be"), ({"packed_rows": -1}, "must be ≥ 0")))
def test_router_tiles_refuse_a_launch_shape_the_kernel_cannot_take(fields, message):
    with pytest.raises(ValueError, match=message):
        moe_router.ROUTER_TILES.replace(**fields)
