"""The shipped embedded pair: loads, decodes exactly, tokenizer round-trips, prompts validate."""

from __future__ import annotations

from collections import Counter

import pytest

from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import EMBEDDED, open_session
from hybridspec.workbench.prompts import load_prompts

pytestmark = pytest.mark.skipif(not (EMBEDDED / "target" / "config.json").is_file(), reason="embedded pair absent")


@pytest.fixture(scope="module")
def session():
    return open_session()


def test_shipped_files_fit_the_size_budget():
    total = sum(f.stat().st_size for f in EMBEDDED.rglob("*") if f.is_file())
    assert total <= 24 * 2**20, f"{total / 2**20:.1f} MiB"


def test_pair_shapes(session):
    cfg = session.target.cfg
    assert cfg.model_type == "qwen3_5_moe_text" and cfg.layer_types[0] == "linear_attention"
    assert all(t == "full_attention" for i, t in enumerate(cfg.layer_types) if (i + 1) % 4 == 0)
    assert cfg.num_experts >= 16 and cfg.num_experts_per_tok >= 2 and cfg.shared_expert_intermediate_size > 0
    assert session.drafter.cfg.block_size == 16 and session.drafter.draft_len == 15


def test_tokenizer_round_trips_text(session):
    text = 'def f(x):\n    """Return x, twice."""\n    return [x, x]  # ünïcode ✓\n'
    assert session.codec.decode(session.codec.encode(text)) == text


def test_greedy_speculative_decoding_equals_ar(session):
    prompts = load_prompts(EMBEDDED / "prompts.jsonl", split="test")
    for prompt in prompts[::50]:
        ids = session.codec.encode(prompt.text)
        ar = session.engine.generate(ids, policy=make_policy("ar", 15), max_new_tokens=32, eos_ids=session.eos_ids)
        for name in ("full", "static:5"):
            got = session.engine.generate(ids, policy=make_policy(name, 15), max_new_tokens=32,
                                          eos_ids=session.eos_ids)
            assert got.token_ids == ar.token_ids, (prompt.id, name)


def test_prompt_set_validates_with_balanced_splits(session):
    prompts = load_prompts(EMBEDDED / "prompts.jsonl")
    counts = Counter((p.category, p.split) for p in prompts)
    assert len({c for c, _ in counts}) >= 5
    assert all(n == 40 for n in counts.values()), counts
    assert max(len(session.codec.encode(p.text)) for p in prompts) <= 512
