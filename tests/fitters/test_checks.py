"""Fit-quality checks: a good synthetic campaign passes every check; pure-noise timings fail the
cost, s and η checks by name; a calibrated model worse than raw confidence fails; thresholds parse."""

from __future__ import annotations

import numpy as np
import pytest

from hybridspec.fitters.checks import FAILED, OK, UNKNOWN, Thresholds, failed, quality_checks
from hybridspec.fitters.export import PoorFitError, fit_artifact
from tests.fitters.test_campaign import write_synthetic_store

W = tuple(range(2, 17))
COST = [0.0, 0.0] + [1e-4 * w for w in W]


def _checks(**diagnostics):
    base = {"cost": {"r2": 0.99, "cells": [{"w": w, "median": 1e-4 * w} for w in W]}, "s": {"r2": 0.9},
            "eta": {"r2": 0.9}, "acceptance": {"raw": {"log_loss": 0.5}, "full": {"log_loss": 0.4}},
            "dinkelbach": [{"rho": 1.0, "next_rho": 1.0}], "dinkelbach_converged": True,
            "acceptance_model": {"single_class": False}}
    return {c.name: c for c in quality_checks(cost=COST, lengths=W, s=1e-6, eta=1e-6,
                                              diagnostics={**base, **diagnostics}, thresholds=Thresholds())}


def test_each_check_reads_its_number():
    assert {c.status for c in _checks().values()} == {OK}
    worse = _checks(acceptance={"raw": {"log_loss": 0.484}, "full": {"log_loss": 0.563}})["acceptance_log_loss"]
    assert worse.status == FAILED and "0.563" in worse.line() and "0.484" in worse.line()
    # with the paired difference recorded: a small held-out set's noise passes, a real loss still fails
    noisy = {"raw": {"log_loss": 0.484}, "full": {"log_loss": 0.528}, "full_vs_raw": {"mean": 0.044, "se": 0.028, "rows": 123}}
    assert _checks(acceptance=noisy)["acceptance_log_loss"].status == OK
    real = {"raw": {"log_loss": 0.484}, "full": {"log_loss": 0.563}, "full_vs_raw": {"mean": 0.079, "se": 0.02, "rows": 900}}
    check = _checks(acceptance=real)["acceptance_log_loss"]
    assert check.status == FAILED and "2 × 0.020" in check.line() and "900 held-out rows" in check.line()
    falling = _checks(cost={"r2": 0.99, "cells": [{"w": w, "median": 1.0 / w} for w in W]})["cost_monotone"]
    assert falling.status == FAILED and falling.value == pytest.approx(-1.0)
    assert _checks(cost={"r2": 0.044})["cost_r2"].status == FAILED
    assert _checks(cost={"r2": 0.99})["cost_monotone"].status == UNKNOWN  # an artifact without the cells
    assert _checks(dinkelbach_converged=False)["rho_converged"].status == FAILED
    assert _checks(acceptance_model={"single_class": True})["acceptance_two_classes"].status == FAILED
    assert _checks(acceptance_model={})["acceptance_two_classes"].status == UNKNOWN  # fitted before it was recorded
    zero = quality_checks(cost=[0.0] * 17, lengths=W, s=-5.1e-6, eta=1e-6, diagnostics={}, thresholds=Thresholds())
    assert {c.name for c in failed(zero)} == {"cost_positive", "s_positive"}


def test_thresholds_parse_and_refuse_nonsense():
    assert Thresholds.parse(["cost_r2=0.5"], base={"s_r2": 0.1}) == Thresholds(cost_r2=0.5, s_r2=0.1)
    for bad, message in (("nope=1", "NAME one of"), ("cost_r2", "NAME=VALUE"), ("cost_r2=x", "not a number"),
                         ("cost_r2=2", "outside")):
        with pytest.raises(ValueError, match=message):
            Thresholds.parse([bad])


def test_a_good_synthetic_campaign_passes_every_check(tmp_path):
    write_synthetic_store(tmp_path / "s.duckdb", n_rounds=1000)
    fit, meta = fit_artifact(tmp_path / "s.duckdb", "synth", tmp_path / "a.safetensors", allow_poor_fit=False)
    assert [c.name for c in fit.checks if c.status != OK] == []
    diagnostics = meta["diagnostics"]
    assert diagnostics["allow_poor_fit"] is False and len(diagnostics["checks"]) == len(fit.checks)
    assert {"numpy", "scipy", "scikit-learn", "statsmodels", "duckdb", "polars"} <= set(diagnostics["versions"])


