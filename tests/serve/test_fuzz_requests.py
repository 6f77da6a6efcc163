"""Random JSON bodies against both endpoints, streamed or not: never a 5xx, every error an OpenAI
error object, every stream ending with `[DONE]`, and the server still answering afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("uvicorn")

from hybridspec.serve.service import open_service  # noqa: E402
from tests.serve.live import live_server  # noqa: E402

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
small_ints = st.integers(-2, 6) | st.integers()
texts = st.text(max_size=20) | json_values
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", ""]) | json_values},
    optional={"content": texts | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                                                optional={"text": texts}), max_size=2)}),
    max_size=3) | json_values
common = {"model": st.sampled_from(["hybridspec-embedded", "other"]) | json_values,
          "max_tokens": small_ints | json_values, "temperature": st.floats() | json_values,
          "top_p": st.floats() | json_values, "top_k": small_ints | json_values,
          "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=2) | json_values,
          "seed": st.integers() | json_values, "n": small_ints, "stream": st.booleans() | json_values,
          "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_values}),
          "policy": st.sampled_from(["ar", "full", "static:3", "static:99", "hybridspec", "x"]) | json_values,
          "presence_penalty": st.floats() | json_values, "logprobs": json_values, "echo": json_values,
          "spec_decode_stats": st.booleans() | json_values}
completion = st.fixed_dictionaries({"prompt": texts | st.lists(st.integers(-5, 300), max_size=4)}, optional=common)
chat = st.fixed_dictionaries({"messages": messages}, optional={**common, "max_completion_tokens": small_ints})
bodies = st.one_of(completion.map(lambda b: ("/v1/completions", b)), chat.map(lambda b: ("/v1/chat/completions", b)),
                   st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), json_values))


@pytest.fixture(scope="module")
def server():
    with live_server(open_service(policy="ar", max_context=48), max_request_bytes=4096) as (base, _):
        yield base


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies)
def test_random_bodies_never_crash_the_server(server, path_body):
    path, body = path_body
    response = httpx.post(f"{server}{path}", content=json.dumps(body), timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == response.status_code
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and not any('"error"' in e[:12] for e in events)
    else:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_server_still_answers_after_the_fuzz(server):
    assert httpx.get(f"{server}/health").status_code == 200
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "def f(", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
