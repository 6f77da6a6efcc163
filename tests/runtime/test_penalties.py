"""Presence, frequency and repetition penalties (runtime/penalties.py):

- `penalized` row by row equals vLLM's definitions applied to each row's own history (a loop
  over the output so far plus the drafts before the row);
- every policy emits `ar`'s tokens under penalties, greedy (host and resident rounds), and the
  resident rounds emit the host rounds' tokens when sampling;
- `ar` under penalties equals a teacher-forced oracle: each token the argmax of the penalised
  logits of its own history."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime.penalties import PenaltyState, penalized
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.sampling import SamplingParams
from tests.runtime.helpers import policy_parameters

PROMPT = "def fibonacci(n):\n    "
TOKENS = 32
PENALTIES = dict(presence_penalty=0.8, frequency_penalty=0.3, repetition_penalty=1.3)


def naive_row(logits: torch.Tensor, prompt: list[int], history: list[int], p: dict) -> torch.Tensor:
    """vLLM's penalties for one row [V] whose history (output so far) is `history`."""
    out = logits.clone().float()
    for v in set(prompt) | set(history):
        out[v] = out[v] / p["repetition_penalty"] if out[v] > 0 else out[v] * p["repetition_penalty"]
    for v in set(history):
        out[v] -= p["frequency_penalty"] * history.count(v) + p["presence_penalty"]
    return out


def test_penalized_rows_follow_their_own_history():
    torch.manual_seed(0)
    V, w = 50, 6
    state = PenaltyState.allocate(V, "cpu")
    prompt, output = [3, 7, 7, 11], [7, 20, 20, 4]
    bias = ((5, 2.5), (9, -1.0))
    state.begin(prompt, SamplingParams(**PENALTIES, logit_bias=bias, min_tokens=7), end_ids=(2, 33))
    state.record(torch.tensor(output))
    state.record(torch.tensor([9, 9, 9]), torch.tensor([1]))  # only the first of them counts
    output = output + [9]
    drafts = torch.tensor([20, 33, 3, 20, 41, 5])  # more than w − 1: the rows read only the first w − 1
    logits = torch.randn(w, V) * 3
    got = penalized(logits, drafts, state)
    for i in range(w):
        want = naive_row(logits[i], prompt, output + drafts[:i].tolist(), PENALTIES)
        for token, value in bias:
            want[token] += value
        if len(output) + i < 7:  # the token decided is among the first min_tokens: no end token
            want[[2, 33]] = float("-inf")
        torch.testing.assert_close(got[i], want, msg=f"row {i}")
    assert got[1, 33] == float("-inf") and got[3, 33] > float("-inf")  # five output tokens: rows 0, 1 masked


@pytest.fixture(scope="module")
def greedy_ar(session, engines):
    prompt = session.codec.encode(PROMPT)
    ar = make_policy("ar", session.drafter.draft_len)
    sampling = SamplingParams(**PENALTIES)
    return prompt, engines["host"].generate(prompt, policy=ar, max_new_tokens=TOKENS, sampling=sampling).token_ids


def test_ar_under_penalties_equals_the_teacher_forced_oracle(session, engines, greedy_ar):
    prompt, tokens = greedy_ar
    engine = engines["host"]
    plain = engine.generate(prompt, policy=make_policy("ar", session.drafter.draft_len), max_new_tokens=TOKENS)
    assert plain.token_ids != tokens  # the penalties change this output
    engine.cache.reset()
    ids = torch.tensor([prompt + tokens])
    logits = session.target.prefill(ids, engine.cache, all_logits=True).logits[0, len(prompt) - 1 : -1]
    engine.cache.reset()
    for i, token in enumerate(tokens):
        assert int(naive_row(logits[i], prompt, tokens[:i], PENALTIES).argmax()) == token, f"token {i}"


