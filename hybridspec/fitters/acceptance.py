"""Acceptance model (DESIGN A.9): per-position isotonic calibration of the top-1 confidence, then
a logistic model over [calibrated confidence, position, their product, log(1 + h̄_i),
log(h_i / h̄_{i−1})] for ĉ_i = P(A_D ≥ i | A_D ≥ i − 1).

Training rows: draft position i of every capture round with A_D ≥ i − 1 (truncated rounds are the
caller's to exclude), label 1[A_D ≥ i]. The feature definition is the runtime's
(`runtime/acceptance.py`); a test keeps the two equal."""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

ENTROPY_EPS = 1e-6
MIN_SAMPLES = 20  # a position with fewer usable rows (or one class) keeps the identity calibration


def smoothed_entropy(entropy: np.ndarray) -> np.ndarray:
    """h̄_i = (h_i + h̄_{i−1}) / 2, h̄_0 = h_1.  [N, D] → [N, D]."""
    out = np.empty_like(entropy, dtype=np.float64)
    prev = entropy[:, 0].astype(np.float64)
    for i in range(entropy.shape[1]):
        prev = (entropy[:, i] + prev) / 2
        out[:, i] = prev
    return out


def features(calibrated: np.ndarray, entropy: np.ndarray) -> np.ndarray:
    """[N, D] calibrated confidence and entropy → [N, D, 5]."""
    N, D = entropy.shape
    position = np.broadcast_to(np.arange(1, D + 1, dtype=np.float64), (N, D))
    smooth = smoothed_entropy(entropy)
    previous = np.concatenate((entropy[:, :1], smooth[:, :-1]), axis=1)
    jump = np.log((entropy + ENTROPY_EPS) / (previous + ENTROPY_EPS))
    return np.stack((calibrated, position, calibrated * position, np.log1p(smooth), jump), axis=-1)


def conditional_rows(accepted_full: np.ndarray, draft_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask [N, D] of rows at risk, i.e. A_D ≥ i − 1; labels [N, D] = 1[A_D ≥ i])."""
    i = np.arange(1, draft_len + 1)[None, :]
    a = accepted_full[:, None]
    return a >= i - 1, (a >= i).astype(np.float64)


class AcceptanceFitter:
    """`fit(confidence [N, D], entropy [N, D], accepted_full [N])`; learned: `iso_x_`, `iso_y_`
    (per position thresholds), `coef_` (intercept + 5 weights)."""

    def __init__(self, *, regularization: float = 1e4, min_samples: int = MIN_SAMPLES):
        self.regularization = regularization
        self.min_samples = min_samples

    def fit(self, confidence: np.ndarray, entropy: np.ndarray, accepted_full: np.ndarray) -> "AcceptanceFitter":
        confidence, entropy = np.asarray(confidence, float), np.asarray(entropy, float)
        D = confidence.shape[1]
        mask, labels = conditional_rows(np.asarray(accepted_full), D)
        self.iso_x_, self.iso_y_, self.position_counts_ = [], [], []
        for i in range(D):
            x, y = confidence[mask[:, i], i], labels[mask[:, i], i]
            self.position_counts_.append(int(len(x)))
            if len(x) < self.min_samples or y.min() == y.max():
                self.iso_x_.append(np.array([0.0, 1.0]))
                self.iso_y_.append(np.array([0.0, 1.0]))
                continue
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)
            self.iso_x_.append(np.asarray(iso.X_thresholds_, float))
            self.iso_y_.append(np.asarray(iso.y_thresholds_, float))
        X = features(self.calibrate(confidence), entropy)[mask]  # [rows, 5]
        model = LogisticRegression(C=self.regularization, max_iter=5000).fit(X, labels[mask])
        self.coef_ = np.concatenate((model.intercept_, model.coef_[0]))
        return self

    def _check(self) -> None:
        if not hasattr(self, "coef_"):
            raise RuntimeError("AcceptanceFitter is not fitted; call fit() first")

    def calibrate(self, confidence: np.ndarray) -> np.ndarray:
        """Isotonic-only estimate of ĉ_i: [N, D] → [N, D]."""
        if not hasattr(self, "iso_x_"):
            raise RuntimeError("AcceptanceFitter is not fitted; call fit() first")
        return np.stack([np.interp(confidence[:, i], self.iso_x_[i], self.iso_y_[i])
                         for i in range(confidence.shape[1])], axis=1)

    def predict_conditional(self, confidence: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """ĉ_i of the full model: [N, D] → [N, D]."""
        self._check()
        z = self.coef_[0] + features(self.calibrate(np.asarray(confidence, float)), np.asarray(entropy, float)) @ self.coef_[1:]
        return 1.0 / (1.0 + np.exp(-z))

    def predict_prefix(self, confidence: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """p̂_i = Π_{j≤i} ĉ_j  [N, D]."""
        return np.cumprod(self.predict_conditional(confidence, entropy), axis=1)


def calibration_metrics(prob: np.ndarray, label: np.ndarray, bins: int = 10) -> dict:
    """Log-loss, Brier score and expected calibration error (equal-width bins) of probabilities."""
    p = np.clip(prob, 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(label * np.log(p) + (1 - label) * np.log(1 - p)))
    brier = float(np.mean((prob - label) ** 2))
    edges = np.minimum((prob * bins).astype(int), bins - 1)
    ece = sum(abs(prob[edges == b].mean() - label[edges == b].mean()) * (edges == b).mean()
              for b in range(bins) if (edges == b).any())
    return {"log_loss": logloss, "brier": brier, "ece": float(ece), "rows": int(len(label))}


def held_out_report(fitter: AcceptanceFitter, confidence, entropy, accepted_full) -> dict:
    """Metrics of raw confidence, isotonic only and the full model on held-out rounds."""
    confidence, entropy = np.asarray(confidence, float), np.asarray(entropy, float)
    mask, labels = conditional_rows(np.asarray(accepted_full), confidence.shape[1])
    y = labels[mask]
    return {"raw": calibration_metrics(confidence[mask], y),
            "isotonic": calibration_metrics(fitter.calibrate(confidence)[mask], y),
            "full": calibration_metrics(fitter.predict_conditional(confidence, entropy)[mask], y)}
