"""`hybridspec fit`, `inspect` and `export` through the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import load_artifact
from hybridspec.cli import app
from hybridspec.workbench.store import Store
from tests.fitters.test_campaign import write_synthetic_store

runner = CliRunner()


def _flat(output: str) -> str:
    return " ".join(output.split())


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path]:
    """(good, noise): synthetic campaigns named `synth`, one with every timing pure noise."""
    root = tmp_path_factory.mktemp("stores")
    write_synthetic_store(root / "good.duckdb", n_rounds=1000)
    write_synthetic_store(root / "noise.duckdb", n_rounds=500, noise=True)
    return root / "good.duckdb", root / "noise.duckdb"


def test_fit_writes_a_valid_artifact_and_inspect_prints_its_checks(stores, tmp_path):
    out = tmp_path / "a.safetensors"
    result = runner.invoke(app, ["fit", "--db", str(stores[0]), "--name", "synth", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "ρ =" in result.output and "log-loss" in result.output and "fit-quality checks" in result.output
    params, meta = load_artifact(out)
    assert params.rho == meta["rho"] > 0 and meta["model_id"] == "sha256:m"
    as_json = runner.invoke(app, ["fit", "--db", str(stores[0]), "--out", str(tmp_path / "j.safetensors"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.stdout)
    params = load_artifact(tmp_path / "j.safetensors")[0]
    assert summary["rho"] == pytest.approx(params.rho) and summary["failed_checks"] == []
    assert summary["content_sha256"] and set(summary["cost"]) == {str(w) for w in params.lengths}
    shown = runner.invoke(app, ["inspect", str(out)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "content_sha256" in shown.output and str(round(params.rho, 2))[:4] in shown.output
    assert "cost_r2" in shown.output and "failed" not in shown.output
    strict = runner.invoke(app, ["inspect", str(out), "--threshold", "cost_r2=1"], terminal_width=200)
    assert strict.exit_code == 1 and "failed: cost_r2" in _flat(strict.output)


def test_fit_on_pure_noise_exits_non_zero_naming_each_failed_check(stores, tmp_path):
    out = tmp_path / "a.safetensors"
    result = runner.invoke(app, ["fit", "--db", str(stores[1]), "--out", str(out)], terminal_width=200)
    assert result.exit_code == 1, result.output
    text = _flat(result.output)
    for name in ("cost_r2", "cost_monotone", "s_r2", "eta_r2"):
        assert f"{name}: " in text and "FAILED" in text
    assert "(needs ≥ 0.8)" in text and "nothing written" in text and not out.exists()
    allowed = runner.invoke(app, ["fit", "--db", str(stores[1]), "--out", str(out), "--allow-poor-fit"],
                            terminal_width=200)
    assert allowed.exit_code == 0 and "--allow-poor-fit" in allowed.output
    assert load_artifact(out)[1]["diagnostics"]["allow_poor_fit"] is True
    shown = runner.invoke(app, ["inspect", str(out)], terminal_width=200)
    assert shown.exit_code == 1 and "failed: cost_r2" in _flat(shown.output)
    assert "written with --allow-poor-fit" in _flat(shown.output)
    as_json = runner.invoke(app, ["fit", "--db", str(stores[1]), "--out", str(tmp_path / "j.safetensors"), "--json"])
    summary = json.loads(as_json.stdout)  # one object, exit 1, nothing written
    assert as_json.exit_code == 1 and summary["artifact"] is None and not (tmp_path / "j.safetensors").exists()
    assert summary["failed_checks"] and all(line in _flat(result.output) for line in summary["failed_checks"])
    relaxed = runner.invoke(app, ["fit", "--db", str(stores[1]), "--out", str(out), "--threshold", "cost_r2=x"])
    assert relaxed.exit_code == 2 and "not a number" in _flat(relaxed.output)


def test_fit_names_the_campaign_with_name_or_the_only_campaign(stores, tmp_path):
    for args in (["--name", "synth"], []):
        result = runner.invoke(app, ["fit", "--db", str(stores[0]), "--out", str(tmp_path / "a"), *args])
        assert result.exit_code == 0, (args, result.output)
    old = runner.invoke(app, ["fit", "--db", str(stores[0]), "--out", str(tmp_path / "a"), "--run", "synth"])
    assert old.exit_code == 2


def test_inspect_and_fit_refuse_bad_input(stores, tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 10)
    bad = runner.invoke(app, ["inspect", str(tmp_path / "bad.safetensors")])
    assert bad.exit_code == 2 and "not a readable artifact" in _flat(bad.output)
    missing = runner.invoke(app, ["fit", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no such store" in _flat(missing.output)
    wrong = runner.invoke(app, ["fit", "--db", str(stores[0]), "--name", "other", "--out", str(tmp_path / "x")])
    assert wrong.exit_code == 2 and "no capture run" in _flat(wrong.output)


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes through permission bits; sysfs refuses it a new file
        return Path("/sys")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return locked


def test_fit_and_report_refuse_an_unwritable_out_before_reading_the_store(stores, tmp_path, monkeypatch):
    import hybridspec.fitters.export as export
    import hybridspec.report as report

    def must_not_run(*args, **kwargs):
        raise AssertionError("fitted or reported before checking --out")

    monkeypatch.setattr(export, "fit_campaign", must_not_run)
    monkeypatch.setattr(report, "open_inputs", must_not_run)
    locked = _unwritable_dir(tmp_path)
    fit = runner.invoke(app, ["fit", "--db", str(stores[0]), "--out", str(locked / "a.safetensors")])
    assert fit.exit_code == 2 and f"--out {locked / 'a.safetensors'}" in _flat(fit.output)
    assert "not writable" in _flat(fit.output) and _one_error_line(fit.output)
    page = runner.invoke(app, ["report", "--db", str(stores[0]), "--out", str(locked / "report")])
    assert page.exit_code == 2 and "not writable" in _flat(page.output)


def _one_error_line(output: str) -> bool:
    """One message (the console wraps it at its width), no traceback."""
    return output.count("error:") == 1 and output.startswith("error:") and "Traceback" not in output


def _damaged(path: Path, to: Path) -> Path:
    data = path.read_bytes()
    to.write_bytes(data[: len(data) // 2])
    return to


def test_a_damaged_store_is_one_line_exit_2_and_nothing_written(stores, tmp_path):
    db = _damaged(stores[0], tmp_path / "half.duckdb")
    out = tmp_path / "a.safetensors"
    fit = runner.invoke(app, ["fit", "--db", str(db), "--name", "synth", "--out", str(out)], terminal_width=400)
    assert fit.exit_code == 2 and f"{db}: damaged store" in _flat(fit.output)
    assert "Could not read enough bytes" in _flat(fit.output)  # DuckDB's own words
    assert _one_error_line(fit.output) and not out.exists()
    page = runner.invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r")], terminal_width=400)
    assert page.exit_code == 2 and "damaged store" in _flat(page.output) and _one_error_line(page.output)
    assert not (tmp_path / "r" / "index.html").exists()


def test_export_writes_every_table(stores, tmp_path):
    result = runner.invoke(app, ["export", "--db", str(stores[0]), "--name", "synth", "--format", "csv",
                                 "--out", str(tmp_path / "x")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "draft_positions.csv").read_text().count("\n") == 1000 * 15 + 1
    bad = runner.invoke(app, ["export", "--db", str(stores[0]), "--format", "xml", "--out", str(tmp_path / "y")])
    assert bad.exit_code == 2 and "parquet or csv" in bad.output


def test_fit_refuses_an_unfinished_or_empty_capture_in_one_line(stores, tmp_path):
    """A stopped capture and a capture run with rounds but no draft positions: exit 2, one line naming
    the run (and the command that completes it, or the empty table), nothing written."""
    stopped, empty = tmp_path / "stopped.duckdb", tmp_path / "empty.duckdb"
    write_synthetic_store(stopped, n_rounds=200, finished=False)
    empty.write_bytes(stores[0].read_bytes())
    with Store(empty) as store:
        store.con.execute("DELETE FROM draft_positions")
    out = tmp_path / "a.safetensors"
    for db, words in ((stopped, f"is unfinished (status 'running'): it stopped before its last unit; complete it with "
                                f"`hybridspec capture --db {stopped} --name synth --passes capture --resume`"),
                      (empty, "has 1000 complete rounds but no rows in table draft_positions")):
        fit = runner.invoke(app, ["fit", "--db", str(db), "--name", "synth", "--out", str(out)], terminal_width=400)
        assert fit.exit_code == 2 and "the capture run of campaign 'synth'" in _flat(fit.output)
        assert words in _flat(fit.output) and _one_error_line(fit.output) and not out.exists()
