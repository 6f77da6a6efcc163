"""Eq. 5 and Eq. 6 as the runtime implements them equal a direct transcription (hypothesis), and
the runtime's acceptance estimate equals the fitter's."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridspec.fitters.acceptance import AcceptanceFitter
from hybridspec.fitters.rate import expected_tokens, select_lengths
from hybridspec.runtime.acceptance import AcceptanceEstimator
from hybridspec.runtime.policies import make_policy
from tests.fitters.synthetic import rounds
from tests.runtime.helpers import policy_parameters

D = 15
probs = st.lists(st.floats(0.0, 1.0), min_size=D, max_size=D)


def _eq5(p_hat, rho, cost, lengths):
    """argmax_{w ∈ W0} 1 + Σ_{i=1}^{w−1} p̂_i − ρ C(w), the first (shortest) maximum."""
    best, best_w = None, None
    for w in sorted(lengths):
        score = 1 + sum(p_hat[: w - 1]) - rho * cost[w]
        if best is None or score > best:
            best, best_w = score, w
    return best_w


def _eq6(w0, p_hat, experts, w_rem, prm):
    """w0 + 1 iff p̂_{w0} > ρ ΔL_c, ΔL_c = C(w0+1) − C(w0) − s + η (n̄(w0|n_new) − n̄(w0))."""
    if w0 >= D + 1 or w_rem <= w0:
        return w0
    n_new = len(set(experts[w0]) - set(e for row in experts[:w0] for e in row))
    delta = prm.cost[w0 + 1] - prm.cost[w0] - prm.s + prm.eta * (prm.nbar_cond[w0][n_new] - prm.nbar_all[w0])
    return w0 + 1 if p_hat[w0 - 1] > prm.rho * delta else w0


@settings(max_examples=200, deadline=None)
@given(p=st.lists(st.floats(0.0, 1.0), min_size=D, max_size=D), rho=st.floats(1.0, 5000.0),
       lengths=st.sets(st.integers(2, D + 1), min_size=1))
def test_eq5_selection_matches_the_transcription(p, rho, lengths):
    prefix = np.cumprod(p)
    cost = np.array([0.0, 0.0] + [1e-3 + 4e-4 * w + 2e-5 * w * w for w in range(2, D + 2)])
    got = select_lengths(expected_tokens(prefix[None]), cost, np.array(sorted(lengths)), rho)[0]
    assert got == _eq5(prefix, rho, cost, lengths)


@settings(max_examples=100, deadline=None)
@given(tie_at=st.integers(2, D))
def test_eq5_ties_go_to_the_shorter_length(tie_at):
    """With p̂ = 0 beyond tie_at and a flat cost, every w ≥ tie_at scores the same."""
    prefix = np.array([1.0] * (tie_at - 1) + [0.0] * (D - tie_at + 1))
    cost = np.zeros(D + 2)
    got = select_lengths(expected_tokens(prefix[None]), cost, np.arange(2, D + 2), 100.0)[0]
    assert got == tie_at


@settings(max_examples=200, deadline=None)
@given(p=st.lists(st.floats(0.01, 1.0), min_size=D, max_size=D), rho=st.floats(50.0, 2000.0),
       eta=st.floats(0.0, 5e-4), s=st.floats(0.0, 5e-4), w_rem=st.integers(2, D + 1),
       experts=st.lists(st.lists(st.integers(0, 7), min_size=2, max_size=2, unique=True), min_size=D + 1,
                        max_size=D + 1))
def test_runtime_policies_match_eq5_and_eq6(p, rho, eta, s, w_rem, experts):
    prm = dataclasses.replace(policy_parameters(), rho=rho, eta=eta, s=s)
    policy = make_policy("hybridspec", D, prm)
    conf = torch.tensor(p)
    w0, p_hat = policy.select(conf, 1.0 - conf)
    assert w0 == _eq5(p_hat.tolist(), rho, prm.cost, prm.lengths)
    ids = torch.tensor(experts)
    if w0 < D + 1:
        u = min(w0 + 1, w_rem)
        got = policy.correct(w0, p_hat, ids[:u], w_rem, num_experts=8) if u == w0 + 1 else w0
        assert got == _eq6(w0, p_hat.tolist(), experts, w_rem, prm)


def test_runtime_estimator_equals_the_fitter():
    conf, ent, _, a_d = rounds(3000, seed=9)
    fitter = AcceptanceFitter().fit(conf, ent, a_d)
    from hybridspec.artifacts.params import AcceptanceModel

    model = AcceptanceModel(iso_x=tuple(tuple(x) for x in fitter.iso_x_), iso_y=tuple(tuple(y) for y in fitter.iso_y_),
                            coef=tuple(fitter.coef_))
    estimator = AcceptanceEstimator(model)
    want = fitter.predict_conditional(conf[:50], ent[:50])
    got = np.stack([estimator.conditional(torch.tensor(conf[r], dtype=torch.float32),
                                          torch.tensor(ent[r], dtype=torch.float32)).numpy() for r in range(50)])
    assert np.abs(got - want).max() < 1e-5
