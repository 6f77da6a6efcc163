"""What the engine accepts as a request, and one engine serving requests one after another: bad
values are ValueErrors naming the field, never garbage tokens or an IndexError from deep inside."""

from __future__ import annotations

import math

import pytest

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.loading import load_target, random_drafter
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.sampling import GREEDY_BELOW, SamplingParams

PROMPT = [5, 17, 3, 60, 42]  # the tiny target's vocabulary is 97


@pytest.fixture(scope="module")
def target(qwen35_dir):
    return load_target(qwen35_dir, feature_layers=(0,))


@pytest.fixture(scope="module")
def engines(target):
    drafter = random_drafter(target, seed=3)
    return {"host": Engine(target, drafter, max_context=64, resident=False),
            "resident": Engine(target, drafter, max_context=64, resident=True, graphs=False)}


@pytest.mark.parametrize("field, value", [("temperature", math.nan), ("temperature", math.inf),
                                          ("temperature", -0.5), ("top_p", 0.0), ("top_p", math.nan),
                                          ("top_k", -1), ("repetition_penalty", math.nan),
                                          ("presence_penalty", 1e9)])
def test_invalid_sampling_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kind", ["host", "resident"])
@pytest.mark.parametrize("temperature", [1e-38, 1e-300, GREEDY_BELOW / 2])
def test_temperatures_too_small_for_fp32_decode_greedily(engines, kind, temperature):
    # 1 / T overflows fp32 (or the logits times it do): the limit of sampling as T → 0 is greedy
    engine, policy = engines[kind], make_policy("full", 15)
    greedy = engine.generate(PROMPT, policy=policy, max_new_tokens=12).token_ids
    cold = SamplingParams(temperature=temperature, seed=1)
    assert engine.generate(PROMPT, policy=policy, max_new_tokens=12, sampling=cold).token_ids == greedy


@pytest.mark.parametrize("prompt", [[97], [-1], [3, 10**6]])
def test_prompt_ids_outside_the_vocabulary_are_refused(engines, prompt):
    with pytest.raises(ValueError, match="outside the vocabulary of 97"):
        engines["host"].generate(prompt, policy=make_policy("ar", 15), max_new_tokens=2)


@pytest.mark.parametrize("count", [0, -3, 2.5, "4"])
def test_max_new_tokens_must_be_a_positive_integer(engines, count):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
        engines["host"].generate(PROMPT, policy=make_policy("full", 15), max_new_tokens=count)


@pytest.mark.parametrize("token", [97, -1])
def test_logit_bias_ids_outside_the_vocabulary_are_refused(engines, token):
    sampling = SamplingParams(logit_bias=((token, 5.0),))
    with pytest.raises(ValueError, match="logit_bias ids"):
        engines["host"].generate(PROMPT, policy=make_policy("ar", 15), max_new_tokens=2, sampling=sampling)


@pytest.mark.parametrize("kind", ["host", "resident"])
@pytest.mark.parametrize("name", ["ar", "static:3"])
def test_a_stream_overtaken_by_a_later_request_refuses_to_go_on(engines, kind, name):
    engine, policy = engines[kind], make_policy(name, 15)
    alone = engine.generate([7, 8, 9], policy=policy, max_new_tokens=20).token_ids
    stale = engine.stream(PROMPT, policy=policy, max_new_tokens=20)
    next(stale), next(stale)
    later = engine.stream([7, 8, 9], policy=policy, max_new_tokens=20)
    head = next(later)[0]
    with pytest.raises(RuntimeError, match="overtaken by a later request"):
        next(stale)
    assert head + [t for new, _ in later for t in new] == alone  # the later request is untouched


@pytest.mark.parametrize("kind", ["host", "resident"])
@pytest.mark.parametrize("name", ["ar", "static:5"])
def test_a_stop_ends_the_output_within_a_round(engines, kind, name):
    """`Engine.generate`'s stop: the output is the whole output's first `length` ids, the rounds'
    emitted counts and logprobs cut with it, finish_reason "stop"; the stop is shown each step's
    output with the count it saw before; the engine's next request decodes whole."""
    engine, policy = engines[kind], make_policy(name, 15)
    whole = engine.generate(PROMPT, policy=policy, max_new_tokens=20, logprobs=1)
    assert len(whole.token_ids) == 20 and whole.finish_reason == "length"
    for length in (1, 2, 7):
        calls = []

        def stop(ids, seen):
            calls.append((len(ids), seen))
            return length if len(ids) >= length else None

        cut = engine.generate(PROMPT, policy=policy, max_new_tokens=20, logprobs=1, stop=stop)
        assert cut.token_ids == whole.token_ids[:length] and cut.finish_reason == "stop"
        assert 1 + sum(r.emitted for r in cut.rounds) == len(cut.logprobs) == length
        assert cut.logprobs.chosen == pytest.approx(whole.logprobs.chosen[:length])
        assert calls[0] == (1, 0) and all(seen == before for (_, seen), (before, _) in zip(calls[1:], calls))
        assert calls[-1][1] < length <= calls[-1][0]
    assert engine.generate(PROMPT, policy=policy, max_new_tokens=20).token_ids == whole.token_ids


def test_a_stop_length_outside_the_new_ids_is_refused(engines):
    """A stop that returns a length not past the ids it had seen, or past all of them, is a
    ValueError naming it, not a negative emitted count."""
    policy = make_policy("static:5", 15)
    for bad in (lambda ids, seen: seen if seen else None, lambda ids, seen: len(ids) + 1):
        with pytest.raises(ValueError, match="stop returned"):
            engines["host"].generate(PROMPT, policy=policy, max_new_tokens=20, stop=bad)
