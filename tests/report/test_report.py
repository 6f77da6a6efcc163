"""`build_report` on a real quick campaign: every section is there, its numbers equal a direct
recomputation from the store and the artifact, the page embeds one valid PNG per plot and
nothing external, and a store lacking passes names what is missing; the `hybridspec report` CLI
adapter writes the page and prints the summary and where it is (in this file: the calibrated
campaign of `conftest.py` is built once per test run)."""

from __future__ import annotations

import base64
import io
import json
import re
from html import unescape

import numpy as np
import pytest
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import load_artifact
from hybridspec.cli import app
from hybridspec.report import ReportError, build_report, summary
from hybridspec.workbench.store import Store, run_id_for
from tests.report.conftest import CAMPAIGN, POLICIES

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(calibrated):
    with Store(calibrated[0], read_only=True) as s:
        yield s


def _run(name: str) -> str:
    return run_id_for(CAMPAIGN, name)


def test_every_section_is_present_with_a_badge_from_the_checks(report):
    status = {s.key: s.status for s in report.sections}
    assert list(status) == ["reliability", "acceptance", "cost", "stage0", "moe", "routing", "dinkelbach",
                            "lengths", "profile", "policies", "metadata"]
    failed = {c.section for c in report.failed_checks}  # a tiny quick campaign may fit poorly (fit --allow-poor-fit)
    for key, value in status.items():
        assert value == ("poor fit" if key in failed else "ok"), (key, report.section(key).note)
    assert report.campaign == CAMPAIGN and report.path.name == "index.html"


def test_reliability_uses_the_fits_held_out_rows(report, calibrated, store):
    section = report.section("reliability")
    _, meta = load_artifact(calibrated[1])
    fit = meta["diagnostics"]["acceptance"]
    metrics = {row["estimate"]: row for row in section.tables["metrics"].iter_rows(named=True)}
    for name in ("raw", "isotonic", "full"):  # same rows, same predictions as `hybridspec fit`
        assert metrics[name]["rows"] == fit[name]["rows"]
        assert metrics[name]["log_loss"] == pytest.approx(fit[name]["log_loss"], rel=1e-9)
        assert metrics[name]["ece"] == pytest.approx(fit[name]["ece"], rel=1e-9)
    # rows at risk per position on the held-out prompt (the fifth by id): A_D ≥ i − 1
    prompts = sorted(p for (p,) in store.query("SELECT DISTINCT prompt_id FROM rounds WHERE run_id = ? AND NOT "
                                                "truncated", [_run("capture")]))
    a_d = np.array([a for (a,) in store.query("SELECT accepted_full FROM rounds WHERE run_id = ? AND NOT truncated "
                                              "AND prompt_id = ?", [_run("capture"), prompts[4]])])
    positions = section.tables["positions"]
    assert positions["rows"].to_list() == [int((a_d >= i - 1).sum()) for i in range(1, 16)]
    assert positions["accepted"].to_list() == [int((a_d >= i).sum()) for i in range(1, 16)]
    assert positions["too_few"].to_list() == [int((a_d >= i - 1).sum()) < 20 for i in range(1, 16)]


def test_acceptance_per_position_and_category_equals_sql(report, store):
    section = report.section("acceptance")
    got = {(r["category"], r["position"]): r["p_accept"] for r in section.tables["by_position"].iter_rows(named=True)}
    for category, i, p in store.query(
            "SELECT c.category, i.i, avg(CASE WHEN r.accepted_full >= i.i THEN 1 ELSE 0 END) FROM rounds r "
            "JOIN prompts c USING (run_id, prompt_id), range(1, 16) i(i) WHERE r.run_id = ? AND NOT r.truncated "
            "GROUP BY ALL", [_run("capture")]):
        assert got[(category, i)] == pytest.approx(p, abs=1e-12)
    assert {c for c, _ in got} == {"code", "comment", "test", "all"}
    al = {r["category"]: r["al"] for r in section.tables["al_full"].iter_rows(named=True)}
    (emitted, rounds), = store.query("SELECT sum(emitted), count(*) FROM rounds WHERE run_id = ?", [_run("capture")])
    assert al["all"] == pytest.approx(emitted / rounds)


