"""Latency models (DESIGN A.9): quadratic `C_tgt(w)` with the fixed per-round cost split off,
and the slopes `s` (Stage-0 latency per token) and `η` (MoE latency per distinct expert).

Robust to stalls and drift: each fit is ordinary least squares (statsmodels) over the MEDIAN
latency of each distinct x (a "cell": one length w, one u, one expert count), with confidence
intervals and R² of that fit; every cell's count, median and quartiles are kept (`cells_`) so the
spread is reported beside the fit. A slope that is not positive adds a warning; R² is recorded,
and the fit-quality gates of `checks.py` judge it (under the thresholds the fit runs with) and
decide what fails.

Verifying more tokens never takes less time, and C_tgt(w) = L(w) − L(0) (the latency curve L less
the fixed per-round cost a = L(0)) is a cost, never negative. Where the unconstrained quadratic
falls anywhere on [2, W], is not positive at w = 2, or gives C_tgt(w) < 0 for some w in [2, W]
(stalled or noisy timings), the fit is redone by bounded least squares (scipy) over curves that are
non-decreasing on [0, W] and non-negative at w = 2, with a warning. L' ≥ 0 from w = 0 on makes
C_tgt(w) = ∫₀ʷ L' ≥ 0 at every w, so the selector still ranks lengths sensibly and ρ converges.
W is the longest length the selector may choose (`max_length`), which can exceed the longest
measured one (a short capture truncates long verifications): the curve must hold where it is used."""

from __future__ import annotations

import numpy as np
import statsmodels.api as sm
from scipy.optimize import lsq_linear

def _ols(y: np.ndarray, design: np.ndarray):
    """statsmodels OLS; with as many cells as coefficients there is no residual degree of freedom
    and the confidence intervals are undefined (NaN), which the caller reports as a fit warning
    rather than letting numpy print a division by zero."""
    with np.errstate(divide="ignore", invalid="ignore"):
        result = sm.OLS(y, design).fit()
        return result, result.conf_int(0.05)


def _no_dof(name: str, cells: int, coefficients: int) -> list[str]:
    if cells > coefficients:
        return []
    return [f"{name}: {cells} distinct values for {coefficients} coefficients, no residual degree of freedom: "
            "the confidence intervals are undefined (measure more lengths)"]


def median_cells(x: np.ndarray, y: np.ndarray, key: str = "x") -> list[dict]:
    """Per distinct x: {key: x, n, median, q25, q75} of y, sorted by x."""
    out = []
    for value in np.unique(x):
        ys = y[x == value]
        q25, median, q75 = np.percentile(ys, [25, 50, 75])
        out.append({key: float(value), "n": int(len(ys)), "median": float(median), "q25": float(q25),
                    "q75": float(q75)})
    return out


class QuadraticCost:
    """`fit(w [N], latency_s [N])` of the per-length median latency = a + b·w + c·w². Learned:
    `coef_` (a, b, c), `conf_int_` [3, 2] (95 %), `r2_`, `fixed_cost_` (= a), `cells_` (per w: n,
    median, quartiles, seconds), `warnings_`."""

    def fit(self, w: np.ndarray, latency: np.ndarray, max_length: float | None = None) -> "QuadraticCost":
        """`max_length`: the longest w the curve is used for (default: the longest measured)."""
        w, latency = np.asarray(w, float), np.asarray(latency, float)
        if len(np.unique(w)) < 3:
            raise ValueError(f"quadratic cost fit needs at least 3 distinct lengths, got {sorted(set(w.tolist()))}")
        self.cells_ = median_cells(w, latency, key="w")
        w = np.array([c["w"] for c in self.cells_])
        latency = np.array([c["median"] for c in self.cells_])
        result, conf_int = _ols(latency, np.column_stack((np.ones_like(w), w, w * w)))
        self.coef_, self.conf_int_, self.r2_ = result.params, conf_int, float(result.rsquared)
        self.warnings_ = _no_dof("C_tgt fit", len(w), 3)
        hi = max(float(w.max()), float(max_length or 0))
        defect = _defect(self.coef_, 2.0, hi)
        self.constrained_ = defect is not None
        if self.constrained_:
            self.coef_ = _monotone_fit(w, latency, hi)
            residual = np.sum((latency - _curve(self.coef_, w)) ** 2)
            self.r2_ = float(1 - residual / np.sum((latency - latency.mean()) ** 2))
            self.warnings_.append(f"C_tgt fit: the least-squares quadratic {defect}; refitted as non-decreasing "
                                  "from w = 0 (confidence intervals are the unconstrained fit's)")
        self.fixed_cost_ = float(self.coef_[0])
        shortest, longest = self.cost(np.array([2.0, hi]))
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


