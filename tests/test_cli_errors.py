"""How the CLI fails: one line on stderr, exit 2, the user's text printed as given (no markup
escaped twice), before any model loads; `python -m hybridspec` fails as the `hybridspec` entry
point does."""

from __future__ import annotations

import dataclasses
import json
import runpy
import sys

import pytest
from typer.testing import CliRunner

from hybridspec.cli import app
from hybridspec.runtime import session

runner = CliRunner()


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.fixture
def no_loading(monkeypatch):
    def loaded(*args, **kwargs):
        pytest.fail("a model was loaded before the policy and the artifact were checked")

    monkeypatch.setattr(session, "load_target", loaded)
    monkeypatch.setattr(session, "load_drafter", loaded)


def test_markup_in_a_message_is_printed_as_given(tmp_path):
    result = runner.invoke(app, ["capture", "--split", "[red]x", "--db", str(tmp_path / "c.duckdb")])
    line = _one_line_error(result, "--split '[red]x'")
    assert "\\" not in line


@pytest.mark.parametrize("args, message", [
    (["--policy", "hybridspec", "--artifact", "nope.safetensors"], "nope.safetensors: no such artifact file"),
    (["--policy", "sometimes"], "unknown policy 'sometimes'"),
    (["--policy", "static:99"], "static:99: length must be in 2"),
    (["--policy", " "], "--policy is empty"),
    (["--policy", "ar", "--repetition-penalty", "0"], "repetition_penalty must be in (0, 2]"),
    (["--policy", "ar", "--max-context", "100000"], "exceeds the model's max_position_embeddings (4096)"),
    (["--policy", "ar", "--prompt-ids", "1,99999"], "--prompt-ids 99999 is outside the vocabulary"),
    (["--policy", "ar", "--logit-bias", "99999=1"], "--logit-bias 99999 is outside the vocabulary"),
    (["--policy", "ar", "--stop-token-id", "-1"], "--stop-token-id -1 is outside the vocabulary"),
])
def test_generate_checks_policy_and_artifact_before_loading(no_loading, args, message):
    _one_line_error(runner.invoke(app, ["generate", "--prompt-ids", "1,2", *args]), message)


@pytest.mark.parametrize("value, message", [("5", "not ID=BIAS"), ("a=1", "not ID=BIAS"), ("5=x", "not ID=BIAS"),
                                            ("=3", "not ID=BIAS"), ("5=", "not ID=BIAS"),
                                            ("5=200", "a finite number in [-100, 100]"),
                                            ("5=nan", "a finite number in [-100, 100]"),
                                            ("5=-inf", "a finite number in [-100, 100]")])
def test_generate_names_a_malformed_logit_bias(no_loading, value, message):
    result = runner.invoke(app, ["generate", "--prompt-ids", "1,2", "--logit-bias", "3=1", "--logit-bias", value])
    _one_line_error(result, f"--logit-bias {value!r}", message)


@pytest.mark.parametrize("args, message", [
    (["--stop", "x", "--stop", ""], "--stop: stop sequences must be non-empty"),
    (["--min-tokens", "5", "--max-new-tokens", "4"], "--min-tokens (5) exceeds --max-new-tokens (4)"),
    (["--ignore-eos", "--regex", "a+"], "--ignore-eos cannot be combined with an output constraint"),
])
def test_generate_checks_its_ending_options_before_loading(no_loading, args, message):
    _one_line_error(runner.invoke(app, ["generate", "--prompt-ids", "1,2", "--policy", "ar", *args]), message)


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_generate_refuses_a_min_p_outside_0_1(no_loading, value):
    result = runner.invoke(app, ["generate", "--prompt-ids", "1,2", "--policy", "ar", "--min-p", value])
    assert result.exit_code == 2 and "--min-p" in result.output, result.output


@pytest.mark.parametrize("command", [["generate", "--prompt-ids", "1,2"], ["serve"]])
def test_a_drafter_that_is_no_directory_is_named_before_loading(no_loading, tmp_path, command):
    (tmp_path / "d.safetensors").write_bytes(b"")
    for drafter in (str(tmp_path / "missing"), str(tmp_path / "d.safetensors")):
        result = runner.invoke(app, [*command, "--policy", "full", "--drafter", drafter])
        _one_line_error(result, repr(drafter), "not a drafter directory")


