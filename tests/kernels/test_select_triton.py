"""The one-launch selector (`kernels/select`, under TRITON_INTERPRET on CPU) against the policies'
torch form and against its plain float64 reference: p̂ within fp32 rounding, and the same w0, w_c
and w = min(w_c, w_rem) wherever the torch form's decision is not a tie to float precision (the
kernel's logistic dot product, sigmoid and log(1 + x) may round an ulp apart from torch's)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridspec.artifacts.params import ENTROPY_EPS, AcceptanceModel
from hybridspec.kernels.select import reference
from hybridspec.runtime.policies import HybridSpecPolicy, NominalPolicy, expected_tokens
from tests.runtime.helpers import policy_parameters

E, K = 32, 4


def _params(seed: int, rho: float):
    """policy_parameters with ragged isotonic rows, a random logistic model and routing tables."""
    g = torch.Generator().manual_seed(seed)
    base = policy_parameters(rho=rho)
    D = base.draft_len
    iso_x, iso_y = [], []
    for i in range(D):
        n = 2 + i % 4  # rows of 2 … 5 points: the padding path
        x = torch.sort(torch.rand(n, generator=g)).values
        y = torch.sort(torch.rand(n, generator=g)).values
        iso_x.append(tuple(x.tolist()))
        iso_y.append(tuple(y.tolist()))
    coef = tuple((torch.randn(6, generator=g) * torch.tensor([1.0, 4.0, 0.1, 0.2, 0.5, 0.3])).tolist())
    nbar_cond = tuple(tuple((1.0 + torch.rand(1, generator=g).item()) * (1 + 2.0 * n) for n in range(5))
                      for w in range(D + 2))
    return dataclasses.replace(base, acceptance=AcceptanceModel(tuple(iso_x), tuple(iso_y), coef),
                               nbar_cond=nbar_cond, nbar_all=tuple(3.0 + 0.1 * w for w in range(D + 2)))


def _torch_form(policy, confidence, entropy, layer0, w_rem):
    w0, p_hat = policy.nominal_length(confidence, entropy)
    w_c = w0
    if isinstance(policy, HybridSpecPolicy):
        w_c = policy.corrected_length(w0, p_hat, layer0, w_rem, E)
    return int(w0), int(w_c), p_hat


def _tie(policy, p_hat, w0) -> bool:
    """The torch form's Eq. 5 choice is a tie to float precision: a runner-up within 1e-5."""
    scores = expected_tokens(p_hat)[policy.lengths] - policy.params.rho * policy.cost[policy.lengths]
    top2 = torch.topk(scores, 2).values
    return float(top2[0] - top2[1]) <= 1e-5 * max(1.0, float(top2[0].abs()))


@pytest.mark.parametrize("kind", [NominalPolicy, HybridSpecPolicy])
@pytest.mark.parametrize("seed", range(6))
def test_selector_kernel_matches_the_torch_form(kind, seed):
    params = _params(seed, rho=[40.0, 400.0, 4000.0][seed % 3])
    policy = kind(kind.__name__, params.draft_len, params)
    D, W = params.draft_len, params.draft_len + 1
    g = torch.Generator().manual_seed(100 + seed)
    checked = 0
    for trial in range(12):
        confidence = torch.rand(D, generator=g) ** (0.3 + trial % 3)
        entropy = torch.rand(D, generator=g) * 3 * (trial % 4 != 0)  # every fourth draft: zero entropy
        layer0 = torch.randint(0, E, (W, 8), generator=g)
        w_rem = torch.tensor([2 + (trial * 5) % W])
        out = tuple(torch.zeros(1, dtype=torch.long) for _ in range(3))
        policy.select_fused(confidence, entropy, w_rem, out, layer0 if kind is HybridSpecPolicy else None)
        w0, w_c, p_hat = _torch_form(policy, confidence, entropy, layer0, w_rem[0])
        if _tie(policy, p_hat, w0):
            continue
        checked += 1
        assert int(out[0]) == w0, f"trial {trial}"
        assert int(out[1]) == w_c and int(out[2]) == min(w_c, int(w_rem)), f"trial {trial}"
        plain, plain_p = tuple(torch.zeros(1, dtype=torch.long) for _ in range(3)), torch.empty(D)
        est = policy.estimator
        correction = (layer0, policy.cost64, policy.nbar_all64, policy.nbar_cond64, policy.scalars64)
        reference.select_lengths(confidence, entropy, est.iso_x, est.iso_y, est.coef, policy.lengths, policy.cost,
                                 params.rho, w_rem, plain, plain_p, correction if kind is HybridSpecPolicy else None,
                                 entropy_eps=ENTROPY_EPS)
        torch.testing.assert_close(plain_p, p_hat, rtol=1e-5, atol=1e-7)
        assert [int(t) for t in plain] == [int(t) for t in out], f"trial {trial}"
    assert checked >= 8


