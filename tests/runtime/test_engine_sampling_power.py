"""The power of the sampling-exactness test (`test_engine_sampling.py`): its chi-square test
rejects the `min(1, p/q)` rule applied to the drafter's argmax under a draft-reading length rule."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime import engine as engine_module
from hybridspec.kernels.sampling.reference import ACCEPT_LANE, keyed_uniforms, race
from hybridspec.runtime.sampling import target_probs
from tests.runtime.test_engine_sampling import _p_value, _sample, exact, target  # noqa: F401 (fixtures)


def _min_p_over_q(draft, logits, params, position):
    """The general rule min(1, p/q) with q the drafter's confidence in its argmax: not exact here.
    Same keyed draws as the engine's rule (lane 0 for the test, the race for the residual)."""
    probs = target_probs(logits, params)
    seed = torch.tensor([params.seed])
    for i in range(draft.shape[0]):
        d, q = int(draft[i]), _min_p_over_q.confidence[i]
        xi = float(keyed_uniforms(seed, torch.tensor([position + i]), torch.tensor([ACCEPT_LANE]))[0, 0])
        if xi <= min(1.0, float(probs[i, d]) / q):
            continue
        residual = probs[i].clone()
        residual[d] = 0
        return i, int(race(residual[None], seed, torch.tensor([position + i]))[0])
    return draft.shape[0], int(race(probs[-1:], seed, torch.tensor([position + draft.shape[0]]))[0])


@pytest.mark.slow
def test_chi_square_rejects_a_broken_rule(target, exact, monkeypatch):
    original = engine_module.Engine._accept

    def broken(draft, logits, w, sampling, position):
        _min_p_over_q.confidence = draft.confidence.tolist()
        return _min_p_over_q(draft.tokens[: w - 1], logits, sampling, position)

    monkeypatch.setattr(engine_module.Engine, "_accept", staticmethod(broken))
    assert _p_value(_sample(target, "hybridspec"), exact) < 1e-6
    monkeypatch.setattr(engine_module.Engine, "_accept", original)