def test_serve_checks_the_artifact_before_loading(no_loading):
    _one_line_error(runner.invoke(app, ["serve", "--artifact", "nope.safetensors"]), "no such artifact file")


def test_estimate_refuses_empty_policies_as_eval_does(tmp_path):
    for command in (["estimate", "--artifact", str(tmp_path / "a.safetensors")], ["eval", "--quick"]):
        result = runner.invoke(app, [*command, "--db", str(tmp_path / "s.duckdb"), "--policies", " , "])
        _one_line_error(result, "--policies is empty")


@pytest.mark.parametrize("command", [["report", "--out", "{out}/report"], ["estimate", "--artifact", "{artifact}"],
                                     ["fit", "--out", "{out}/a.safetensors"], ["export", "--out", "{out}/export"],
                                     ["eval", "--quick"]])
def test_a_duckdb_file_that_is_no_store_is_one_line(no_loading, tmp_path, command):
    import duckdb

    from hybridspec.artifacts.artifact import save_artifact
    from tests.runtime.helpers import policy_parameters

    db, artifact = tmp_path / "blank.duckdb", tmp_path / "a.safetensors"
    duckdb.connect(str(db)).close()  # a valid DuckDB file without hybridspec's tables
    save_artifact(artifact, policy_parameters(), model_id="m", drafter_id="d", device="cpu", store_digest="s",
                  diagnostics={})
    args = [a.format(out=tmp_path / "out", artifact=artifact) for a in command]
    _one_line_error(runner.invoke(app, [*args, "--db", str(db)]), "blank.duckdb: not a hybridspec store")
    assert not (tmp_path / "out").exists()  # nothing written


