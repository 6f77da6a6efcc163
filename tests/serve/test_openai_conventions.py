"""What clients of OpenAI's and vLLM's servers rely on beyond the field checks: null as a field's
default, token-id prompts and batches of prompts, character offsets, stop sequences against
partial characters, fields that need another, text content parts, CORS."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("uvicorn")

from hybridspec.serve.app import TextOffsets  # noqa: E402
from hybridspec.serve.service import open_service  # noqa: E402
from tests.serve.live import live_server  # noqa: E402

PROMPT = "def add(a, b):\n    return"
COMPLETION = "/v1/completions"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "add two numbers"}]


@pytest.fixture(scope="module")
def service():
    return open_service(policy="ar", max_context=256)


@pytest.fixture(scope="module")
def server(service):
    with live_server(service) as (base, _):
        yield base


def _post(server: str, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server}{path}", json=body, timeout=60, **kw)


def _error_param(response: httpx.Response) -> str | None:
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


def test_null_reads_as_the_field_default(server):
    """OpenAI's fields take null as their default (clients that pass None send it): the same output
    as without the fields."""
    nulls = {name: None for name in ("temperature", "top_p", "top_k", "n", "stream", "presence_penalty",
                                     "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "stop",
                                     "stream_options", "ignore_eos", "include_stop_str_in_output",
                                     "stop_token_ids", "logit_bias", "max_tokens", "user")}
    for path, body in ((COMPLETION, {"prompt": PROMPT, "echo": None}),
                       (CHAT, {"messages": MESSAGES, "parallel_tool_calls": None, "logprobs": None})):
        base = {**body, "seed": 7, "max_tokens": 6}
        plain = _post(server, path, base)
        with_nulls = _post(server, path, {**nulls, **base})
        assert plain.status_code == with_nulls.status_code == 200, with_nulls.text
        strip = lambda r: [c.get("text", c.get("message")) for c in r.json()["choices"]]  # noqa: E731
        assert strip(with_nulls) == strip(plain)


def test_token_id_prompts_and_batches(server, service):
    """A prompt as token ids, a one-item list of them (lm-evaluation-harness's form), and a batch
    of prompts: prompt p's choice j is choice p·n + j, each as its own request decodes it; usage
    counts each prompt once; a bad prompt of a batch is named by its index."""
    ids = service.session.codec.encode(PROMPT)
    other = service.session.codec.encode("import os\n")
    greedy = {"max_tokens": 5, "temperature": 0}
    alone = [_post(server, COMPLETION, {"prompt": p, **greedy}).json() for p in (ids, other)]
    assert _post(server, COMPLETION, {"prompt": [ids], **greedy}).json()["choices"] == alone[0]["choices"]
    batch = _post(server, COMPLETION, {"prompt": [ids, other], "n": 2, **greedy}).json()
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in batch["choices"]] == [a["choices"][0]["text"] for a in alone for _ in range(2)]
    assert batch["usage"]["prompt_tokens"] == len(ids) + len(other)
    assert batch["usage"]["completion_tokens"] == 2 * sum(a["usage"]["completion_tokens"] for a in alone)
    texts = _post(server, COMPLETION, {"prompt": [PROMPT, "import os\n"], **greedy}).json()["choices"]
    assert [c["text"] for c in texts] == [a["choices"][0]["text"] for a in alone]
    echoed = _post(server, COMPLETION, {"prompt": [PROMPT, "import os\n"], "echo": True, **greedy}).json()["choices"]
    assert [c["text"] for c in echoed] == [p + c["text"] for p, c in zip((PROMPT, "import os\n"), texts)]
    streamed = httpx.post(f"{server}{COMPLETION}", json={"prompt": [ids, other], "n": 2, "stream": True, **greedy},
                          timeout=60)
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    joined = {i: "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in range(4)}
    assert list(joined.values()) == [c["text"] for c in batch["choices"]]
    assert _error_param(_post(server, COMPLETION, {"prompt": [ids, []], **greedy})) == "prompt.1"
    for mixed in (["1", 2], [True, 2], [[True]], [1, "a"], [ids, "x"]):  # token ids are JSON integers
        refused = _post(server, COMPLETION, {"prompt": mixed, **greedy})
        assert _error_param(refused) == "prompt" and "token ids" in refused.json()["error"]["message"], mixed
    assert _error_param(_post(server, COMPLETION, {"prompt": [ids] * 5, "n": 16, **greedy})) == "prompt"


def test_text_offsets_count_the_characters_before_each_token():
    """A token that ends inside a UTF-8 character moves the offset only once the character is whole."""
    offsets = TextOffsets()
    smile = "😀".encode()
    assert [offsets.take(b) for b in (b"a", smile[:2], smile[2:], b"bc", "é".encode(), b"\xff", b"d")] == \
        [0, 1, 1, 2, 4, 5, 6]  # "a😀bcé\ufffdd"
    cut = TextOffsets()  # a character that never completes is one U+FFFD before the next one
    assert [cut.take(b) for b in (b"\xe2\x82", b"a", b"b", smile[:1], "é".encode())] == [0, 1, 2, 3, 4]


def test_fields_that_need_another_are_refused(server):
    assert _error_param(_post(server, COMPLETION, {"prompt": PROMPT, "stream_options": {"include_usage": True}})) \
        == "stream_options"
    assert _error_param(_post(server, CHAT, {"messages": MESSAGES, "tool_choice": "auto"})) == "tool_choice"
    assert _error_param(_post(server, CHAT, {"messages": MESSAGES, "tool_choice": "required", "tools": []})) \
        == "tool_choice"
    for fine in ({"tool_choice": "none"}, {"tool_choice": "auto", "tools": []}):  # as vLLM: an empty list is tools
        assert _post(server, CHAT, {"messages": MESSAGES, "max_tokens": 1, **fine}).status_code == 200


def test_text_parts_are_joined_by_newlines_and_other_parts_are_named(server):
    parts = [{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}]
    joined = [{"role": "user", "content": "ab\ncd"}]
    assert _post(server, "/tokenize", {"messages": parts}).json() == _post(server, "/tokenize", {"messages": joined}).json()
    image = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {}}]}]
    refused = _post(server, CHAT, {"messages": image})
    assert _error_param(refused) == "messages" and "image_url" in refused.json()["error"]["message"]


def test_cors_only_for_the_allowed_origins(service, server):
    """--allowed-origin: a browser's preflight (sent without the API key) and the answers carry the
    CORS headers for that origin; a server started without it sends none."""
    preflight = {"Origin": "http://a.test", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with live_server(service, api_key="k", allowed_origins=("http://a.test",)) as (base, _):
        answer = httpx.options(f"{base}{COMPLETION}", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://a.test"
        ok = _post(base, COMPLETION, {"prompt": PROMPT, "max_tokens": 1},
                   headers={"Origin": "http://a.test", "Authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://a.test"
        keyless = _post(base, COMPLETION, {"prompt": PROMPT}, headers={"Origin": "http://a.test"})
        assert keyless.status_code == 401 and keyless.headers["access-control-allow-origin"] == "http://a.test"
        other = httpx.options(f"{base}{COMPLETION}", headers={**preflight, "Origin": "http://b.test"})
        assert "access-control-allow-origin" not in other.headers
    plain = httpx.options(f"{server}{COMPLETION}", headers=preflight)
    assert plain.status_code == 405 and "access-control-allow-origin" not in plain.headers


def test_a_grammar_that_compiles_too_long_is_refused_and_the_server_goes_on(server, service, monkeypatch):
    """--grammar-timeout: a compile past it is a 400 naming the constraint's field; tokenizing and
    other requests do not wait behind it (it runs on the grammar pool), and a later request with the
    same grammar, compiled by then, runs."""
    compiler = service.grammar_compiler()
    compile_ = compiler.compile
    released = threading.Event()

    def slow(spec):
        released.wait(30)
        return compile_(spec)

    monkeypatch.setattr(compiler, "compile", slow)
    monkeypatch.setattr(service, "grammar_timeout", 0.2)
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "guided_regex": "[a-z]+"}
    refused = _post(server, COMPLETION, body)
    assert _error_param(refused) == "guided_regex" and "0.2 s" in refused.json()["error"]["message"]
    assert _post(server, "/tokenize", {"prompt": PROMPT}).status_code == 200  # while the compile still runs
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 2}).status_code == 200
    assert _post(server, COMPLETION, {**body, "guided_regex": "[0-9]+"}).status_code == 400  # a second one overruns
    busy = _post(server, COMPLETION, {**body, "guided_regex": "[a-c]+"})  # two still run: refused at once
    assert busy.status_code == 503 and busy.json()["error"]["param"] == "guided_regex"
    released.set()
    monkeypatch.undo()
    deadline = time.monotonic() + 30
    while service.overrun and time.monotonic() < deadline:  # the overrun compiles end once released
        time.sleep(0.05)
    text = _post(server, COMPLETION, body).json()["choices"][0]["text"]
    assert text and text.isalpha() and text.islower()