def test_p_hat_and_the_chosen_length_by_hand():
    """One draft with a known answer: ĉ from the artifact by hand, the argmax of G(w) − ρ C(w)."""
    params = _params(0, rho=400.0)
    policy = NominalPolicy("nominal", params.draft_len, params)
    g = torch.Generator().manual_seed(7)
    confidence, entropy = torch.rand(params.draft_len, generator=g), torch.rand(params.draft_len, generator=g)
    out = tuple(torch.zeros(1, dtype=torch.long) for _ in range(3))
    from hybridspec.kernels.select.triton import select_lengths

    p_hat = torch.empty(params.draft_len)
    est = policy.estimator
    select_lengths(confidence, entropy, est.iso_x, est.iso_y, est.coef, policy.lengths, policy.cost, params.rho,
                   torch.tensor([params.draft_len + 1]), out, p_hat, entropy_eps=ENTROPY_EPS)
    torch.testing.assert_close(p_hat, est.prefix(confidence, entropy), rtol=2e-6, atol=1e-7)
    gain = [1.0 + float(p_hat[: w - 1].sum()) for w in params.lengths]
    scores = [gv - params.rho * params.cost[w] for gv, w in zip(gain, params.lengths)]
    assert int(out[0]) == params.lengths[scores.index(max(scores))] == int(out[1]) == int(out[2])


def test_the_routing_correction_reads_the_new_experts_of_token_w0():
    """Eq. 6 with a large η: the extra token is verified when its Layer-0 experts were all seen
    before it (n_new = 0) and not when all are new (n_new = k), as in the torch form."""
    base = _params(3, rho=400.0)
    W = base.draft_len + 1
    params = dataclasses.replace(base, eta=2e-3, s=0.0,
                                 nbar_cond=tuple(tuple(float(2 * n) for n in range(9)) for _ in range(W + 1)),
                                 nbar_all=tuple(4.0 for _ in range(W + 1)))
    policy = HybridSpecPolicy("hybridspec", params.draft_len, params)
    g = torch.Generator().manual_seed(11)
    outcomes = set()
    for trial in range(20):
        confidence, entropy = torch.rand(params.draft_len, generator=g) ** 0.2, torch.rand(params.draft_len, generator=g)
        w_rem = torch.tensor([W])
        out = tuple(torch.zeros(1, dtype=torch.long) for _ in range(3))
        policy.select_fused(confidence, entropy, w_rem, out, torch.zeros(W, 8, dtype=torch.long))
        w0 = int(out[0])
        if w0 >= W:
            continue
        seen = torch.arange(8).repeat(W, 1)  # every token on experts 0..7: n_new = 0
        fresh = seen.clone()
        fresh[w0] = torch.arange(8, 16)  # token w0 on eight new experts: n_new = 8
        for layer0 in (seen, fresh):
            policy.select_fused(confidence, entropy, w_rem, out, layer0)
            want = _torch_form(policy, confidence, entropy, layer0, w_rem[0])
            assert (int(out[0]), int(out[1])) == want[:2]
            outcomes.add((layer0 is fresh, int(out[1]) - w0))
    assert (False, 1) in outcomes and (True, 0) in outcomes
