"""Acceptance model (DESIGN A.9): per-position isotonic calibration of the top-1 confidence, then
a logistic model over [calibrated confidence, position, their product, log(1 + h̄_i),
log(h_i / h̄_{i−1})] for ĉ_i = P(A_D ≥ i | A_D ≥ i − 1).

Training rows: draft position i of every capture round with A_D ≥ i − 1 (truncated rounds are the
caller's to exclude), label 1[A_D ≥ i]. The feature definition is the runtime's
(`runtime/acceptance.py`); a test keeps the two equal.

The isotonic stage is a step function fitted per position; on a small capture its steps reach 0 or
1 where a few rounds happen to agree, and the model is then confidently wrong on new prompts. With
`isotonic="auto"` the fitter keeps the stage only where it helps: a cross-validation over prompts
(grouped K-fold) compares the model with and without it (the identity calibration in the same
artifact layout) and the lower mean held-out log-loss wins (`isotonic_used_`, `cv_log_loss_`)."""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from ..artifacts.params import ENTROPY_EPS

MIN_SAMPLES = 20  # a position with fewer usable rows (or one class) keeps the identity calibration
CV_FOLDS = 5


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
    """`fit(confidence [N, D], entropy [N, D], accepted_full [N], groups=None)`; learned: `iso_x_`,
    `iso_y_` (per position thresholds), `coef_` (intercept + 5 weights), `isotonic_used_`,
    `cv_log_loss_` ({"isotonic", "identity", "folds"} when the stage was chosen by cross-validation),
    `single_class_` (every conditional outcome the same, e.g. a random drafter that is never accepted:
    then a constant model at the smoothed rate (k + ½) / (n + 1), and the `acceptance_two_classes`
    check fails).

    `isotonic`: True (always the isotonic stage), False (identity calibration) or "auto" (chosen by
    grouped K-fold over `groups`, one id per round, e.g. its prompt; rounds themselves without)."""

    def __init__(self, *, regularization: float = 1e4, min_samples: int = MIN_SAMPLES,
                 isotonic: bool | str = True, folds: int = CV_FOLDS):
        if isotonic not in (True, False, "auto"):
            raise ValueError(f"isotonic must be True, False or 'auto', got {isotonic!r}")
        self.regularization = regularization
        self.min_samples = min_samples
        self.isotonic = isotonic
        self.folds = folds

    def fit(self, confidence: np.ndarray, entropy: np.ndarray, accepted_full: np.ndarray,
            groups: np.ndarray | None = None) -> "AcceptanceFitter":
        confidence, entropy = np.asarray(confidence, float), np.asarray(entropy, float)
        accepted_full = np.asarray(accepted_full)
        use, self.cv_log_loss_ = self.isotonic, None
        if use == "auto":
            self.cv_log_loss_ = self._cross_validate(confidence, entropy, accepted_full, groups)
            scores = self.cv_log_loss_
            use = scores is None or scores["isotonic"] <= scores["identity"]
        self.isotonic_used_ = bool(use)
        return self._fit(confidence, entropy, accepted_full, isotonic=self.isotonic_used_)

    def _cross_validate(self, confidence, entropy, accepted_full, groups) -> dict | None:
        """Mean held-out log-loss of the model with and without the isotonic stage over grouped
        folds (None with fewer than two groups: nothing to hold out)."""
        from sklearn.model_selection import GroupKFold

        groups = np.arange(len(accepted_full)) if groups is None else np.asarray(groups)
        k = min(self.folds, len(np.unique(groups)))
        if k < 2:
            return None
        losses = {"isotonic": [], "identity": []}
        for train, test in GroupKFold(n_splits=k).split(confidence, groups=groups):
            mask, labels = conditional_rows(accepted_full[test], confidence.shape[1])
            if not mask.any():
                continue
            for name, iso in (("isotonic", True), ("identity", False)):
                model = AcceptanceFitter(regularization=self.regularization, min_samples=self.min_samples)
                model._fit(confidence[train], entropy[train], accepted_full[train], isotonic=iso)
                prob = model.predict_conditional(confidence[test], entropy[test])[mask]
                losses[name].append((calibration_metrics(prob, labels[mask])["log_loss"], int(mask.sum())))
        if not losses["isotonic"]:
            return None
        mean = {name: float(sum(l * n for l, n in v) / sum(n for _, n in v)) for name, v in losses.items()}
        return {**mean, "folds": k}

    def _fit(self, confidence, entropy, accepted_full, *, isotonic: bool) -> "AcceptanceFitter":
        D = confidence.shape[1]
        mask, labels = conditional_rows(accepted_full, D)
        self.iso_x_, self.iso_y_, self.position_counts_ = [], [], []
        for i in range(D):
            x, y = confidence[mask[:, i], i], labels[mask[:, i], i]
            self.position_counts_.append(int(len(x)))
            if not isotonic or len(x) < self.min_samples or y.min() == y.max():
                self.iso_x_.append(np.array([0.0, 1.0]))
                self.iso_y_.append(np.array([0.0, 1.0]))
                continue
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)
            self.iso_x_.append(np.asarray(iso.X_thresholds_, float))
            self.iso_y_.append(np.asarray(iso.y_thresholds_, float))
        X = features(self.calibrate(confidence), entropy)[mask]  # [rows, 5]
        y = labels[mask]
        self.single_class_ = bool(len(y) == 0 or y.min() == y.max())
        if self.single_class_:  # e.g. a random drafter: nothing ever accepted; a constant, smoothed rate
            rate = (y.sum() + 0.5) / (len(y) + 1.0)
            self.coef_ = np.array([np.log(rate / (1 - rate)), 0.0, 0.0, 0.0, 0.0, 0.0])
            return self
        model = LogisticRegression(C=self.regularization, max_iter=5000).fit(X, y)
        self.coef_ = np.concatenate((model.intercept_, model.coef_[0]))
        return self

    @classmethod
    def from_model(cls, model) -> "AcceptanceFitter":
        """The fitted state of a frozen `artifacts.params.AcceptanceModel` (to predict with it)."""
        fitter = cls()
        fitter.iso_x_ = [np.asarray(x, float) for x in model.iso_x]
        fitter.iso_y_ = [np.asarray(y, float) for y in model.iso_y]
        fitter.coef_ = np.asarray(model.coef, float)
        return fitter

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


def row_log_loss(prob: np.ndarray, label: np.ndarray) -> np.ndarray:
    p = np.clip(prob, 1e-7, 1 - 1e-7)
    return -(label * np.log(p) + (1 - label) * np.log(1 - p))


def held_out_report(fitter: AcceptanceFitter, confidence, entropy, accepted_full) -> dict:
    """Metrics of raw confidence, isotonic only and the full model on held-out rounds, and the
    paired per-row log-loss difference full − raw (`full_vs_raw`: mean, standard error, rows), so a
    gate can tell a worse model from the noise of a small held-out set."""
    confidence, entropy = np.asarray(confidence, float), np.asarray(entropy, float)
    mask, labels = conditional_rows(np.asarray(accepted_full), confidence.shape[1])
    y = labels[mask]
    full = fitter.predict_conditional(confidence, entropy)[mask]
    diff = row_log_loss(full, y) - row_log_loss(confidence[mask], y)
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
    return {"raw": calibration_metrics(confidence[mask], y),
            "isotonic": calibration_metrics(fitter.calibrate(confidence)[mask], y),
            "full": calibration_metrics(full, y),
            "full_vs_raw": {"mean": float(diff.mean()) if len(diff) else None, "se": se,
                            "rows": int(len(diff))}}
