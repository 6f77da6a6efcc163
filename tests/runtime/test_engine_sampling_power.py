"""The power of the sampling-exactness test (`test_engine_sampling.py`): its chi-square test
rejects the `min(1, p/q)` rule applied to the drafter's argmax under a draft-reading length rule."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime import engine as engine_module
from hybridspec.runtime.sampling import target_probs
from tests.runtime.test_engine_sampling import _p_value, _sample, exact_joint, target  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def exact(target):  # noqa: F811
    return exact_joint(target)


def _min_p_over_q(draft, logits, params, generator):
    """The general rule min(1, p/q) with q the drafter's confidence in its argmax: not exact here."""
    probs = target_probs(logits, params).cpu()
    for i in range(draft.shape[0]):
        d, q = int(draft[i]), _min_p_over_q.confidence[i]
        if float(torch.rand(1, generator=generator)) <= min(1.0, float(probs[i, d]) / q):
            continue
        residual = (probs[i] - 0).clamp_min(0)
        residual[d] = 0
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return draft.shape[0], int(torch.multinomial(probs[-1], 1, generator=generator))


@pytest.mark.slow
def test_chi_square_rejects_a_broken_rule(target, exact, monkeypatch):
    original = engine_module.Engine._accept

    def broken(draft, out, w, sampling, generator):
        _min_p_over_q.confidence = draft.confidence.tolist()
        return _min_p_over_q(draft.tokens[: w - 1], out.logits[0], sampling, generator)

    monkeypatch.setattr(engine_module.Engine, "_accept", staticmethod(broken))
    assert _p_value(_sample(target, "hybridspec"), exact) < 1e-6
    monkeypatch.setattr(engine_module.Engine, "_accept", original)
