"""Models named by Hugging Face repo id, resolved from the local hub cache: every command
(`generate`, `capture`, `fit`, `serve`) runs by repo id; the errors name the way out."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import load_artifact
from hybridspec.cli import app
from hybridspec.runtime.config import ConfigError
from hybridspec.runtime.hub import ModelNotFoundError, hub_origin, parse_repo_ref, resolve_reference
from hybridspec.runtime.loading import drafter_config, load_target, target_config
from hybridspec.runtime.session import EMBEDDED, model_identity
from tests.checkpoints import put_in_hub_cache, reshard

runner = CliRunner()
TARGET, DRAFTER = "hybridspec-test/Tiny-Hybrid", "hybridspec-test/Tiny-Hybrid-DFlash"
COMMIT, OLD_COMMIT, DRAFTER_COMMIT = "c" * 40, "0" * 40, "d" * 40


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """The embedded pair in a hub cache: the target in 3 shards with an index (and a one-shard older
    revision), the drafter as is."""
    root = tmp_path_factory.mktemp("hf_home")
    sharded = reshard(EMBEDDED / "target", root / "sharded", shards=3)
    put_in_hub_cache(root / "hub", TARGET, sharded, COMMIT)
    put_in_hub_cache(root / "hub", TARGET, EMBEDDED / "target", OLD_COMMIT, ref=None)
    put_in_hub_cache(root / "hub", DRAFTER, EMBEDDED / "drafter", DRAFTER_COMMIT)
    return root


@pytest.fixture(autouse=True)
def offline_cache(hf_home, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no download is tried: the cache alone answers


def test_references_resolve_to_cache_snapshots(hf_home):
    snapshot = hf_home / "hub" / f"models--{TARGET.replace('/', '--')}" / "snapshots"
    assert resolve_reference(TARGET) == str(snapshot / COMMIT)
    assert resolve_reference(f"{TARGET}@{OLD_COMMIT}") == str(snapshot / OLD_COMMIT)
    assert hub_origin(resolve_reference(TARGET)).repo_id == TARGET
    assert resolve_reference("random-tiny") == "random-tiny" and resolve_reference("random") == "random"
    assert parse_repo_ref("./models/x") is None and parse_repo_ref("a/b/c") is None and parse_repo_ref("a/b@") is None
    assert target_config(TARGET) == target_config(EMBEDDED / "target")
    assert drafter_config(DRAFTER) == drafter_config(EMBEDDED / "drafter")


@pytest.mark.slow
def test_generate_capture_fit_and_serve_by_repo_id(tmp_path):
    from fastapi.testclient import TestClient

    from hybridspec.serve.app import create_app
    from hybridspec.serve.service import open_service

    pair = ["--model", TARGET, "--drafter", DRAFTER]
    by_id = runner.invoke(app, ["generate", *pair, "--prompt", "def f(x):", "--policy", "full",
                                "--max-new-tokens", "8", "--json"])
    assert by_id.exit_code == 0, by_id.output
    by_dir = runner.invoke(app, ["generate", "--prompt", "def f(x):", "--policy", "full", "--max-new-tokens", "8",
                                 "--json"])  # the same weights from the package's directories
    assert json.loads(by_id.output)["token_ids"] == json.loads(by_dir.output)["token_ids"]
    assert json.loads(by_id.output)["model"] == TARGET

    prompts = tmp_path / "prompts.jsonl"
    lines = (EMBEDDED / "prompts.jsonl").read_text().splitlines()
    chosen = [line for line in lines if json.loads(line)["split"] == "calib"
              and json.loads(line)["category"] == "code"]  # capture --quick takes 2 of them
    prompts.write_text("\n".join(chosen) + "\n")
    db, artifact = tmp_path / "calib.duckdb", tmp_path / "policy.safetensors"
    captured = runner.invoke(app, ["capture", *pair, "--prompts", str(prompts), "--db", str(db), "--name", "hub",
                                   "--quick", "--max-new-tokens", "8"])
    assert captured.exit_code == 0, captured.output
    fitted = runner.invoke(app, ["fit", "--db", str(db), "--out", str(artifact), "--allow-poor-fit"])
    assert fitted.exit_code == 0, fitted.output
    _, meta = load_artifact(artifact)
    assert (meta["model_id"], meta["drafter_id"]) == model_identity(TARGET, DRAFTER)
    assert meta["drafter_id"] == model_identity(EMBEDDED / "target", EMBEDDED / "drafter")[1]  # same bytes, same id

    service = open_service(artifact=artifact, model=TARGET, drafter=DRAFTER, max_context=512)
    with TestClient(create_app(service)) as client:
        chat = client.post("/v1/chat/completions", json={
            "model": TARGET, "messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 8,
            "temperature": 0})
        completion = client.post("/v1/completions", json={"model": TARGET, "prompt": "def f(x):", "max_tokens": 8,
                                                          "temperature": 0, "policy": "hybridspec"})
    assert chat.status_code == 200 and completion.status_code == 200, (chat.text, completion.text)
    assert completion.json()["usage"]["completion_tokens"] == 8


def test_a_repo_not_in_the_cache_names_the_download_command():
    with pytest.raises(ModelNotFoundError, match=r"not in the Hugging Face cache .*`hf download Qwen/Qwen3.6-35B-A3B`"):
        target_config("Qwen/Qwen3.6-35B-A3B")
    with pytest.raises(ModelNotFoundError, match=f"`hf download {TARGET} --revision v2`"):
        target_config(f"{TARGET}@v2")
    failed = runner.invoke(app, ["generate", "--model", "Qwen/Qwen3.6-35B-A3B", "--prompt-ids", "1,2",
                                 "--policy", "ar"])
    assert failed.exit_code != 0 and "hf download Qwen/Qwen3.6-35B-A3B" in " ".join(failed.output.split())


def test_a_missing_shard_is_named(hf_home):
    snapshot = put_in_hub_cache(hf_home / "hub", "hybridspec-test/Partial", hf_home / "sharded", "e" * 40)
    (snapshot / "model-00002-of-00003.safetensors").unlink()  # an interrupted download
    with pytest.raises(ConfigError, match=r"hybridspec-test/Partial@e+ .*lists 1 shard\(s\) that are not there: "
                                          r"model-00002-of-00003.safetensors"):
        load_target("hybridspec-test/Partial")


def test_a_drafter_given_as_model_and_a_target_given_as_drafter_are_named():
    with pytest.raises(ConfigError, match="a DFlash drafter, not a target; give it as --drafter"):
        target_config(DRAFTER)
    with pytest.raises(ConfigError, match="a qwen3_5_moe_text target, not a DFlash drafter; give it as --model"):
        drafter_config(TARGET)


def test_an_unsupported_model_type_is_named(hf_home, tmp_path):
    shutil.copytree(EMBEDDED / "target", tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    put_in_hub_cache(hf_home / "hub", "hybridspec-test/Llama", tmp_path / "llama", "f" * 40)
    with pytest.raises(ConfigError, match=r"hybridspec-test/Llama@f+ .*model_type 'llama' is not one of"):
        target_config("hybridspec-test/Llama")
