"""`hybridspec fit` and `hybridspec inspect` through the CLI."""

from __future__ import annotations

from typer.testing import CliRunner

from hybridspec.artifacts.artifact import load_artifact
from hybridspec.cli import app
from tests.fitters.test_campaign import write_synthetic_store

runner = CliRunner()


def test_fit_writes_a_valid_artifact_and_inspect_prints_it(tmp_path):
    write_synthetic_store(tmp_path / "s.duckdb", n_rounds=2500)
    result = runner.invoke(app, ["fit", "--db", str(tmp_path / "s.duckdb"), "--run", "synth",
                                 "--out", str(tmp_path / "a.safetensors")])
    assert result.exit_code == 0, result.output
    assert "ρ =" in result.output and "log-loss" in result.output
    params, meta = load_artifact(tmp_path / "a.safetensors")
    assert params.rho == meta["rho"] > 0 and meta["model_id"] == "sha256:m"
    shown = runner.invoke(app, ["inspect", str(tmp_path / "a.safetensors")])
    assert shown.exit_code == 0 and "content_sha256" in shown.output and str(round(params.rho, 2))[:4] in shown.output


def test_inspect_and_fit_refuse_bad_input(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 10)
    bad = runner.invoke(app, ["inspect", str(tmp_path / "bad.safetensors")])
    assert bad.exit_code == 2 and "not a readable artifact" in " ".join(bad.output.split())
    missing = runner.invoke(app, ["fit", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no such store" in " ".join(missing.output.split())
    write_synthetic_store(tmp_path / "s.duckdb", n_rounds=200)
    wrong = runner.invoke(app, ["fit", "--db", str(tmp_path / "s.duckdb"), "--run", "other", "--out", str(tmp_path / "x")])
    assert wrong.exit_code == 2 and "no capture run" in " ".join(wrong.output.split())
