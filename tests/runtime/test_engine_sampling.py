"""Sampling exactness (DESIGN A.6, Proposition 2): with the point-mass rule, `full` and
`hybridspec` sample the first tokens from exactly the target-only distribution; `hybridspec`
is checked in `test_engine_sampling_hybridspec.py` and the same test rejects a broken rule in
`test_engine_sampling_power.py` (files of their own, so the parallel test run spreads the three
long runs over its workers)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.loading import load_target, random_drafter, random_drafter_layers, target_config
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.sampling import SamplingParams, target_probs
from tests.checkpoints import write_tiny_qwen3_5_moe
from tests.runtime.helpers import policy_parameters

PROMPT = [1, 4, 2]
TOKENS = 4  # joint distribution of the first four generated tokens
SAMPLES = 800  # the broken rule of test_engine_sampling_power.py: p = 2.7e-10 at 800 (1.4e-8 at 700, 6.9e-4 at 500)
SAMPLING = dict(temperature=0.9, top_k=5, top_p=0.97)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = write_tiny_qwen3_5_moe(tmp_path_factory.mktemp("v7"), seed=5, vocab_size=7, num_hidden_layers=4)
    return load_target(directory, feature_layers=random_drafter_layers(target_config(directory)))


@pytest.fixture(scope="module")
def exact(target):
    return exact_joint(target)


def exact_joint(target) -> dict:
    """P(t1 … t4) of target-only sampling, by enumeration: {tuple: probability}. The prefixes of each
    length are the rows of one batched prefill (rows do not interact: each row's last logits are
    those of a prefill of its prefix alone, to float rounding)."""
    V, params = target.cfg.vocab_size, SamplingParams(**SAMPLING)
    probs = {}
    for n in range(TOKENS):
        prefixes = list(itertools.product(range(V), repeat=n))  # V^n of them
        cache = target.new_cache(max_len=32, tokens_per_pass=16, batch=len(prefixes))
        logits = target.prefill(torch.tensor([PROMPT + list(p) for p in prefixes]), cache).logits[:, -1]  # [V^n, V]
        probs.update(zip(prefixes, target_probs(logits, params).double().numpy()))
    joint = {}
    for seq in itertools.product(range(V), repeat=TOKENS):
        p = np.prod([probs[seq[:i]][seq[i]] for i in range(TOKENS)])
        if p > 0:
            joint[seq] = p
    return joint


@torch.inference_mode()  # nothing here needs autograd: inference mode skips its bookkeeping on every op
def _sample(target, policy_name: str) -> dict:
    engine = Engine(target, random_drafter(target, seed=9), max_context=64)
    policy = make_policy(policy_name, 15, policy_parameters(rho=60.0))
    counts: dict = {}
    for seed in range(SAMPLES):
        out = engine.generate(PROMPT, policy=policy, max_new_tokens=TOKENS,
                              sampling=SamplingParams(**SAMPLING, seed=seed)).token_ids
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts


def _p_value(counts: dict, exact: dict) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one."""
    assert set(counts) <= set(exact), "sampled a sequence the target gives zero probability"
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for seq, p in exact.items():
        e = p * SAMPLES
        if e < 5:
            pool_o, pool_e = pool_o + counts.get(seq, 0), pool_e + e
        else:
            observed.append(counts.get(seq, 0))
            expected.append(e)
    observed.append(pool_o)
    expected.append(pool_e)
    return float(chisquare(observed, np.array(expected) * sum(observed) / sum(expected)).pvalue)


@pytest.mark.slow
def test_point_mass_rule_matches_target_sampling_full(target, exact):
    assert _p_value(_sample(target, "full"), exact) > 1e-3
