"""Sections 1–2: reliability of the acceptance estimates and acceptance by position and category,
from the capture rounds (DESIGN A.9: rounds cut short by EOS or the output limit excluded).

Reliability rows are the fit's training rows: draft position i of every round at risk
(A_D ≥ i − 1), label 1[A_D ≥ i]; the estimates are the raw confidence conf_i, the isotonic
calibration alone and the full logistic model ĉ_i, all from the artifact's arrays."""

from __future__ import annotations

import numpy as np
import polars as pl
from statsmodels.stats.proportion import proportion_confint

from ..artifacts.params import AcceptanceModel
from ..fitters.acceptance import MIN_SAMPLES, AcceptanceFitter, calibration_metrics, conditional_rows
from . import plots
from .inputs import CaptureRounds, ReportInputs, capture_rounds
from .result import Figure, Section

BINS = 10
ESTIMATES = ("raw", "isotonic", "full")


def fitter_from(model: AcceptanceModel) -> AcceptanceFitter:
    """The fitter whose learned arrays are the artifact's (so predictions are the fit's own)."""
    fitter = AcceptanceFitter()
    fitter.iso_x_ = [np.asarray(x, float) for x in model.iso_x]
    fitter.iso_y_ = [np.asarray(y, float) for y in model.iso_y]
    fitter.coef_ = np.asarray(model.coef, float)
    return fitter


def estimates(rounds: CaptureRounds, model: AcceptanceModel | None) -> dict[str, np.ndarray]:
    """Estimate name → [N, D] probabilities of A_D ≥ i given A_D ≥ i − 1."""
    out = {"raw": rounds.confidence}
    if model is not None:
        fitter = fitter_from(model)
        out["isotonic"] = fitter.calibrate(rounds.confidence)
        out["full"] = fitter.predict_conditional(rounds.confidence, rounds.entropy)
    return out


def _bins(prob: np.ndarray, label: np.ndarray) -> list[dict]:
    """Per equal-width bin (as calibration_metrics): rows, accepted, mean prediction, observed rate and
    its 95 % Wilson binomial interval."""
    edges = np.minimum((prob * BINS).astype(int), BINS - 1)
    out = []
    for b in range(BINS):
        here = edges == b
        if not here.any():
            continue
        rows, accepted = int(here.sum()), int(label[here].sum())
        observed = accepted / rows
        low, high = proportion_confint(accepted, rows, alpha=0.05, method="wilson")
        out.append({"bin": b, "rows": rows, "accepted": accepted, "mean_predicted": float(prob[here].mean()),
                    "observed": observed, "ci_low": min(float(low), observed),  # rounding at 0 and 1
                    "ci_high": max(float(high), observed)})
    return out


def _no_capture_rounds(inputs: ReportInputs) -> str:
    return (inputs.missing_pass("capture") if inputs.run_id("capture") is None else
            "the capture run has no untruncated, fully verified rounds")


