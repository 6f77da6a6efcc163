"""The passes on a real (tiny) target: invariants of a capture with a drafter that knows the greedy
continuation (so every acceptance count occurs), the routing cross-check, the timing passes."""

from __future__ import annotations

import pytest
import torch

from hybridspec.collectors.capture import CapturePass
from hybridspec.collectors.common import CaptureConfig, PassContext, PromptIds, block_order, \
    generate_fully_verified, known_acceptance, new_experts_per_token
from hybridspec.collectors.fixed import FixedPass
from hybridspec.collectors.moe import MoePass, distinct_sweep, routing_with_distinct
from hybridspec.collectors.routing import RoutingPass
from hybridspec.collectors.stage0 import Stage0Pass
from hybridspec.runtime.engine import Engine
from hybridspec.runtime.loading import load_target
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import Session
from hybridspec.workbench.store import Store
from tests.runtime.helpers import ScriptedDrafter

NEW_TOKENS, D = 40, 15


@pytest.fixture(scope="module")
def target(qwen35_dir):
    return load_target(qwen35_dir, feature_layers=ScriptedDrafter.feature_layers)


@pytest.fixture(scope="module")
def prompts(target) -> list[tuple[PromptIds, list[int]]]:
    """(prompt, prompt + its ar continuation) for a few random prompts."""
    gen = torch.Generator().manual_seed(3)
    engine, ar = Engine(target, max_context=256), make_policy("ar", D)
    out = []
    for i in range(4):
        ids = torch.randint(0, target.cfg.vocab_size, (5 + 4 * i,), generator=gen).tolist()
        continuation = engine.generate(ids, policy=ar, max_new_tokens=NEW_TOKENS + 2 * (D + 1)).token_ids
        out.append((PromptIds(f"p{i}", "cat" + str(i % 2), "calib", tuple(ids)), ids + continuation))
    return out


def _context(target, prompt: PromptIds, sequence: list[int], seed: int, **config) -> PassContext:
    drafter = ScriptedDrafter(sequence, target.cfg.vocab_size, draft_len=D, seed=seed)
    session = Session("tiny", target, drafter, Engine(target, drafter, max_context=256), None, (), model_id="m",
                      drafter_id="d")
    ctx = PassContext(CaptureConfig(max_new_tokens=NEW_TOKENS, **config), session, [prompt], "digest")
    ctx.run_id = "r"
    return ctx


def _collect(collector, ctx, item):
    with torch.no_grad():
        collector.prepare(ctx)
        return collector.collect(ctx, item)


@pytest.fixture(scope="module")
def captured(target, prompts, tmp_path_factory):
    """A store with the capture and routing rows of every prompt (fresh scripted drafter per pass)."""
    store = Store(tmp_path_factory.mktemp("cap") / "s.duckdb")
    for seed, (prompt, sequence) in enumerate(prompts):
        rows = _collect(CapturePass(), _context(target, prompt, sequence, seed), prompt)
        store.commit_unit("r", f"prompt:{prompt.id}", rows)
        routing = _collect(RoutingPass(), _context(target, prompt, sequence, seed), prompt)
        store.commit_unit("routing", f"prompt:{prompt.id}",
                          {"routing_positions": [{**r, "run_id": "routing"} for r in routing["routing_positions"]]})
    yield store
    store.close()


def test_capture_invariants(captured, target):
    rounds = captured.frame("SELECT * FROM rounds ORDER BY prompt_id, round_idx")
    positions = captured.frame("SELECT * FROM draft_positions ORDER BY prompt_id, round_idx, position")
    # every round verified all D draft tokens: A_D known, 0 ≤ A_D ≤ D, and many counts occur
    assert rounds["w"].to_list() == [D + 1] * len(rounds)
    assert rounds["accepted_full"].null_count() == 0
    assert rounds["accepted_full"].min() >= 0 and rounds["accepted_full"].max() <= D
    assert rounds["accepted_full"].n_unique() >= 5
    assert (rounds["accepted_full"] == rounds["accepted"]).all()
    # the output limit: the emitted tokens add up to N − 1 after the prefill's anchor
    assert captured.query("SELECT DISTINCT sum(emitted) FROM rounds GROUP BY prompt_id") == [(NEW_TOKENS - 1,)]
    # one row per (run, prompt, round, position), positions 1…D
    assert len(positions) == len(rounds) * D
    assert captured.query("SELECT count(DISTINCT (run_id, prompt_id, round_idx, position)) FROM draft_positions") \
        == [(len(positions),)]
    # new Layer-0 experts: 0…top-k at every position
    k = target.cfg.num_experts_per_tok
    assert positions["new_l0_experts"].null_count() == 0
    assert positions["new_l0_experts"].min() >= 0 and positions["new_l0_experts"].max() <= k
    # `accepted` = A_D ≥ i: monotone non-increasing in i within a round, True exactly A_D times
    by_round = captured.query("SELECT prompt_id, round_idx, r.accepted_full, list(p.accepted ORDER BY p.position) "
                              "FROM rounds r JOIN draft_positions p USING (run_id, prompt_id, round_idx) GROUP BY ALL")
    assert len(by_round) == len(rounds)
    for _, _, a_d, flags in by_round:
        assert flags == [True] * a_d + [False] * (D - a_d)


