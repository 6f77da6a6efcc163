"""Policy parameters: the numbers `nominal` and `hybridspec` decide with (DESIGN A.3, A.5, A.9).

Plain numbers and arrays, validated on construction. The fit command produces them; tests build
them by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np


def _finite(name: str, values) -> None:
    """ValueError naming `name` unless every value is a finite real number (bool excluded)."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"{name} must hold finite numbers, found {value!r}")


ENTROPY_EPS = 1e-6  # in the last feature, log((h_i + ε) / (h̄_{i−1} + ε)): finite at zero entropy


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-position isotonic calibration of the top-1 confidence, then a logistic model.

    `iso_x[i]`, `iso_y[i]`: increasing thresholds and calibrated values of draft position i+1
    (piecewise-linear, clipped at the ends). `coef`: intercept then the weights of
    [calibrated confidence, position, their product, log(1 + h̄_i), log(h_i / h̄_{i−1})]."""

    iso_x: tuple[tuple[float, ...], ...]
    iso_y: tuple[tuple[float, ...], ...]
    coef: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.coef) != 6:
            raise ValueError(f"AcceptanceModel.coef has {len(self.coef)} values, expected 6")
        _finite("AcceptanceModel.coef", self.coef)
        if len(self.iso_x) != len(self.iso_y):
            raise ValueError("AcceptanceModel: iso_x and iso_y cover different numbers of positions")
        for pos, (x, y) in enumerate(zip(self.iso_x, self.iso_y), start=1):
            if len(x) != len(y) or not x:
                raise ValueError(f"AcceptanceModel: position {pos} has {len(x)} thresholds and {len(y)} values")
            _finite(f"AcceptanceModel position {pos}", (*x, *y))
            if min(y) < 0 or max(y) > 1:
                raise ValueError(f"AcceptanceModel: calibrated values of position {pos} must be probabilities "
                                 f"in [0, 1], got {min(y):g} … {max(y):g}")
            if np.any(np.diff(x) < 0):
                raise ValueError(f"AcceptanceModel: isotonic thresholds of position {pos} are not sorted")


@dataclass(frozen=True)
class PolicyParameters:
    """`cost[w]` is C_tgt(w) in seconds for w in `lengths` (index w; other entries unused);
    `nbar_all[w0]` = n̄_all(w0); `nbar_cond[w0][n]` = n̄_all(w0 | n)."""

    draft_len: int  # D
    lengths: tuple[int, ...]  # W0, nominal candidate lengths (count the anchor)
    cost: tuple[float, ...]  # [W + 1]
    fixed_cost: float  # per-round cost that does not depend on w (s)
    rho: float  # pooled tokens per second
    s: float  # Stage-0 cost of one more token (s)
    eta: float  # cost of one more distinct (layer, expert) pair (s)
    nbar_all: tuple[float, ...]  # [W + 1]
    nbar_cond: tuple[tuple[float, ...], ...]  # [W + 1][n_max + 1]
    acceptance: AcceptanceModel

    def __post_init__(self) -> None:
        if isinstance(self.draft_len, bool) or not isinstance(self.draft_len, Integral) or self.draft_len < 1:
            raise ValueError(f"PolicyParameters.draft_len must be an integer ≥ 1, got {self.draft_len!r}")
        W = self.draft_len + 1
        if any(isinstance(w, bool) or not isinstance(w, Integral) for w in self.lengths):
            raise ValueError(f"PolicyParameters.lengths must be integers, got {self.lengths!r}")
        if not self.lengths or min(self.lengths) < 2 or max(self.lengths) > W:
            raise ValueError(f"PolicyParameters.lengths {self.lengths} must lie in 2..{W}")
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:])):  # the policies take them in this order
            raise ValueError(f"PolicyParameters.lengths {self.lengths} must be increasing, each length once")
        for name in ("cost", "nbar_all", "nbar_cond"):
            if len(getattr(self, name)) != W + 1:
                raise ValueError(f"PolicyParameters.{name} has {len(getattr(self, name))} entries, expected W+1 = {W + 1}")
        for name in ("fixed_cost", "rho", "s", "eta"):
            _finite(f"PolicyParameters.{name}", (getattr(self, name),))
        _finite("PolicyParameters.cost", self.cost)
        _finite("PolicyParameters.nbar_all", self.nbar_all)
        if not self.nbar_cond[0] or any(len(row) != len(self.nbar_cond[0]) for row in self.nbar_cond):
            raise ValueError("PolicyParameters.nbar_cond must be a table of equal, non-empty rows")
        for row in self.nbar_cond:
            _finite("PolicyParameters.nbar_cond", row)
        if not self.rho > 0:
            raise ValueError(f"PolicyParameters.rho must be > 0, got {self.rho}")
        if len(self.acceptance.iso_x) != self.draft_len:
            raise ValueError(f"AcceptanceModel covers {len(self.acceptance.iso_x)} positions, draft_len is {self.draft_len}")
