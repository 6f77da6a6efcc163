"""Two-stage verification: Stage 0 on u tokens + Stage 1 on w ≤ u equals the unsplit pass on w,
and Stage 1 never reads a retained value of a token beyond w."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime.loading import load_target
from tests.tolerance import assert_close


def _prefilled(model, ids, prefix):
    cache = model.new_cache(max_len=64, tokens_per_pass=16)
    model.prefill(torch.tensor([ids[:prefix]]), cache)
    return cache


def _poison_beyond(s0, cache, w):
    """Overwrite everything Stage 0 retained for tokens ≥ w (and layer 0's round buffers) with NaN."""
    for t in (s0.residual, s0.moe_input, s0.expert_weights, cache.z[0], cache.g_cum[0], cache.k[0], cache.conv_in[0]):
        t[:, w:] = float("nan")
    s0.expert_ids[:, w:] = 0


@pytest.mark.parametrize("fixture", ["qwen35_dir", "qwen3next_dir"])
@pytest.mark.parametrize("u,w", [(1, 1), (5, 4), (9, 9), (16, 7), (16, 15)])
def test_stage0_then_stage1_equals_unsplit(fixture, u, w, request):
    model = load_target(request.getfixturevalue(fixture), feature_layers=(0, 3, 5))
    ids = torch.randint(0, model.cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(u * 31 + w)).tolist()
    prefix = 11

    unsplit_cache = _prefilled(model, ids, prefix)
    want = model.forward_pass(torch.tensor([ids[prefix : prefix + w]]), unsplit_cache, record_routing=True)

    split_cache = _prefilled(model, ids, prefix)
    s0 = model.stage0(torch.tensor([ids[prefix : prefix + u]]), split_cache)
    assert s0.tokens == u and s0.expert_ids.shape == (1, u, model.cfg.num_experts_per_tok)
    _poison_beyond(s0, split_cache, w)
    got = model.stage1(s0, w, split_cache, record_routing=True)

    assert torch.isfinite(got.logits).all()
    # equal up to fp32 rounding: a u-row solve and a w-row solve (and GEMMs of u and of w rows) round
    # differently; a read of a poisoned value beyond w would be NaN
    assert_close("stage1 logits", want.logits, got.logits, 4e-5)
    assert_close("stage1 features", want.features, got.features, 4e-5)
    assert [t.tolist() for t in got.expert_ids] == [t.tolist() for t in want.expert_ids]

    # the commit after a split pass reads only the first m ≤ w tokens too
    m = max(1, w - 2)
    model.commit(unsplit_cache, w, m)
    model.commit(split_cache, w, m)
    model.flush(unsplit_cache)
    model.flush(split_cache)
    assert_close("committed GDN states", unsplit_cache.ssm, split_cache.ssm, 2e-5)
    assert_close("committed conv windows", unsplit_cache.conv, split_cache.conv, 2e-5)
    assert unsplit_cache.length == split_cache.length == prefix + m


def test_stage1_rejects_a_length_beyond_stage0(qwen35_dir):
    model = load_target(qwen35_dir)
    cache = model.new_cache(max_len=32, tokens_per_pass=16)
    s0 = model.stage0(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="must be in 1..3"):
        model.stage1(s0, 4, cache)


@pytest.mark.parametrize("verified", ["none", "stage0", "all"])
def test_deferred_commit_reaches_the_committed_state(qwen35_dir, verified):
    """A commit leaves each GDN state to its layer's next verification: after a flush, after Stage 0
    (layer 0 folded, the rest flushed one by one) or after a whole pass (every layer folded, nothing
    left to flush), the states equal those of a commit flushed at once."""
    model = load_target(qwen35_dir)
    ids = torch.randint(0, model.cfg.vocab_size, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    w, m = 6, 4
    caches = []
    for _ in range(2):
        cache = _prefilled(model, ids, 11)
        model.forward_pass(torch.tensor([ids[11 : 11 + w]]), cache)
        model.commit(cache, w, m)
        caches.append(cache)
    eager, deferred = caches
    assert all(eager.pending)
    model.flush(eager)
    assert not any(eager.pending)

    nxt = torch.tensor([ids[11 + m : 11 + m + 3]])
    if verified == "stage0":
        model.stage0(nxt, deferred)
        assert deferred.pending == [False] + [True] * (len(deferred.pending) - 1)
    elif verified == "all":
        model.forward_pass(nxt, deferred)
        assert not any(deferred.pending)
    model.flush(deferred)
    assert_close("GDN states", eager.ssm, deferred.ssm, 2e-6)
    deferred.reset()
    assert not any(deferred.pending) and deferred.length == 0
