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