def _curve(coef, w):
    return coef[0] + coef[1] * w + coef[2] * w * w


def _defect(coef, lo: float, hi: float) -> str | None:
    """How a + b·w + c·w² fails on the used lengths [lo, hi] to be non-decreasing, positive at lo and
    to give C_tgt(w) = b·w + c·w² ≥ 0, or None. The derivative b + 2c·w and C_tgt(w) / w = b + c·w are
    linear in w, so their signs at both ends decide where they are negative."""
    d_lo, d_hi = coef[1] + 2 * coef[2] * lo, coef[1] + 2 * coef[2] * hi
    if d_lo < 0 or d_hi < 0:
        turn = -coef[1] / (2 * coef[2]) if d_lo * d_hi < 0 else None  # where the derivative changes sign
        start, end = (lo, hi) if turn is None else ((turn, hi) if d_hi < 0 else (lo, turn))
        return f"falls on w ∈ [{start:.1f}, {end:.1f}]"
    if _curve(coef, lo) <= 0:
        return f"is not positive at w = {lo:g}"
    negative = [w for w in (lo, hi) if coef[1] + coef[2] * w < 0]
    if negative:
        return f"gives C_tgt({negative[0]:g}) < 0 (it falls below its value at w = 0)"
    return None


def _monotone_fit(w: np.ndarray, latency: np.ndarray, hi: float) -> np.ndarray:
    """(a, b, c) minimising the squared error over quadratics with L'(0) ≥ 0, L'(hi) ≥ 0 (so L' ≥ 0
    on [0, hi], L' being linear) and L(lo) ≥ 0 (lo = 2): written as
    L(w) = p + u·(w − lo) + (v − u)·(w² − lo²) / (2·hi), with p = L(lo), u = L'(0), v = L'(hi) all
    bounded below by 0, that is a bounded linear least squares."""
    lo = 2.0
    span = 2 * hi
    bend = (w * w - lo * lo) / span
    design = np.column_stack((np.ones_like(w), (w - lo) - bend, bend))
    scale = np.abs(design).max(axis=0)
    p, u, v = lsq_linear(design / scale, latency, bounds=(0, np.inf), method="bvls").x / scale
    c = (v - u) / span
    return np.array([p - u * lo - c * lo * lo, u, c])


class Slope:
    """`fit(x [N], y [N])` of the per-x median y = intercept + slope·x. Learned: `slope_`,
    `intercept_`, `conf_int_` (of the slope), `r2_`, `correlation_` (of the raw samples), `cells_`
    (per x: n, median, quartiles), `warnings_`."""

    def __init__(self, *, name: str):
        self.name = name

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Slope":
        x, y = np.asarray(x, float), np.asarray(y, float)
        if len(np.unique(x)) < 2:
            raise ValueError(f"{self.name} fit needs at least 2 distinct x values")
        self.correlation_ = float(np.corrcoef(x, y)[0, 1])
        self.cells_ = median_cells(x, y)
        x = np.array([c["x"] for c in self.cells_])
        y = np.array([c["median"] for c in self.cells_])
        result, conf_int = _ols(y, sm.add_constant(x))
        self.intercept_, self.slope_ = (float(v) for v in result.params)
        self.conf_int_ = tuple(float(v) for v in conf_int[1])
        self.r2_ = float(result.rsquared)
        self.warnings_ = _no_dof(self.name, len(x), 2)
        if self.slope_ <= 0:
            self.warnings_.append(f"{self.name}: slope {self.slope_:.3g} is not positive")
        return self
