"""Report badges from the fit-quality checks, on synthetic stores (no model): a good campaign is `ok`
everywhere its fit is judged; pure-noise timings make the cost, Stage-0 and MoE sections `poor fit`
with the failed check first, and the page's and the terminal's summary list every failed check.
Reliability bins carry their row counts and a binomial interval."""

from __future__ import annotations

from html import unescape

import pytest
from rich.console import Console

from hybridspec.fitters.export import fit_artifact
from hybridspec.report import build_report, summary
from tests.fitters.test_campaign import write_synthetic_store


def _report(tmp_path, noise: bool):
    db = tmp_path / "s.duckdb"

    write_synthetic_store(db, n_rounds=500, noise=noise)
    fit_artifact(db, "synth", tmp_path / "a.safetensors", allow_poor_fit=True)
    return build_report(db, tmp_path / "page", artifact=tmp_path / "a.safetensors")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("good"), noise=False)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("noise"), noise=True)


def _terminal(result) -> str:
    console = Console(record=True, width=250)
    console.print(summary(result))
    return console.export_text()


def test_a_good_fit_is_ok_everywhere_it_is_judged(good):
    result = good
    assert result.checks and not result.failed_checks
    for key in ("reliability", "cost", "stage0", "moe", "dinkelbach"):
        assert result.section(key).status == "ok", (key, result.section(key).note)
    assert "No fit-quality check failed" in result.path.read_text()
    assert "no fit-quality check failed" in _terminal(result)


def test_noise_timings_are_poor_fit_with_the_failed_check_first(noise):
    result = noise
    failed = {c.name: c for c in result.failed_checks}
    assert {"cost_r2", "cost_monotone", "s_r2", "eta_r2"} <= set(failed)
    html = unescape(result.path.read_text())
    assert f"{len(failed)} fit-quality check(s) failed" in html
    for key in ("cost", "stage0", "moe"):
        section = result.section(key)
        assert section.status == "poor fit" and section.failed_checks
        heading = html.index(f'<h2 id="{key}">')
        first = html.index('<p class="failed">', heading)
        assert first < html.index("<figure>", heading)  # shown before the plot and the numbers
        assert section.failed_checks[0] in html[first:html.index("</p>", first)]
    text = _terminal(result)
    assert all(c.line() in text for c in failed.values()) and "poor fit" in text


def test_reliability_bins_have_counts_and_wilson_intervals(good):
    bins = good.section("reliability").tables["bins"]
    assert {"rows", "accepted", "ci_low", "ci_high"} <= set(bins.columns)
    for row in bins.iter_rows(named=True):
        assert row["observed"] == pytest.approx(row["accepted"] / row["rows"])
        assert 0 <= row["ci_low"] <= row["observed"] <= row["ci_high"] <= 1
        assert row["ci_low"] < row["ci_high"]


# ---------------------------------------------------------------- an artifact of another model
FIT_KEYS = ("reliability", "cost", "stage0", "moe", "routing", "dinkelbach", "policies")  # draw the artifact


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """(report without --force, report with --force, the mismatch as worded) of the good synthetic
    campaign, its own fit re-saved as fitted for another model."""
    from hybridspec.artifacts.artifact import load_artifact, save_artifact

    root = tmp_path_factory.mktemp("foreign")
    db, own, other = root / "s.duckdb", root / "a.safetensors", root / "other.safetensors"
    write_synthetic_store(db, n_rounds=500)
    fit_artifact(db, "synth", own, allow_poor_fit=True)
    params, meta = load_artifact(own)
    save_artifact(other, params, model_id="sha256:another", drafter_id=meta["drafter_id"], device=meta["device"],
                  store_digest=meta["store_digest"], diagnostics=meta["diagnostics"])
    mismatch = f"was fitted for model sha256:another, but this model is {meta['model_id']}"
    return (build_report(db, root / "refused", artifact=other),
            build_report(db, root / "forced", artifact=other, force=True), mismatch)


def _flat(text: str) -> str:
    return " ".join(text.split())  # the terminal wraps long lines


def test_another_models_artifact_is_named_and_never_ok(foreign):
    refused, _, mismatch = foreign
    assert not refused.checks  # they would judge another model's fit
    for key in FIT_KEYS:
        section = refused.section(key)
        assert section.status != "ok" and mismatch in section.note and "--force" in section.note, (key, section.note)
    assert "fit_ms" not in refused.section("cost").tables["per_length"].columns  # its fit is not drawn
    assert "slope_us" not in refused.section("stage0").values and "nbar_all" not in refused.section("routing").tables
    assert {"raw"} == set(refused.section("reliability").tables["metrics"]["estimate"])
    html, text = _flat(unescape(refused.path.read_text())), _flat(_terminal(refused))
    for shown in (html, text):  # both summaries name both ids and never say the checks passed
        assert mismatch in shown and "no fit-quality check failed" not in shown.lower()
        assert "no artifact" not in shown.lower()
    assert html.count('class="badge ok"') == 1  # only section 2, which reads the store alone
    assert mismatch in refused.section("metadata").note  # its metadata is still listed
    assert "artifact" in refused.section("metadata").tables


def test_force_shows_another_models_fit_with_a_note(foreign):
    refused, forced, mismatch = foreign
    assert forced.checks and forced.other_model != refused.other_model
    for key in FIT_KEYS:
        section = forced.section(key)
        assert section.status != "ok" and mismatch in section.note and "--force" in section.note, (key, section.note)
    assert "fit_ms" in forced.section("cost").tables["per_length"].columns  # its fit is drawn
    assert {"raw", "isotonic", "full"} == set(forced.section("reliability").tables["metrics"]["estimate"])
    html, text = _flat(unescape(forced.path.read_text())), _flat(_terminal(forced))
    for shown in (html, text):
        assert forced.other_model in shown and "no fit-quality check failed" in shown.lower()
