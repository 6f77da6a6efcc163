"""Sampling exactness of `hybridspec` with the point-mass rule (`test_engine_sampling.py` has the
method and `full`; a file of its own so the parallel test run puts it on another worker)."""

from __future__ import annotations

import pytest

from tests.runtime.test_engine_sampling import _p_value, _sample, exact, target  # noqa: F401 (fixtures)


@pytest.mark.slow
def test_point_mass_rule_matches_target_sampling_hybridspec(target, exact):  # noqa: F811
    assert _p_value(_sample(target, "hybridspec"), exact) > 1e-3
