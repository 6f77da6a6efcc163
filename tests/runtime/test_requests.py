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