def test_cost_stage0_moe_equal_the_store_and_the_artifact(report, calibrated, store):
    params, meta = load_artifact(calibrated[1])
    cost = report.section("cost").tables["per_length"]
    expected = dict(store.query("SELECT executed_w, avg(latency_us) / 1e3 FROM fixed_length_timings WHERE run_id = ? "
                                "AND NOT truncated AND w >= 2 GROUP BY executed_w", [_run("fixed")]))
    assert dict(zip(cost["w"], cost["mean_ms"])) == pytest.approx(expected, rel=1e-12)
    medians = dict(store.query("SELECT executed_w, median(latency_us) / 1e3 FROM fixed_length_timings WHERE "
                               "run_id = ? AND NOT truncated AND w >= 2 GROUP BY executed_w", [_run("fixed")]))
    for w, fit, residual, median in cost.select("w", "fit_ms", "residual_ms", "median_ms").iter_rows():
        assert fit == pytest.approx((params.fixed_cost + params.cost[w]) * 1e3)
        assert median == pytest.approx(medians[w]) and residual == pytest.approx(median - fit)
    stage0 = report.section("stage0")
    expected = dict(store.query("SELECT u, avg(latency_us) FROM stage0_timings WHERE run_id = ? GROUP BY u",
                                [_run("stage0")]))
    assert dict(zip(stage0.tables["per_x"]["u"], stage0.tables["per_x"]["mean_us"])) == pytest.approx(expected)
    assert stage0.values["slope_us"] == pytest.approx(params.s * 1e6)
    moe = report.section("moe")
    x, y = np.array(store.query("SELECT n_distinct_experts, latency_us FROM moe_bench WHERE run_id = ?",
                                [_run("moe")]), float).T
    assert moe.values["correlation"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert moe.values["correlation"] == pytest.approx(meta["diagnostics"]["eta"]["correlation"])
    # the drawn line is the least-squares line over the per-count medians: its intercept is the fit's
    cells = np.unique(x)
    slope, intercept = np.polyfit(cells, [np.median(y[x == c]) for c in cells], 1)
    assert moe.values["slope_us"] == pytest.approx(slope, rel=1e-9)
    assert moe.values["intercept_us"] == pytest.approx(intercept, rel=1e-9)


def test_routing_cells_and_dinkelbach_equal_store_and_artifact(report, calibrated, store):
    params, meta = load_artifact(calibrated[1])
    cells = report.section("routing").tables["cells"]
    counts = {(w, n): c for w, n, c in store.query(
        "SELECT position, new_l0_experts, count(*) FROM routing_positions WHERE run_id = ? GROUP BY ALL",
        [_run("routing")])}
    stored = meta["diagnostics"]["routing_cell_counts"]
    for w0, n, tokens, thin, value in cells.select("w0", "n", "tokens", "thin", "nbar_cond").iter_rows():
        assert tokens == counts.get((w0, n), 0) == stored[w0][n]
        assert thin == (tokens < 30) and value == params.nbar_cond[w0][n]
    assert report.section("routing").values["counts_match_artifact"] is True
    iterations = report.section("dinkelbach").tables["iterations"]
    assert iterations.to_dicts() == [{k: it[k] for k in ("iteration", "rho", "next_rho", "mean_w0")}
                                     for it in meta["diagnostics"]["dinkelbach"]]
    assert report.section("dinkelbach").values["rho"] == params.rho


def test_profile_shows_the_stores_split_and_correlation(report, store):
    section = report.section("profile")
    assert section.status == "ok" and section.figures
    run = _run("profile")
    by_w = section.tables["by_w"]
    rows = store.frame("SELECT w, part, kernel_us FROM cost_profile WHERE run_id = ? AND part <> 'drafter'", [run])
    assert sorted(by_w["w"]) == sorted(set(rows["w"]))
    for r in by_w.iter_rows(named=True):
        parts = rows.filter(rows["w"] == r["w"])
        assert r["kernel_us"] == pytest.approx(parts["kernel_us"].sum())
        assert sum(r[f"{p}_pct"] for p in ("gdn", "attention", "moe", "other")) == pytest.approx(100)
    calls = store.frame("SELECT distinct_pairs, latency_us FROM profile_calls WHERE run_id = ?", [run])
    r = np.corrcoef(calls["distinct_pairs"].to_numpy().astype(float), calls["latency_us"].to_numpy())[0, 1]
    assert section.values["pearson_r"] == pytest.approx(r)
    assert len(section.tables["drafter"]) == 1


def test_metadata_lists_every_run_and_the_artifact(report, calibrated, store):
    section = report.section("metadata")
    runs = section.tables["runs"]
    assert sorted(zip(runs["name"], runs["pass"])) == sorted(store.query("SELECT name, pass FROM runs"))
    fields = dict(zip(section.tables["artifact"]["field"], section.tables["artifact"]["value"]))
    _, meta = load_artifact(calibrated[1])
    assert fields["content_sha256"] == meta["content_sha256"]
    assert not section.values["store_digest_matches"] and "store changed since the fit" in section.note  # eval ran
    assert set(section.tables["identity"]["model_id"]) == {meta["model_id"]}


def test_html_is_self_contained_with_one_valid_png_per_plot(report):
    html = report.path.read_text()
    images = IMG.findall(html)
    assert len(images) == sum(len(s.figures) for s in report.sections) == html.count("<img ")
    for data in images:
        png = base64.b64decode(data, validate=True)
        assert png.startswith(PNG_MAGIC)
        Image.open(io.BytesIO(png)).verify()
    assert all(s.figures for s in report.sections)  # every section has its plot
    assert "<script" not in html and "http://" not in html and "https://" not in html and "<link" not in html
    assert sorted(p.name for p in report.path.parent.iterdir()) == ["index.html"]


def test_summary_names_every_section(report):
    console = Console(record=True, width=200)
    console.print(summary(report))
    text = console.export_text()
    for section in report.sections:
        assert section.title in text and section.status in text


def test_capture_only_store_names_what_is_missing(capture_only, tmp_path):
    result = build_report(capture_only, tmp_path)
    status = {s.key: s.status for s in result.sections}
    assert status["acceptance"] == "ok"
    assert status["reliability"] == "partial" and "--artifact" in result.section("reliability").note
    for key, pass_name in (("cost", "fixed"), ("stage0", "stage0"), ("moe", "moe"), ("routing", "routing"),
                           ("profile", "profile")):
        assert status[key] == "missing"
        assert f"no {pass_name} run in campaign '{CAMPAIGN}'" in result.section(key).note
        assert f"--passes {pass_name}" in result.section(key).note
    assert status["dinkelbach"] == "missing" and "hybridspec fit" in result.section("dinkelbach").note
    assert status["lengths"] == "missing" and "hybridspec eval" in result.section("lengths").note
    assert status["policies"] == "missing" and "no eval run" in result.section("policies").note
    html = result.path.read_text()
    text = unescape(html)
    for section in result.sections:  # never silently skipped: the title and the note are on the page
        assert section.title in text and section.note in text
    assert len(IMG.findall(html)) == sum(len(s.figures) for s in result.sections)


def test_bad_inputs_are_named(calibrated, tmp_path):
    with pytest.raises(ReportError, match="no such store"):
        build_report(tmp_path / "none.duckdb", tmp_path)
    with pytest.raises(ReportError, match="no calibration run named 'nope'.*'t'"):
        build_report(calibrated[0], tmp_path, campaign="nope")


def test_lengths_and_policies_equal_the_eval_rows(report, store):
    lengths = report.section("lengths")
    expected = store.query("SELECT policy, w, count(*) FROM eval_rounds GROUP BY ALL ORDER BY ALL")
    assert sorted(lengths.tables["histogram"].select("series", "w", "rounds").iter_rows()) == expected
    mean_w = dict(store.query("SELECT policy, avg(w) FROM eval_rounds GROUP BY policy"))
    assert dict(lengths.tables["per_series"].select("series", "mean_w").iter_rows()) == pytest.approx(mean_w)
    policies = report.section("policies").tables["policies"]
    assert set(policies["policy"]) == {"ar", *POLICIES}
    al = dict(((p, c), v) for p, c, v in store.query(
        "SELECT policy, category, sum(emitted_tokens) / sum(rounds) FROM eval_requests GROUP BY ALL"))
    estimated = dict(((p, c), v) for p, c, v in store.query("SELECT policy, category, tps FROM offline_estimates"))
    for row in policies.iter_rows(named=True):
        key = (row["policy"], row["category"])
        if row["category"] != "all":
            assert row["al_measured"] == pytest.approx(al[key])
        assert row["tps_estimated"] == pytest.approx(estimated[key])  # as `eval` stored them
        assert row["tps_diff"] == pytest.approx(row["tps_estimated"] - row["tps_measured"])


def test_without_eval_runs_the_policy_table_is_estimated_only(capture_only, calibrated, tmp_path):
    result = build_report(capture_only, tmp_path, artifact=calibrated[1])
    status = {s.key: s.status for s in result.sections}
    failed = {c.section for c in result.failed_checks}
    for key in ("reliability", "dinkelbach"):
        assert status[key] == ("poor fit" if key in failed else "ok")
    policies = result.section("policies")
    assert policies.status == "partial" and "no eval run" in policies.note
    assert {"ar", "full", "hybridspec"} <= set(policies.tables["policies"]["policy"])
    assert status["cost"] == "missing" and status["lengths"] == "missing"


# ---------------------------------------------------------------- the CLI adapter
def test_report_command_writes_the_page_and_names_it(calibrated, tmp_path):
    db, artifact = calibrated
    out = tmp_path / "page"
    cli = CliRunner()
    result = cli.invoke(app, ["report", "--db", str(db), "--artifact", str(artifact), "--out", str(out)],
                        terminal_width=200)
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file() and "report:" in result.output
    assert str((out / "index.html").resolve()) in result.output.replace("\n", "")
    as_json = cli.invoke(app, ["report", "--db", str(db), "--artifact", str(artifact), "--out", str(tmp_path / "j"),
                               "--json"])
    assert as_json.exit_code == 0, as_json.output
    printed = json.loads(as_json.stdout)
    assert printed["path"] == str((tmp_path / "j" / "index.html").resolve()) and len(printed["sections"]) >= 10
    assert all(s["status"] for s in printed["sections"])


def test_report_command_refuses_a_missing_store(tmp_path):
    result = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "none.duckdb" in result.output