def test_fit_has_no_run_option_and_its_poor_fit_line_goes_to_stderr(tmp_path):
    from hybridspec.workbench.store import Store
    from tests.fitters.test_campaign import write_synthetic_store

    db, out = tmp_path / "noise.duckdb", tmp_path / "a.safetensors"
    write_synthetic_store(db, n_rounds=500, noise=True)
    with Store(db) as store:
        for (run_id,) in store.query("SELECT run_id FROM runs"):  # fit reads finished runs only
            store.finish_shard(run_id, 0)
    old = runner.invoke(app, ["fit", "--db", str(db), "--run", "synth", "--out", str(out)])
    assert old.exit_code == 2 and "No such option: --run" in old.output
    result = runner.invoke(app, ["fit", "--db", str(db), "--name", "synth", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 1 and not out.exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nothing written" in errors[0] and "cost_r2" in result.stderr, result.stderr
    assert "error:" not in result.stdout and "log-loss" in result.stdout  # the fit's tables stay on stdout


def test_train_embedded_checks_device_and_folders_before_training(monkeypatch, tmp_path):
    import hybridspec.training.embedded as embedded

    calls = []
    monkeypatch.setattr(embedded, "train_embedded",
                        lambda out, recipe, device, **kw: calls.append((out, recipe, device, kw)))
    _one_line_error(runner.invoke(app, ["train-embedded", "--out", str(tmp_path), "--device", "cudax"]),
                    "--device 'cudax'", "cpu, cuda, cuda:N")
    for flag in ("--stdlib", "--target-dir", "--drafter-init"):
        missing = runner.invoke(app, ["train-embedded", "--out", str(tmp_path), flag, str(tmp_path / "none")],
                                env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
        assert missing.exit_code == 2 and flag in missing.output and "does not exist" in missing.output
    assert calls == []
    ok = runner.invoke(app, ["train-embedded", "--out", str(tmp_path / "o"), "--recipe", "tiny", "--stdlib",
                             str(tmp_path), "--device", "cpu"])
    assert ok.exit_code == 0, ok.output
    [(out, recipe, device, kw)] = calls
    assert (out, recipe, device) == (tmp_path / "o", embedded.RECIPES["tiny"], "cpu") and kw["stdlib"] == tmp_path
    for args, message in ((["--recipe", "huge"], "unknown recipe 'huge' (recipes: full, tiny)"),
                          (["--target-minutes", "0"], "--target-minutes must be a positive number of minutes"),
                          (["--drafter-init", str(tmp_path)], "--drafter-init needs --target-dir")):
        _one_line_error(runner.invoke(app, ["train-embedded", "--out", str(tmp_path / "o"), *args]), message)
    assert len(calls) == 1


def test_train_embedded_errors_are_one_line(monkeypatch, tmp_path):
    import hybridspec.training.embedded as embedded

    def fails(*args, **kwargs):
        raise ValueError(f"{tmp_path}: no Python files to read")

    monkeypatch.setattr(embedded, "train_embedded", fails)
    _one_line_error(runner.invoke(app, ["train-embedded", "--out", str(tmp_path / "o"), "--stdlib", str(tmp_path)]),
                    "no Python files to read")


def test_python_dash_m_gives_the_missing_extra_hint(monkeypatch, capsys):
    for module in ("hybridspec.serve.app", "hybridspec.serve.service", "hybridspec.serve", "hybridspec.__main__"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ModuleNotFoundError
    monkeypatch.setattr(sys, "argv", ["hybridspec", "serve"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("hybridspec", run_name="__main__")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'hybridspec[serve]'" in err


def test_the_demo_prints_the_fit_command_it_runs(monkeypatch, tmp_path):
    import hybridspec.demo as demo
    from rich.console import Console

    class Stop(Exception):
        pass

    seen = {}
    monkeypatch.setattr(demo, "run_campaign", lambda config, reporter: [])
    monkeypatch.setattr(demo, "summary_table", lambda passes, db: "")

    def fit(db, name, out, **options):
        seen.update(name=name, **options)
        raise Stop

    monkeypatch.setattr(demo, "fit_artifact", fit)
    console = Console(record=True, width=400)
    with pytest.raises(Stop):
        demo.run_demo_workflow(dataclasses.replace(demo.DemoConfig(), out=tmp_path), console)
    text = console.export_text()
    assert seen == {"name": demo.CAMPAIGN, "allow_poor_fit": True}
    assert f"--name {demo.CAMPAIGN} " in text and text.rstrip().endswith("--allow-poor-fit") and "--run" not in text


def test_generate_reads_prompt_ids_and_policy_names_strictly():
    _one_line_error(runner.invoke(app, ["generate", "--prompt-ids", "1,,2", "--policy", "ar"]),
                    "prompt ids must be comma-separated integers")
    result = runner.invoke(app, ["generate", "--prompt-ids", "1, 2", "--policy", "static: 4", "--json",
                                 "--max-new-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["policy"] == "static:4"


def test_generate_and_serve_warn_of_an_artifact_that_fails_its_checks(tmp_path, monkeypatch):
    """An artifact whose own fit-quality checks fail (η < 0 here, as an --allow-poor-fit fit or an
    edit can leave it) decodes, with one warning line per failed check on stderr."""
    import hybridspec.serve.app as serve_app
    import hybridspec.serve.service as serve_service
    from hybridspec.artifacts.artifact import save_artifact
    from tests.runtime.helpers import policy_parameters

    path = tmp_path / "a.safetensors"
    save_artifact(path, dataclasses.replace(policy_parameters(), eta=-1e-6), model_id="sha256:a",
                  drafter_id="sha256:b", device="cpu", store_digest="none", diagnostics={})
    result = runner.invoke(app, ["generate", "--prompt-ids", "1,2", "--policy", "ar", "--artifact", str(path),
                                 "--max-new-tokens", "1"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "eta_positive" in warnings[0] and "hybridspec inspect" in warnings[0]
    monkeypatch.setattr(serve_app, "serve", lambda service, **kw: None)
    monkeypatch.setattr(serve_service, "open_service", lambda **kw: type("S", (), {"model_name": "m"})())
    served = runner.invoke(app, ["serve", "--artifact", str(path), "--policy", "full"])
    assert served.exit_code == 0 and "eta_positive" in served.stderr


@pytest.mark.parametrize("command", [["capture", "--passes", "capture"], ["eval", "--policies", "ar"]])
def test_a_context_past_the_model_is_refused_before_any_store(no_loading, tmp_path, command):
    db = tmp_path / "s.duckdb"
    result = runner.invoke(app, [*command, "--quick", "--db", str(db), "--max-new-tokens", "1000000000"])
    _one_line_error(result, "exceeds the model's max_position_embeddings (4096)", "lower --max-new-tokens")
    assert not db.exists()
