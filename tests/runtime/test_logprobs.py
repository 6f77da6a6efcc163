"""Logprobs of emitted tokens (runtime/logprobs.py) on every path, against a teacher-forced oracle:
the target's log softmax over prompt + output in one prefill, row i − 1 for output token i.

- `logprob_rows`: the chosen token's entry and the top-k equal log_softmax and topk;
- the host rounds and the resident rounds (eager, as the graphs' oracle) of every policy give every
  emitted token, greedy or sampled, the oracle's log-probability and alternatives (raw: before
  temperature and filters), cut with the tokens at EOS and at the output limit."""

from __future__ import annotations

import math

import pytest
import torch

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.logprobs import MAX_TOP_LOGPROBS, from_rows, logprob_rows, token_logprobs
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.sampling import SamplingParams
from tests.runtime.helpers import policy_parameters

PROMPT = "def fibonacci(n):\n    "
TOKENS = 24
TOP = 3
ATOL = 2e-4  # fp32: pass shapes differ between the oracle's prefill and the rounds


def oracle(session, engine: Engine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V] log-probabilities of the rows that decided `output`, by one teacher-forced prefill."""
    engine.cache.reset()
    ids = torch.tensor([prompt + output], dtype=torch.long)
    logits = session.target.prefill(ids, engine.cache, all_logits=True).logits[0]
    engine.cache.reset()
    return torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]


def test_logprob_rows_equal_log_softmax_and_topk():
    torch.manual_seed(0)
    logits = torch.randn(7, 301) * 4
    tokens = torch.randint(0, 301, (7,))
    rows = logprob_rows(logits, tokens, 5)
    logp = torch.log_softmax(logits, dim=-1)
    assert rows.shape == (7, 11)
    torch.testing.assert_close(rows[:, 0], logp.gather(1, tokens[:, None])[:, 0])
    values, ids = logp.topk(5, dim=-1)
    torch.testing.assert_close(rows[:, 1:6], values)
    assert torch.equal(rows[:, 6:].long(), ids)
    lps = from_rows(rows.tolist(), 2)  # fewer alternatives than the rows carry: the best ones
    assert [[i for i, _ in top] for top in lps.top] == ids[:, :2].tolist()
    assert logprob_rows(logits, tokens, 0).shape == (7, 1)
    assert len(token_logprobs(logits[:2], tokens[:2].tolist(), 0).top[0]) == 0


@pytest.mark.parametrize("path", ("host", "resident"))
@pytest.mark.parametrize("name", ("ar", "full", "static:4", "hybridspec"))
@pytest.mark.parametrize("sampling", (SamplingParams(), SamplingParams(0.9, 40, 0.95, seed=11)),
                         ids=("greedy", "sampled"))
def test_every_emitted_token_gets_the_oracle_logprobs(session, engines, path, name, sampling):
    engine = engines[path]
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompt = session.codec.encode(PROMPT)
    got = engine.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling, logprobs=TOP)
    plain = engine.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling)
    assert got.token_ids == plain.token_ids and plain.logprobs is None  # asking for logprobs changes nothing
    assert len(got.logprobs) == len(got.token_ids) == sum(len(r.logprobs) for r in got.rounds) + 1
    want = oracle(session, engine, prompt, got.token_ids)
    ids = torch.tensor(got.token_ids)
    torch.testing.assert_close(torch.tensor(got.logprobs.chosen), want.gather(1, ids[:, None])[:, 0],
                               atol=ATOL, rtol=0)
    values, top_ids = want.topk(TOP, dim=-1)
    for i, top in enumerate(got.logprobs.top):
        assert [t for t, _ in top] == top_ids[i].tolist() or max(values[i, :-1] - values[i, 1:]) < ATOL  # ties
        torch.testing.assert_close(torch.tensor([v for _, v in top]), values[i], atol=ATOL, rtol=0)
    if sampling.greedy:  # the argmax is the first alternative
        assert [top[0][0] for top in got.logprobs.top] == got.token_ids


def test_logprobs_are_cut_with_the_tokens_at_eos(session, engines):
    """A round whose tokens run past EOS keeps the logprobs of the tokens up to EOS only."""
    engine = engines["resident"]
    policy = make_policy("full", session.drafter.draft_len)
    prompt = session.codec.encode(PROMPT)
    free = engine.generate(prompt, policy=policy, max_new_tokens=TOKENS).token_ids
    eos = free[5]
    first = free.index(eos) + 1
    got = engine.generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=(eos,), logprobs=0)
    assert got.token_ids == free[:first] and len(got.logprobs) == first
    assert all(not math.isnan(v) and v <= 0 for v in got.logprobs.chosen)


def test_logprobs_beyond_the_limit_are_refused(session, engines):
    policy = make_policy("ar", session.drafter.draft_len)
    with pytest.raises(ValueError, match="logprobs must be in"):
        engines["host"].generate([1, 2], policy=policy, max_new_tokens=2, logprobs=MAX_TOP_LOGPROBS + 1)


def test_prompt_logprobs_over_several_prefill_chunks(session, engines):
    """The prompt's logprobs, taken chunk by chunk in the prefill (a prompt over two chunks), equal
    the oracle's rows for prompt tokens 1 … T − 1; the decoding is unchanged."""
    engine = engines["host"]
    prompt = session.codec.encode(PROMPT * 16)[:150]
    assert len(prompt) == 150 > 2 * engine.cache.max_tokens_per_pass
    policy = make_policy("full", session.drafter.draft_len)
    steps = engine.stream(prompt, policy=policy, max_new_tokens=4, prompt_logprobs=2)
    first, record = next(steps)
    rest = [t for new, _ in steps for t in new]
    got = record.prompt_logprobs
    want = oracle(session, engine, prompt[:1], prompt[1:])  # rows 0 … T − 2 decide tokens 1 … T − 1
    assert len(got) == len(prompt) - 1
    torch.testing.assert_close(torch.tensor(got.chosen), want.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0],
                               atol=ATOL, rtol=0)
    assert [[i for i, _ in top] for top in got.top] == want.topk(2, dim=-1).indices.tolist()
    assert first + rest == engine.generate(prompt, policy=policy, max_new_tokens=4).token_ids


def test_finite_floors_what_json_cannot_hold():
    from hybridspec.runtime.logprobs import LOGPROB_FLOOR, finite

    assert [finite(v) for v in (-1.5, float("-inf"), float("nan"), None)] == [-1.5, LOGPROB_FLOOR, LOGPROB_FLOOR, None]