def reliability_section(inputs: ReportInputs) -> Section:
    section = Section("reliability", "1. Reliability of the acceptance estimates per draft position")
    rounds = capture_rounds(inputs)
    if rounds is None:
        return section.missing(_no_capture_rounds(inputs))
    mask, split = rounds.held_out()
    probs = estimates(rounds, inputs.params.acceptance if inputs.params else None)
    at_risk, labels = conditional_rows(rounds.accepted_full, rounds.draft_len)
    bins, positions = [], []
    for i in range(rounds.draft_len):
        rows = mask & at_risk[:, i]
        y = labels[rows, i]
        entry = {"position": i + 1, "rows": int(rows.sum()), "accepted": int(y.sum()),
                 "observed": float(y.mean()) if len(y) else None, "too_few": bool(rows.sum() < MIN_SAMPLES)}
        for name, prob in probs.items():
            p = prob[rows, i]
            entry[f"mean_{name}"] = float(p.mean()) if len(p) else None
            entry[f"ece_{name}"] = calibration_metrics(p, y, BINS)["ece"] if len(p) else None
            bins += [{"position": i + 1, "estimate": name, **b} for b in _bins(p, y)]
        positions.append(entry)
    y_all = labels[mask[:, None] & at_risk]
    stored = (inputs.meta or {}).get("diagnostics", {}).get("acceptance", {})
    metrics = [{"estimate": name, **calibration_metrics(prob[mask[:, None] & at_risk], y_all, BINS),
                "fit_log_loss": stored.get(name, {}).get("log_loss")} for name, prob in probs.items()]
    section.tables = {"positions": pl.DataFrame(positions), "bins": pl.DataFrame(bins),
                      "metrics": pl.DataFrame(metrics)}
    section.values = {"split": split, "min_rows": MIN_SAMPLES, "rows": int(len(y_all))}
    section.note = (f"{split}; {len(y_all)} at-risk rows (A_D ≥ i − 1); positions with fewer than "
                    f"{MIN_SAMPLES} rows are marked “too few”")
    chosen = (inputs.meta or {}).get("diagnostics", {}).get("acceptance_model") or {}
    cv = chosen.get("cv_log_loss")
    if cv:  # the fit chose the isotonic stage by cross-validation over prompts
        kept = "kept" if chosen.get("isotonic") else "replaced by the identity"
        section.note += (f"; isotonic stage {kept} by {cv['folds']}-fold cross-validation over prompts "
                         f"(log-loss {cv['isotonic']:.3f} with it, {cv['identity']:.3f} without)")
        section.values["cv_log_loss"] = cv
    if inputs.params is None:
        section.partial(inputs.missing_artifact("the isotonic and full-model curves"))
    section.figures = [Figure("Observed acceptance rate against the predicted probability, per draft position "
                              "(diagonal: perfect calibration)",
                              plots.reliability(section.tables["bins"], section.tables["positions"], list(probs)))]
    full = next((m for m in metrics if m["estimate"] == "full"), metrics[0])
    section.headline = (f"{full['estimate']}: log-loss {full['log_loss']:.3f}, ECE {full['ece']:.3f} "
                        f"on {full['rows']} rows")
    return section


def acceptance_section(inputs: ReportInputs) -> Section:
    section = Section("acceptance", "2. Acceptance by draft position and category")
    rounds = capture_rounds(inputs)
    if rounds is None:
        return section.missing(_no_capture_rounds(inputs))
    rows = []
    for category in [*sorted(set(rounds.category.tolist())), "all"]:
        a_d = rounds.accepted_full if category == "all" else rounds.accepted_full[rounds.category == category]
        rows += [{"category": category, "position": i, "rounds": len(a_d), "p_accept": float((a_d >= i).mean())}
                 for i in range(1, rounds.draft_len + 1)]
    al = inputs.frame(  # AL = emitted / rounds of the capture run, i.e. under `full` (DESIGN A.10)
        "SELECT p.category, count(*) AS rounds, sum(r.emitted) AS emitted, sum(r.emitted) / count(*) AS al "
        "FROM rounds r JOIN prompts p USING (run_id, prompt_id) WHERE r.run_id = ? GROUP BY p.category "
        "ORDER BY p.category", [inputs.run_id("capture")])
    total = al.select(pl.lit("all").alias("category"), pl.col("rounds").sum(), pl.col("emitted").sum())
    al = pl.concat([al, total.with_columns(al=pl.col("emitted") / pl.col("rounds"))], how="vertical_relaxed")
    section.tables = {"by_position": pl.DataFrame(rows), "al_full": al}
    section.note = ("P(A_D ≥ i) over untruncated capture rounds (every draft token verified); AL under `full` = "
                    "emitted tokens / rounds over all capture rounds")
    section.figures = [Figure("P(A_D ≥ i) per draft position and category; acceptance length under `full`",
                              plots.acceptance(section.tables["by_position"], al))]
    overall = al.filter(pl.col("category") == "all")
    section.headline = f"AL under full {overall['al'][0]:.2f} over {overall['rounds'][0]} rounds"
    return section
