"""Latency models (DESIGN A.9): quadratic `C_tgt(w)` with the fixed per-round cost split off,
and the slopes `s` (Stage-0 latency per token) and `η` (MoE latency per distinct expert).

All by ordinary least squares (statsmodels), with confidence intervals and R²; a fit with
R² < 0.9 or a slope that is not positive adds a warning."""

from __future__ import annotations

import numpy as np
import statsmodels.api as sm

MIN_R2 = 0.9


class QuadraticCost:
    """`fit(w [N], latency_s [N])` of latency = a + b·w + c·w². Learned: `coef_` (a, b, c),
    `conf_int_` [3, 2] (95 %), `r2_`, `fixed_cost_` (= a), `warnings_`."""

    def fit(self, w: np.ndarray, latency: np.ndarray) -> "QuadraticCost":
        w, latency = np.asarray(w, float), np.asarray(latency, float)
        if len(np.unique(w)) < 3:
            raise ValueError(f"quadratic cost fit needs at least 3 distinct lengths, got {sorted(set(w.tolist()))}")
        result = sm.OLS(latency, np.column_stack((np.ones_like(w), w, w * w))).fit()
        self.coef_, self.conf_int_, self.r2_ = result.params, result.conf_int(0.05), float(result.rsquared)
        self.fixed_cost_ = float(self.coef_[0])
        self.warnings_ = []
        if self.r2_ < MIN_R2:
            self.warnings_.append(f"C_tgt fit: R² = {self.r2_:.3f} < {MIN_R2}")
        shortest, longest = self.cost(np.array([2.0, w.max()]))
        if longest <= shortest:
            self.warnings_.append("C_tgt fit: latency does not grow with the verification length")
        return self

    def cost(self, w: np.ndarray) -> np.ndarray:
        """C_tgt(w) = b·w + c·w² (the w-dependent part), seconds."""
        if not hasattr(self, "coef_"):
            raise RuntimeError("QuadraticCost is not fitted; call fit() first")
        w = np.asarray(w, float)
        return self.coef_[1] * w + self.coef_[2] * w * w

    def table(self, max_length: int) -> np.ndarray:
        """[W + 1] with C_tgt(w) at index w (0 for w < 2)."""
        out = self.cost(np.arange(max_length + 1))
        out[:2] = 0.0
        return out


class Slope:
    """`fit(x [N], y [N])` of y = intercept + slope·x. Learned: `slope_`, `intercept_`,
    `conf_int_` (of the slope), `r2_`, `correlation_`, `warnings_`."""

    def __init__(self, *, name: str):
        self.name = name

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Slope":
        x, y = np.asarray(x, float), np.asarray(y, float)
        if len(np.unique(x)) < 2:
            raise ValueError(f"{self.name} fit needs at least 2 distinct x values")
        result = sm.OLS(y, sm.add_constant(x)).fit()
        self.intercept_, self.slope_ = (float(v) for v in result.params)
        self.conf_int_ = tuple(float(v) for v in result.conf_int(0.05)[1])
        self.r2_ = float(result.rsquared)
        self.correlation_ = float(np.corrcoef(x, y)[0, 1])
        self.warnings_ = []
        if self.slope_ <= 0:
            self.warnings_.append(f"{self.name}: slope {self.slope_:.3g} is not positive")
        if self.r2_ < MIN_R2:
            self.warnings_.append(f"{self.name}: R² = {self.r2_:.3f} < {MIN_R2}")
        return self
