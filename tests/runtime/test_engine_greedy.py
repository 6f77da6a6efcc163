"""Greedy exactness (DESIGN A.6, Proposition 1): every policy emits exactly the `ar` tokens."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.loading import load_target, random_drafter
from hybridspec.runtime.policies import make_policy
from tests.runtime.helpers import ScriptedDrafter, policy_parameters

SPECULATIVE = ("full", "static:2", "static:7", "ratio", "ratio4", "nominal", "hybridspec")
N_PROMPTS, NEW_TOKENS = 20, 64
# `full` runs every prompt (it must see every acceptance count 0 … 15); the other length rules run the
# first 8 (every output limit below, each with and without a mid-generation EOS, twice)
OTHER_POLICIES_PROMPTS = 8


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, vocab, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(N_PROMPTS)]


@pytest.fixture(scope="module")
def target(qwen35_dir):
    return load_target(qwen35_dir, feature_layers=ScriptedDrafter.feature_layers)


@pytest.fixture(scope="module")
def reference(target):
    """ar outputs, and per prompt an EOS id that first appears mid-generation (or none)."""
    engine = Engine(target, max_context=256)
    ar = make_policy("ar", 15)
    outs = [engine.generate(p, policy=ar, max_new_tokens=NEW_TOKENS).token_ids for p in _prompts(target.cfg.vocab_size)]
    eos = []
    for out in outs:
        candidates = [t for i, t in enumerate(out) if 20 <= i < 50 and t not in out[:i]]
        eos.append((candidates[0],) if candidates else ())
    return outs, eos


def _expected(out: list[int], eos: tuple[int, ...]) -> list[int]:
    return out[: out.index(eos[0]) + 1] if eos and eos[0] in out else out


@pytest.mark.parametrize("policy_name", SPECULATIVE)
def test_scripted_drafter_emits_exactly_ar(target, reference, policy_name):
    outs, eos_ids = reference
    params = policy_parameters()
    counts, truncated_mid_round = set(), 0
    prompts = _prompts(target.cfg.vocab_size)
    for i, prompt in enumerate(prompts if policy_name == "full" else prompts[:OTHER_POLICIES_PROMPTS]):
        drafter = ScriptedDrafter(prompt + outs[i], target.cfg.vocab_size, seed=i)
        engine = Engine(target, drafter, max_context=256)
        policy = make_policy(policy_name, 15, params)
        for eos in ((), eos_ids[i]):
            limit = NEW_TOKENS - 3 * (i % 4)  # output limits that fall inside rounds
            result = engine.generate(prompt, policy=policy, max_new_tokens=limit, eos_ids=eos)
            want = _expected(outs[i][:limit], eos)
            assert result.token_ids == want, f"prompt {i}, eos {eos}: first difference at " \
                f"{next(j for j, (a, b) in enumerate(zip(result.token_ids + [-1], want + [-2])) if a != b)}"
            counts.update(r.accepted for r in result.rounds)
            truncated_mid_round += sum(r.truncated for r in result.rounds)
    assert truncated_mid_round > 0
    if policy_name == "full":
        assert counts == set(range(16)), f"acceptance counts seen: {sorted(counts)}"


@pytest.mark.parametrize("policy_name", SPECULATIVE)
def test_dflash_drafter_emits_exactly_ar(target, reference, policy_name):
    outs, _ = reference
    engine = Engine(target, random_drafter(target, seed=3), max_context=256)
    policy = make_policy(policy_name, 15, policy_parameters())
    for i, prompt in enumerate(_prompts(target.cfg.vocab_size)[:3]):
        assert engine.generate(prompt, policy=policy, max_new_tokens=NEW_TOKENS).token_ids == outs[i]


def test_hybridspec_round_records(target, reference):
    outs, _ = reference
    prompt = _prompts(target.cfg.vocab_size)[0]
    engine = Engine(target, ScriptedDrafter(prompt + outs[0], target.cfg.vocab_size), max_context=256)
    result = engine.generate(prompt, policy=make_policy("hybridspec", 15, policy_parameters()),
                             max_new_tokens=NEW_TOKENS, record_routing=True)
    for r in result.rounds:
        assert r.w in (r.w0, r.w0 + 1) or r.truncated
        assert r.u in (r.w, r.w + 1) and r.layer0_experts.shape == (r.u, target.cfg.num_experts_per_tok)
        assert len(r.expert_ids) == sum(layer.is_moe for layer in target.layers)
        assert all(ids.shape[0] == r.w for ids in r.expert_ids)
        assert len(r.confidence) == len(r.entropy) == len(r.draft_tokens) == 15
    assert sum(r.emitted for r in result.rounds) == len(result.token_ids) - 1
    assert len({r.w for r in result.rounds}) > 2  # the policy adapts the length