def test_routing_agrees_with_capture_on_layer0(captured, target):
    """Both passes see the same greedy rounds: the Layer-0 counts must coincide position by position."""
    joined = captured.query(
        "SELECT p.new_l0_experts, r.new_l0_experts, r.new_later_pairs FROM draft_positions p JOIN routing_positions r "
        "USING (prompt_id, round_idx, position)")
    assert len(joined) == captured.query("SELECT count(*) FROM draft_positions")[0][0]
    assert all(a == b for a, b, _ in joined)
    n_later = sum(layer.is_moe for layer in target.layers[1:])
    assert all(0 <= later <= n_later * target.cfg.num_experts_per_tok for _, _, later in joined)


def test_new_experts_and_known_acceptance_by_hand():
    ids = torch.tensor([[0, 1], [1, 2], [0, 1], [3, 4], [4, 0]])
    assert new_experts_per_token(ids) == [2, 1, 0, 2, 0]
    # A = 2 of w − 1 = 5 verified: positions 1, 2 accepted, 3… rejected
    assert [known_acceptance(i, 2, 6) for i in range(1, 8)] == [True, True, False, False, False, False, False]
    # all 3 verified accepted: beyond them unknown
    assert [known_acceptance(i, 3, 4) for i in range(1, 6)] == [True, True, True, None, None]


def test_fully_verified_rounds_near_the_output_limit(target, prompts):
    prompt, sequence = prompts[0]
    ctx = _context(target, prompt, sequence, 0)
    rounds = generate_fully_verified(ctx, prompt, make_policy("full", D))
    assert all(r.w == D + 1 for r in rounds)
    assert sum(r.emitted for r in rounds) == NEW_TOKENS - 1
    assert rounds[-1].truncated or sum(r.emitted for r in rounds[:-1]) + rounds[-1].emitted == NEW_TOKENS - 1


def test_fixed_pass_measures_every_length_per_block_in_a_seeded_random_order(target, prompts):
    prompt, sequence = prompts[1]
    ctx = _context(target, prompt, sequence, 1, quick=True)
    collector = FixedPass()
    assert [u.key for u in collector.units(ctx)] == ["block=0:prompt:p1"]
    rows = _collect(collector, ctx, (0, prompt))["fixed_length_timings"]
    lengths = [1, *collector.params(ctx)["lengths"]]
    order = sorted({(r["block_order"], r["w"]) for r in rows})
    assert [w for _, w in order] == block_order(lengths, 0, 0) != sorted(lengths)  # every w once, shuffled
    assert block_order(lengths, 0, 1) != block_order(lengths, 0, 0)  # another block, another order
    for w in lengths:
        mine = [r for r in rows if r["w"] == w]
        assert all(r["executed_w"] <= w and r["latency_us"] > 0 and r["block"] == 0 for r in mine)
        assert sum(r["emitted"] for r in mine) == NEW_TOKENS - 1
    # w = 1: plain ar steps, one token each, no draft
    steps = [r for r in rows if r["w"] == 1]
    assert {(r["executed_w"], r["accepted"], r["emitted"]) for r in steps} == {(1, 0, 1)}
    assert len(steps) == NEW_TOKENS - 1


def test_stage0_pass_times_every_length_per_block_without_touching_the_context(target, prompts):
    prompt, sequence = prompts[2]
    ctx = _context(target, prompt, sequence, 2, quick=True)
    collector = Stage0Pass()
    params = collector.params(ctx)
    assert [u.item for u in collector.units(ctx)] == list(range(params["blocks"]))
    collector.prepare(ctx)
    length = collector.cache.length
    rows = collector.collect(ctx, 1)["stage0_timings"]
    assert collector.cache.length == length == len(prompt.ids)
    assert sorted({r["u"] for r in rows}) == list(range(1, D + 2)) and {r["block"] for r in rows} == {1}
    per_block = params["per_block"]
    for u in range(1, D + 2):
        assert sorted(r["sample_idx"] for r in rows if r["u"] == u) == list(range(per_block, 2 * per_block))
    assert [r["u"] for r in rows][::per_block] == block_order(list(range(1, D + 2)), 0, 1)
    assert all(r["latency_us"] > 0 for r in rows)


@pytest.mark.parametrize("experts,top_k", [(8, 2), (32, 2), (256, 8), (512, 10)])
def test_constructed_routing_has_exactly_n_distinct_experts(experts, top_k):
    for n in distinct_sweep(top_k, experts, quick=False):
        ids = routing_with_distinct(16, top_k, n, experts, seed=n)
        assert ids.shape == (16, top_k) and ids.unique().numel() == n
        assert all(row.unique().numel() == top_k for row in ids)  # a token never picks an expert twice
    quick = distinct_sweep(top_k, experts, quick=True)
    assert quick[0] == top_k and quick[-1] == min(16 * top_k, experts)


def test_moe_pass_rows(target, prompts):
    prompt, sequence = prompts[3]
    ctx = _context(target, prompt, sequence, 3, quick=True)
    collector = MoePass()
    counts = collector.params(ctx)["distinct"]
    assert counts[0] == target.cfg.num_experts_per_tok and counts[-1] == target.cfg.num_experts
    rows = _collect(collector, ctx, 0)["moe_bench"]
    assert sorted({r["n_distinct_experts"] for r in rows}) == counts and {r["block"] for r in rows} == {0}
    assert all(r["n_assignments"] == 16 * target.cfg.num_experts_per_tok and r["layer"] == 0 for r in rows)
