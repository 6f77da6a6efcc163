"""Policy parameters: the numbers `nominal` and `hybridspec` decide with (DESIGN A.3, A.5, A.9).

Plain numbers and arrays, validated on construction. The fit command produces them; tests build
them by hand."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
        if len(self.iso_x) != len(self.iso_y):
            raise ValueError("AcceptanceModel: iso_x and iso_y cover different numbers of positions")
        for pos, (x, y) in enumerate(zip(self.iso_x, self.iso_y), start=1):
            if len(x) != len(y) or not x:
                raise ValueError(f"AcceptanceModel: position {pos} has {len(x)} thresholds and {len(y)} values")
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
        W = self.draft_len + 1
        if not self.lengths or min(self.lengths) < 2 or max(self.lengths) > W:
            raise ValueError(f"PolicyParameters.lengths {self.lengths} must lie in 2..{W}")
        for name in ("cost", "nbar_all", "nbar_cond"):
            if len(getattr(self, name)) != W + 1:
                raise ValueError(f"PolicyParameters.{name} has {len(getattr(self, name))} entries, expected W+1 = {W + 1}")
        if not self.rho > 0:
            raise ValueError(f"PolicyParameters.rho must be > 0, got {self.rho}")
        if len(self.acceptance.iso_x) != self.draft_len:
            raise ValueError(f"AcceptanceModel covers {len(self.acceptance.iso_x)} positions, draft_len is {self.draft_len}")
