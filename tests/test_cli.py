"""`hybridspec generate` end to end through the CLI: JSON output and the errors it names."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import save_artifact
from hybridspec.runtime.session import open_session
from hybridspec.cli import app
from tests.runtime.helpers import policy_parameters

runner = CliRunner()


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, ["generate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_generate_json_fields_and_ar_equality(tmp_path):
    ar = _json(["--model", "random-tiny", "--prompt-ids", "3,1,4", "--policy", "ar", "--max-new-tokens", "20"])
    assert {"token_ids", "text", "rounds", "acceptance_length", "mean_verification_length",
            "decode_seconds"} <= set(ar)
    assert len(ar["token_ids"]) == 20 and ar["rounds"] == 19 and ar["mean_verification_length"] == 1
    session = open_session("random-tiny")
    save_artifact(tmp_path / "p.safetensors", policy_parameters(), model_id=session.model_id,
                  drafter_id=session.drafter_id, device="cpu", store_digest="none", diagnostics={})
    for policy in ("full", "static:5", "hybridspec"):
        extra = ["--artifact", str(tmp_path / "p.safetensors")] if policy == "hybridspec" else []
        spec = _json(["--model", "random-tiny", "--prompt-ids", "3,1,4", "--policy", policy, "--max-new-tokens",
                      "20", *extra])
        assert spec["token_ids"] == ar["token_ids"], policy
        assert spec["random_weights"] is True


def test_artifact_for_another_model_is_refused_unless_forced(tmp_path):
    save_artifact(tmp_path / "p.safetensors", policy_parameters(), model_id="sha256:other", drafter_id="sha256:d",
                  device="cpu", store_digest="none", diagnostics={})
    args = ["generate", "--model", "random-tiny", "--prompt-ids", "1,2", "--policy", "nominal", "--artifact",
            str(tmp_path / "p.safetensors"), "--max-new-tokens", "4"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "sha256:other" in " ".join(refused.output.split())
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_generate_with_a_checkpoint_directory(qwen35_dir):
    ar = _json(["--model", str(qwen35_dir), "--prompt-ids", "5,6", "--policy", "ar", "--max-new-tokens", "8"])
    assert len(ar["token_ids"]) == 8 and ar["random_weights"] is False


@pytest.mark.parametrize("args,message", [
    (["--prompt-ids", "1,2", "--policy", "nominal"], "needs --artifact"),
    (["--prompt-ids", "1,2", "--policy", "sometimes"], "unknown policy"),
    (["--prompt-ids", "1,2", "--policy", "static:x"], "static:N needs an integer"),
    (["--model", "qwen9-unknown", "--prompt-ids", "1", "--policy", "ar"], "neither a model directory nor a preset"),
    (["--model", "random-tiny", "--prompt", "hello", "--policy", "ar"], "no tokenizer.json"),
    (["--prompt-ids", "1,2", "--prompt", "x", "--policy", "ar"], "exactly one"),
    (["--prompt-ids", "1,99999", "--policy", "ar"], "outside the vocabulary"),
    (["--prompt-ids", "1", "--policy", "ar", "--top-p", "0"], "top_p"),
])
def test_generate_errors_name_what_is_wrong(args, message):
    result = runner.invoke(app, ["generate", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_directory_model_needs_a_drafter_for_speculative_policies(qwen35_dir):
    result = runner.invoke(app, ["generate", "--model", str(qwen35_dir), "--prompt-ids", "1", "--policy", "full"])
    assert result.exit_code == 2 and "needs --drafter" in " ".join(result.output.split())


def test_unsupported_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = runner.invoke(app, ["generate", "--model", str(tmp_path), "--prompt-ids", "1", "--policy", "ar"])
    assert result.exit_code == 2 and "model_type 'llama'" in result.output


def test_default_model_is_the_embedded_pair_with_text():
    out = _json(["--prompt", "def add(a, b):\n    return", "--policy", "full", "--max-new-tokens", "12"])
    assert out["random_weights"] is False and out["model"].endswith("embedded/target")
    ar = _json(["--prompt", "def add(a, b):\n    return", "--policy", "ar", "--max-new-tokens", "12"])
    assert out["token_ids"] == ar["token_ids"] and out["text"] == ar["text"] and out["text"]


@pytest.mark.parametrize(("env", "flag", "expected"), [(None, [], 1), ("3", [], 3), ("3", ["--threads", "2"], 2)])
def test_demo_sets_one_thread_count_for_every_step_and_the_server(monkeypatch, tmp_path, env, flag, expected):
    import os

    import torch

    import hybridspec.demo as demo

    monkeypatch.setenv("OMP_NUM_THREADS", env or "")  # records the variable's state for the undo
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    seen = {}
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.setdefault("torch", n))
    monkeypatch.setattr(demo, "run_demo_workflow",
                        lambda config, console: seen.update(env=os.environ["OMP_NUM_THREADS"], out=config.out))
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "d"), *flag])
    assert result.exit_code == 0, result.output
    assert seen == {"torch": expected, "env": str(expected), "out": tmp_path / "d"}
    assert f"torch CPU threads: {expected}" in result.output
