"""What `serve` refuses before it loads anything and before a request reaches the engine:
`open_service` checks the policy and the artifact without loading weights (a typo must not cost
a model load), and a body the API's models reject is a 400 whose OpenAI error object names the
field as the client wrote it, without pydantic's validator tags (FastAPI's TestClient)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from hybridspec.artifacts.artifact import save_artifact  # noqa: E402
from hybridspec.runtime import session  # noqa: E402
from hybridspec.serve.app import create_app  # noqa: E402
from hybridspec.serve.service import open_service  # noqa: E402
from tests.runtime.helpers import policy_parameters  # noqa: E402


@pytest.fixture
def foreign_artifact(tmp_path) -> Path:
    path = tmp_path / "foreign.safetensors"
    save_artifact(path, policy_parameters(), model_id="sha256:other-model", drafter_id="sha256:other-drafter",
                  device="cpu", store_digest="none", diagnostics={})
    return path


@pytest.mark.parametrize("options, message", [
    ({"artifact": Path("nope.safetensors")}, "nope.safetensors: no such artifact file"),
    ({"policy": "sometimes"}, "unknown policy 'sometimes'"),
    ({"policy": "static:99"}, "static:99: length must be in 2"),
    ({"policy": "hybridspec"}, "needs --artifact"),
    ({"artifact": "foreign"}, "sha256:other-model"),
])
def test_a_bad_policy_or_artifact_fails_before_any_weights_load(monkeypatch, foreign_artifact, options, message):
    def loaded(*args, **kwargs):
        pytest.fail("a model was loaded before the policy and the artifact were checked")

    monkeypatch.setattr(session, "load_target", loaded)
    monkeypatch.setattr(session, "load_drafter", loaded)
    if options.get("artifact") == "foreign":
        options = {**options, "artifact": foreign_artifact}
    with pytest.raises(ValueError, match=message):
        open_service(**options)


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(open_service(model="random-tiny", policy="ar", max_context=64))) as test_client:
        yield test_client


@pytest.mark.parametrize("path, body, param, message", [
    ("/v1/completions", {"prompt": {"a": 1}}, "prompt",
     "prompt: must be a string, token ids (integers), a list of strings or a list of token-id lists"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages",
     "messages.0: content is required (null only for an assistant message with tool_calls)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages",
     "messages.0.content: Input should be a valid string"),
    ("/v1/completions", '{"prompt": "x", "top_p": NaN}', "top_p", "top_p: Input should be a finite number"),
    ("/v1/completions", '{"prompt": "x", "top_p": Infinity}', "top_p", "top_p: Input should be a finite number"),
    ("/v1/completions", '{"prompt": "x", "temperature": NaN}', "temperature",
     "temperature: Input should be a finite number"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop", "stop: Input should be a valid string"),
])
def test_validation_errors_name_the_field_plainly(client, path, body, param, message):
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                         "code": 400}}


def test_the_default_policy_is_prepared_at_start_up(monkeypatch):
    """`serve` captures the default policy's greedy graphs before it listens (a no-op without a
    resident round, as on CPU): the first request does not pay for them."""
    from hybridspec.runtime.engine import Engine

    prepared = []
    monkeypatch.setattr(Engine, "prepare", lambda self, policy, sampling=None, logprobs=False, grammar=False: prepared.append(policy))
    service = open_service(model="random-tiny", policy="static:4", max_context=64)
    assert prepared == [service.default_policy] and service.default_policy.name == "static:4"
