"""Our target equals transformers' on tiny random checkpoints of every supported format."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime.loading import load_target
from tests.checkpoints import hf_logits
from tests.tolerance import assert_close

# (pass start, pass length w, tokens committed m) after a prefill of 21 tokens
STEPS = [(21, 6, 3), (24, 7, 7), (31, 16, 1), (32, 2, 2), (34, 5, 5)]


def _sequence(vocab: int, n: int = 40) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.mark.parametrize("fixture", ["qwen35_dir", "qwen3next_dir"])
def test_prefill_and_verification_steps_match_transformers(fixture, request):
    directory = request.getfixturevalue(fixture)
    model = load_target(directory)
    ids = _sequence(model.cfg.vocab_size)
    want = hf_logits(directory, ids)  # [T, V]
    cache = model.new_cache(max_len=64, tokens_per_pass=16)  # prefill runs in two chunks
    out = model.prefill(torch.tensor([ids[:21]]), cache, all_logits=True)
    assert_close("prefill logits", want[:21], out.logits[0], 1e-4)
    for start, w, m in STEPS:
        assert cache.length == start
        out = model.forward_pass(torch.tensor([ids[start : start + w]]), cache)
        assert_close(f"logits of the pass at {start} (w={w})", want[start : start + w], out.logits[0], 1e-4)
        model.commit(cache, w, m)


def test_sharded_checkpoint_loads_identically(qwen35_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(qwen35_dir, dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    a, b = load_target(qwen35_dir), load_target(tmp_path)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name
