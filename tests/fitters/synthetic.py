"""Synthetic calibration data with known truth."""

from __future__ import annotations

import numpy as np

from hybridspec.fitters.acceptance import features

TRUE_COEF = np.array([-1.0, 5.0, -0.08, 0.05, -1.2, -0.9])  # intercept, conf, pos, conf·pos, log1p(h̄), jump


def rounds(n: int, draft_len: int = 15, seed: int = 0, coef: np.ndarray = TRUE_COEF):
    """confidence, entropy [n, D]; true conditional c [n, D]; A_D [n] drawn from c."""
    rng = np.random.default_rng(seed)
    confidence = rng.beta(2.0, 1.5, size=(n, draft_len))
    entropy = rng.gamma(2.0, 0.6, size=(n, draft_len)) * (1.3 - confidence)  # correlated but not redundant
    truth = 1 / (1 + np.exp(-(coef[0] + features(confidence, entropy) @ coef[1:])))
    survive = rng.random((n, draft_len)) < truth
    accepted_full = np.cumprod(survive, axis=1).sum(axis=1)
    return confidence, entropy, truth, accepted_full
