"""`hybridspec report`: the CLI adapter writes the page and prints the summary and where it is."""

import json

from typer.testing import CliRunner

from hybridspec.cli import app

runner = CliRunner()


def test_report_command_writes_the_page_and_names_it(calibrated, tmp_path):
    db, artifact = calibrated
    out = tmp_path / "page"
    result = runner.invoke(app, ["report", "--db", str(db), "--artifact", str(artifact), "--out", str(out)],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file() and "report:" in result.output
    assert str((out / "index.html").resolve()) in result.output.replace("\n", "")
    as_json = runner.invoke(app, ["report", "--db", str(db), "--artifact", str(artifact), "--out", str(tmp_path / "j"),
                                  "--json"])
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.stdout)
    assert summary["path"] == str((tmp_path / "j" / "index.html").resolve()) and len(summary["sections"]) >= 10
    assert all(s["status"] for s in summary["sections"])


def test_report_command_refuses_a_missing_store(tmp_path):
    result = runner.invoke(app, ["report", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "none.duckdb" in result.output