def test_pure_noise_timings_fail_by_name_and_nothing_is_written(tmp_path):
    write_synthetic_store(tmp_path / "s.duckdb", n_rounds=500, noise=True)
    out = tmp_path / "a.safetensors"
    with pytest.raises(PoorFitError) as caught:
        fit_artifact(tmp_path / "s.duckdb", "synth", out, allow_poor_fit=False)
    names = {c.name for c in failed(caught.value.checks)}
    assert {"cost_r2", "cost_monotone", "s_r2", "eta_r2"} <= names
    assert "cost_r2: R² of the C_tgt quadratic" in str(caught.value) and "(needs ≥ 0.8)" in str(caught.value)
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
    fit, meta = fit_artifact(tmp_path / "s.duckdb", "synth", out, allow_poor_fit=True)  # written, and recorded
    assert out.is_file() and meta["diagnostics"]["allow_poor_fit"] is True
    assert {c["name"] for c in meta["diagnostics"]["checks"] if c["status"] == FAILED} == names
    assert np.isfinite(meta["rho"])


def test_a_drafter_never_accepted_gives_a_constant_model_and_a_failed_check():
    """Every conditional outcome 0 (a random drafter): the fitter does not stop at the one-class
    logistic regression; it keeps the smoothed rate (k + ½) / (n + 1) at every position."""
    from hybridspec.fitters.acceptance import AcceptanceFitter

    rng = np.random.default_rng(0)
    conf, ent = rng.uniform(size=(40, 15)), rng.uniform(size=(40, 15))
    fitter = AcceptanceFitter(isotonic="auto").fit(conf, ent, np.zeros(40, dtype=int), groups=np.arange(40) % 5)
    assert fitter.single_class_
    np.testing.assert_allclose(fitter.predict_conditional(conf, ent), 0.5 / 41)


def test_the_checks_table_shows_a_verdict_without_a_number():
    """A check that has a verdict but no number (both outcomes seen) shows its detail, not "not
    recorded"; one without a verdict shows "not recorded"."""
    from rich.console import Console

    from hybridspec.fitters.fit_output import checks_table

    def row(**diagnostics) -> str:
        console = Console(width=300, record=True)
        console.print(checks_table([_checks(**diagnostics)["acceptance_two_classes"]]))
        return console.export_text()

    assert "both seen" in row() and "not recorded" not in row()
    assert "not recorded" in row(acceptance_model={})


def test_an_artifact_path_that_is_the_store_itself_is_refused_and_the_store_kept(tmp_path):
    """`fit --out` naming the `--db` store (directly or through a link) would replace the calibration
    data with the artifact: refused before fitting, the store unchanged."""
    from hybridspec.workbench.paths import OutputPathError

    db = tmp_path / "s.duckdb"
    write_synthetic_store(db, n_rounds=200)
    (tmp_path / "link.duckdb").symlink_to(db)
    before = db.read_bytes()
    for out in (db, tmp_path / "link.duckdb", tmp_path / "." / "s.duckdb"):
        with pytest.raises(OutputPathError, match="is the store being fitted"):
            fit_artifact(db, "synth", out, allow_poor_fit=True)
    assert db.read_bytes() == before


@pytest.mark.parametrize("diagnostics", [
    {"acceptance": 5, "dinkelbach": 7, "s": None, "eta": [], "acceptance_model": []},
    {"acceptance": {"full": 3, "raw": {"log_loss": "x"}, "full_vs_raw": []}, "cost": {"cells": "x", "r2": "y"}},
    {"dinkelbach": [{"rho": "a"}], "dinkelbach_converged": None, "cost": {"cells": [{"w": 2}, {"median": 1}, 3]}},
    {"dinkelbach": [1, 2], "dinkelbach_converged": "yes", "acceptance_model": {"single_class": "no"}},
])
def test_diagnostics_in_another_shape_leave_their_checks_unknown(diagnostics):
    """An artifact's diagnostics edited by hand (its hash recomputed): a section that is not of the shape
    the fit writes is a number not recorded, so its check is `unknown`, never an exception."""
    checks = {c.name: c for c in quality_checks(cost=COST, lengths=W, s=1e-6, eta=1e-6, diagnostics=diagnostics,
                                                thresholds=Thresholds())}
    for name in ("cost_monotone", "cost_r2", "s_r2", "eta_r2", "acceptance_log_loss", "acceptance_two_classes",
                 "rho_converged"):
        assert checks[name].status == UNKNOWN, name
    assert {checks[name].status for name in ("cost_positive", "s_positive", "eta_positive")} == {OK}