@pytest.mark.parametrize("path", ("host", "resident"))
@pytest.mark.parametrize("name", ("ar", "full", "static:4", "hybridspec"))
def test_every_policy_emits_ar_tokens_under_penalties(session, engines, greedy_ar, path, name):
    prompt, want = greedy_ar
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    got = engines[path].generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=SamplingParams(**PENALTIES))
    assert got.token_ids == want
    if name == "full":
        assert max(r.accepted for r in got.rounds) >= 2  # drafts were accepted under the penalties


@pytest.mark.parametrize("name", ("ar", "full", "hybridspec"))
def test_sampled_resident_rounds_equal_host_rounds_under_penalties(session, engines, name):
    prompt = session.codec.encode(PROMPT)
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    sampling = SamplingParams(0.8, 0, 1.0, 7, **PENALTIES)
    runs = [engines[path].generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling).token_ids
            for path in ("host", "resident")]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", ("ar", "full", "hybridspec"))
def test_min_tokens_and_logit_bias_keep_every_policy_on_ar(session, engines, name):
    """min_tokens holds back an end token that greedy decoding would emit early; logit_bias moves
    the argmax; every policy emits `ar`'s tokens under both, host and resident rounds alike."""
    prompt = session.codec.encode(PROMPT)
    ar = make_policy("ar", session.drafter.draft_len)
    free = engines["host"].generate(prompt, policy=ar, max_new_tokens=TOKENS).token_ids
    end = free[3]
    early = engines["host"].generate(prompt, policy=ar, max_new_tokens=TOKENS, eos_ids=(end,)).token_ids
    assert len(early) == free.index(end) + 1 < 12
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    held = SamplingParams(min_tokens=12)
    want = engines["host"].generate(prompt, policy=ar, max_new_tokens=TOKENS, eos_ids=(end,), sampling=held).token_ids
    assert len(want) > 12 and end not in want[:12]
    biased = SamplingParams(logit_bias=((free[5], 100.0),))
    want_biased = engines["host"].generate(prompt, policy=ar, max_new_tokens=8, sampling=biased).token_ids
    assert want_biased == [free[5]] * 8
    for path in ("host", "resident"):
        got = engines[path].generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=(end,), sampling=held)
        assert got.token_ids == want, path
        assert engines[path].generate(prompt, policy=policy, max_new_tokens=8, sampling=biased).token_ids == want_biased


def test_min_p_cuts_below_its_share_of_the_most_likely_token():
    torch.manual_seed(1)
    V, T, q = 40, 0.7, 0.2
    state = PenaltyState.allocate(V, "cpu")
    state.begin([1], SamplingParams(temperature=T, min_p=q))
    logits = torch.randn(3, V) * 2
    got = penalized(logits, torch.tensor([5, 6]), state)
    probs = torch.softmax(logits / T, dim=-1)
    cut = probs < q * probs.amax(-1, keepdim=True)
    assert torch.equal(torch.isinf(got), cut) and torch.equal(got[~cut], logits[~cut])
    state.begin([1], SamplingParams(min_p=q))  # greedy: min_p changes nothing
    assert torch.equal(penalized(logits, torch.tensor([5, 6]), state), logits)


@pytest.mark.parametrize("name", ("ar", "full", "hybridspec"))
def test_min_p_one_samples_the_argmax_under_every_policy(session, engines, greedy_ar, name):
    """min_p = 1 keeps only the most likely token of each row: sampling at any temperature then
    emits the greedy tokens, under every policy, host and resident rounds alike."""
    prompt, _ = greedy_ar
    ar = make_policy("ar", session.drafter.draft_len)
    want = engines["host"].generate(prompt, policy=ar, max_new_tokens=TOKENS).token_ids
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    for path in ("host", "resident"):
        got = engines[path].generate(prompt, policy=policy, max_new_tokens=TOKENS,
                                     sampling=SamplingParams(1.3, 0, 1.0, 5, min_p=1.0))
        assert got.token_ids == want, path


def test_penalty_values_are_checked():
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=2.5)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=0.0)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((1, 101.0),))
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
