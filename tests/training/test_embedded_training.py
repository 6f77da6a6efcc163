"""The embedded-pair training command on its tiny CPU recipe, and the drafter's training forward
against its inference path."""

from __future__ import annotations

import json

import pytest
import torch

from hybridspec.runtime.loading import random_drafter
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import open_session
from hybridspec.training.corpus import build_corpus, is_held_out
from hybridspec.training.drafter import block_logits
from hybridspec.training.embedded import RECIPES, train_embedded
from hybridspec.training.prompts import CATEGORIES
from hybridspec.workbench.prompts import load_prompts
from tests.tolerance import assert_close


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("embedded")
    record = train_embedded(out, RECIPES["tiny"], "cpu", log=lambda m: None)
    return out, record


def test_tiny_recipe_writes_a_loadable_pair(tiny_pair):
    out, record = tiny_pair
    assert record["target"]["steps_done"] == RECIPES["tiny"].target_train.steps
    assert record["corpus"]["files"] > 0 and record["corpus"]["held_out_files"] > 0
    session = open_session(str(out / "target"), str(out / "drafter"))
    ids = session.codec.encode("def f(x):\n    return x")
    assert session.codec.decode(ids) == "def f(x):\n    return x"
    ar = session.engine.generate(ids, policy=make_policy("ar", 15), max_new_tokens=24)
    full = session.engine.generate(ids, policy=make_policy("full", 15), max_new_tokens=24)
    assert full.token_ids == ar.token_ids
    assert json.loads((out / "training.json").read_text())["tokenizer"]["vocab_size"] == 400


def test_tiny_recipe_prompt_set_validates(tiny_pair):
    out, _ = tiny_pair
    prompts = load_prompts(out / "prompts.jsonl")
    per = RECIPES["tiny"].prompts_per_category
    assert len(prompts) == len(CATEGORIES) * per
    assert {p.split for p in prompts} == {"calib", "test"}
    assert len(load_prompts(out / "prompts.jsonl", split="calib")) == len(CATEGORIES) * (per // 2)


def test_held_out_split_is_by_file_and_deterministic():
    a = build_corpus(held_out_fraction=0.2, max_files=40)
    b = build_corpus(held_out_fraction=0.2, max_files=40)
    assert [(f.path, f.held_out) for f in a.files] == [(f.path, f.held_out) for f in b.files]
    assert all(f.held_out == is_held_out(f.path, 0.2) for f in a.files)
    assert any(f.held_out for f in a.files) and not all(f.held_out for f in a.files)


def test_training_forward_equals_the_inference_draft(qwen35_dir):
    """block_logits (all blocks at once, masked) = propose() after extend() for each anchor."""
    from hybridspec.runtime.loading import load_target

    target = load_target(qwen35_dir)
    drafter = random_drafter(target, num_layers=2, seed=8)
    S = 40
    tokens = torch.randint(0, target.cfg.vocab_size, (2, S), generator=torch.Generator().manual_seed(1))
    features = torch.randn(2, S, len(drafter.cfg.target_layer_ids) * target.cfg.hidden_size)
    anchors = torch.tensor([[1, 9, 20], [5, 17, 24]])
    with torch.no_grad():
        logits = block_logits(drafter, features, tokens, anchors)  # [B, n, D, V]
    for b in range(2):
        for i, a in enumerate(anchors[b].tolist()):
            drafter.reset(64)
            drafter.extend(features[b : b + 1, :a])
            out = drafter.propose(int(tokens[b, a]))
            probs = torch.softmax(logits[b, i], -1)
            assert out.tokens.tolist() == probs.argmax(-1).tolist()
            assert_close(f"confidence b={b} a={a}", probs.max(-1).values, out.confidence, 1e-5)
