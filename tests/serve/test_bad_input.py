"""Bad input never crashes the server: every case gets a 4xx (or a 500 / an error event when the
engine itself fails) as an OpenAI error object naming the field, the server keeps answering, and
/metrics counts every response by status."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("uvicorn")

from hybridspec.serve.service import open_service  # noqa: E402
from tests.serve.live import live_server  # noqa: E402
from tests.serve.scrape import scrape  # noqa: E402

KEY = "k-secret"
CAP = 32 * 1024
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def service():
    return open_service(policy="ar", max_context=256)


@pytest.fixture(scope="module")
def live(service):
    with live_server(service, api_key=KEY, max_request_bytes=CAP) as (base, thread):
        yield base, thread


@pytest.fixture(scope="module")
def server(live):
    return live[0]


def _post(server: str, path: str, body, headers=None, **kw) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) or hasattr(body, "__next__") else json.dumps(body)
    return httpx.post(f"{server}{path}", content=content, timeout=60,
                      headers={**AUTH, "Content-Type": "application/json", **(headers or {})}, **kw)


def _metrics(server: str, **labels) -> dict[str, float]:
    return scrape(httpx.get(f"{server}/metrics").text, **labels)


def _assert_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == param, error
    return error


COMPLETION = "/v1/completions"
CHAT = "/v1/chat/completions"
SURROGATE = '"\\ud800"'  # JSON text of a lone surrogate


@pytest.mark.parametrize("path, body, param", [
    (COMPLETION, {"prompt": PROMPT, "seed": 2**70}, "seed"),
    (COMPLETION, {"prompt": PROMPT, "seed": -(2**63) - 1}, "seed"),
    (COMPLETION, {"prompt": PROMPT, "seed": 2**70, "stream": True}, "seed"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "seed": 2**64, "stream": True}, "seed"),
    (COMPLETION, '{"prompt": ' + SURROGATE + '}', "prompt"),
    (COMPLETION, '{"prompt": ["a", ' + SURROGATE + ']}', "prompt"),
    (COMPLETION, '{"prompt": "x", "stop": ' + SURROGATE + '}', "stop"),
    (CHAT, '{"messages": [{"role": "user", "content": ' + SURROGATE + '}]}', "messages"),
    (CHAT, '{"stream": true, "messages": [{"role": "user", "content": [{"type": "text", "text": '
     + SURROGATE + '}]}]}', "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": None}]}, "messages"),
    (COMPLETION, {"prompt": PROMPT, "temperature": float("nan")}, "temperature"),
    (COMPLETION, {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
    (COMPLETION, {"prompt": PROMPT, "logprobs": True}, "logprobs"),  # a count, not a switch
    (COMPLETION, {"prompt": PROMPT, "presence_penalty": 2.5}, "presence_penalty"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "frequency_penalty": -3}, "frequency_penalty"),
    (COMPLETION, {"prompt": PROMPT, "repetition_penalty": 0}, "repetition_penalty"),
    (COMPLETION, {"prompt": PROMPT, "logit_bias": {"abc": 1}}, "logit_bias"),
    (COMPLETION, {"prompt": PROMPT, "logit_bias": {"\u00b2": 1}}, "logit_bias"),  # a digit to isdigit, not to int
    (COMPLETION, {"prompt": PROMPT, "min_p": 1.5}, "min_p"),
    (COMPLETION, {"prompt": PROMPT, "logit_bias": {"99999999": 1}}, "logit_bias"),
    (COMPLETION, {"prompt": PROMPT, "logit_bias": {"5": 101}}, "logit_bias"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    (COMPLETION, {"prompt": PROMPT, "logprobs": -1, "stream": True}, "logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (COMPLETION, "[1, 2]", "body"),
    (COMPLETION, b'{"prompt": "\xff\xfe"}', "body"),  # not UTF-8: the body cannot be parsed
    (COMPLETION, "[" * 10_000 + "]" * 10_000, "body"),  # deeper than the JSON parser's recursion
])
def test_bad_bodies_get_400_naming_the_field(server, path, body, param):
    before = _metrics(server, status="400")
    _assert_error(_post(server, path, body), 400, param)
    assert _metrics(server, status="400")["hybridspec:http_responses_total"] == \
        before.get("hybridspec:http_responses_total", 0) + 1
    assert httpx.get(f"{server}/health").status_code == 200


@pytest.mark.parametrize("field, value", [
    ("best_of", 2), ("prompt_logprobs", 1), ("top_logprobs", 3), ("suffix", "x"), ("tools", [{"type": "function"}]),
    ("tool_choice", "required"), ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("guided_whitespace_pattern", " "), ("n", 17), ("n", 0),
])
def test_unsupported_sampling_fields_are_refused_by_name(server, field, value):
    for path, body in ((COMPLETION, {"prompt": PROMPT}), (CHAT, {"messages": [{"role": "user", "content": "x"}]})):
        _assert_error(_post(server, path, {**body, "max_tokens": 1, field: value}), 400, field)


MESSAGES = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("path, field, value", [
    (COMPLETION, "max_tokens", True), (CHAT, "max_tokens", "4"), (CHAT, "max_completion_tokens", 4.0),
    (COMPLETION, "n", True), (CHAT, "seed", "7"), (COMPLETION, "seed", 1e3), (COMPLETION, "top_k", 1.0),
    (CHAT, "temperature", True), (COMPLETION, "temperature", "0.5"), (CHAT, "top_p", "1"),
    (COMPLETION, "presence_penalty", False), (COMPLETION, "min_tokens", True),
    (COMPLETION, "stream", "yes"), (CHAT, "stream", 1), (COMPLETION, "echo", "on"), (CHAT, "logprobs", 1),
    (COMPLETION, "ignore_eos", "true"), (CHAT, "stop_token_ids", [True]), (COMPLETION, "logit_bias", {"5": "1"}),
    (CHAT, "stream_options", {"include_usage": "yes"}), (CHAT, "parallel_tool_calls", 0),
    (COMPLETION, "skip_special_tokens", "true"), (CHAT, "skip_special_tokens", 1),
    (CHAT, "spaces_between_special_tokens", "false"),
    (CHAT, "tools", [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]),
])
def test_values_of_another_json_type_are_refused_not_coerced(server, path, field, value):
    """A value of the wrong JSON type is a 400 naming its field, as OpenAI's API answers it, never read
    as what pydantic's lax mode makes of it (`true` as 1, `"yes"` as true, `"0.5"` as 0.5)."""
    body = {"prompt": PROMPT} if path == COMPLETION else {"messages": MESSAGES}
    stream = {"stream": True} if field == "stream_options" else {}
    _assert_error(_post(server, path, {**body, "max_tokens": 1, **stream, field: value}), 400, field)


def test_integers_read_as_numbers_and_reserved_template_variables_are_refused_on_tokenize_too(server):
    for path, body in ((COMPLETION, {"prompt": PROMPT}), (CHAT, {"messages": MESSAGES})):
        ok = _post(server, path, {**body, "max_tokens": 1, "temperature": 0, "top_p": 1, "presence_penalty": 0})
        assert ok.status_code == 200, ok.text
    for path in (CHAT, "/tokenize"):  # named before the template runs (it would fail on a second `tools`)
        error = _assert_error(_post(server, path, {"messages": MESSAGES, "chat_template_kwargs": {"tools": 1}}), 400,
                              "chat_template_kwargs")
        assert error["message"].endswith("tools cannot be set through chat_template_kwargs"), error


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_under_another_content_type_is_named(server, content_type):
    """curl -d sends a form's Content-Type, under which the body is not read as JSON: the error says so."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1})
    error = _assert_error(_post(server, COMPLETION, body, headers={"Content-Type": content_type}), 400, "body")
    assert "Content-Type: application/json" in error["message"]
    for empty in ("null", "[]", ""):
        assert _assert_error(_post(server, CHAT, empty), 400, "body")["message"] == "the body must be a JSON object"


def test_echo_is_refused_on_chat_only(server):
    _assert_error(_post(server, CHAT, {"messages": [{"role": "user", "content": "x"}], "echo": True}), 400, "echo")
    off = _post(server, CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": None})
    assert off.status_code == 200 and off.json()["choices"][0]["logprobs"] is None
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 1, "echo": True}).status_code == 200


def test_fields_at_their_off_value_seed_and_stop_keep_working(server):
    off = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 1, "echo": False,
           "logprobs": None, "n": 1, "tools": [], "tool_choice": "none", "user": "me"}
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 2**63 - 1, **off}
    first, second = (_post(server, COMPLETION, body).json() for _ in range(2))
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    stop = first["choices"][0]["text"].strip()[:2] or "\n"
    cut = _post(server, COMPLETION, {**body, "stop": [stop]}).json()["choices"][0]
    assert stop not in cut["text"]


def test_a_tiny_temperature_decodes_greedily(server):
    out = [_post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 6, "temperature": t}).json()
           for t in (0, 1e-300)]
    assert out[0]["choices"][0]["text"] == out[1]["choices"][0]["text"]


def test_tokenize_and_detokenize(server, service):
    """vLLM's /tokenize gives the ids the completions and chat endpoints decode from (a chat's count
    is its completion's prompt_tokens), with the vocabulary's strings when asked; /detokenize gives
    the text back; bad input is a 4xx naming the field; both need the API key."""
    ids = service.session.codec.encode(PROMPT)
    out = _post(server, "/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()
    assert (out["tokens"], out["count"], out["max_model_len"]) == (ids, len(ids), 256)
    assert out["token_strs"] == [service.session.codec.tokenizer.id_to_token(i) for i in ids]
    assert _post(server, "/detokenize", {"tokens": ids}).json() == {"prompt": PROMPT}
    messages = [{"role": "user", "content": "add two numbers"}]
    chat = _post(server, "/tokenize", {"messages": messages}).json()
    assert chat["token_strs"] is None
    usage = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"] == len(chat["tokens"])
    _assert_error(_post(server, "/tokenize", {"prompt": PROMPT, "messages": messages}), 400, "prompt")
    _assert_error(_post(server, "/tokenize", {"messages": []}), 400, "messages")
    _assert_error(_post(server, "/tokenize", {"prompt": PROMPT, "chat_template_kwargs": {}}), 400, "chat_template_kwargs")
    for field, value in (("add_generation_prompt", False), ("continue_final_message", True), ("chat_template", "x")):
        _assert_error(_post(server, "/tokenize", {"messages": messages, field: value}), 400, field)
    assert _post(server, "/tokenize", {"messages": messages, "add_generation_prompt": True}).json() == chat
    _assert_error(_post(server, "/detokenize", {"tokens": [True]}), 400, "tokens")
    _assert_error(_post(server, "/tokenize", {"prompt": PROMPT, "model": "other"}), 404, "model")
    _assert_error(_post(server, "/detokenize", {"tokens": [1, 10**9]}), 400, "tokens")
    _assert_error(_post(server, "/detokenize", {"tokens": "abc"}), 400, "tokens")
    _assert_error(_post(server, "/tokenize", {"prompt": PROMPT}, headers={"Authorization": "Bearer nope"}), 401, None)


def test_405_404_and_bearer_in_any_case(server):
    wrong_method = httpx.get(f"{server}{COMPLETION}", headers=AUTH)
    _assert_error(wrong_method, 405, None)
    assert "POST" in wrong_method.headers["allow"]
    _assert_error(httpx.get(f"{server}/v1/nothing", headers=AUTH), 404, None)
    for scheme in ("bearer", "BEARER", "Bearer"):
        headers = {"Authorization": f"{scheme} {KEY}"}
        assert httpx.get(f"{server}/v1/models", headers=headers).status_code == 200
    _assert_error(httpx.get(f"{server}/v1/models", headers={"Authorization": "Bearer k-secreT"}), 401, None)
    _assert_error(httpx.get(f"{server}/v1/models", headers={"Authorization": KEY}),
                  401, None)


def test_body_over_the_cap_is_413_before_parsing_with_or_without_a_length(server):
    big = {"prompt": "x" * CAP}
    _assert_error(_post(server, COMPLETION, big), 413, "body")

    def chunks():
        data = json.dumps(big).encode()
        for i in range(0, len(data), 4096):
            yield data[i:i + 4096]

    _assert_error(_post(server, COMPLETION, chunks()), 413, "body")  # chunked: no Content-Length
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_tokenizing_runs_off_the_event_loop(live, service, monkeypatch):
    server, loop_thread = live
    seen = []
    encode = service.session.codec.encode
    monkeypatch.setattr(service.session.codec, "encode", lambda text: seen.append(threading.current_thread())
                        or encode(text))
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 1}).status_code == 200
    assert _post(server, CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).status_code == 200
    assert len(seen) == 2 and loop_thread not in seen


def _wait_for(condition, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_clients_that_leave_are_cancelled_running_or_queued(server, service):
    cancelled = "hybridspec:request_cancelled_total"
    before = _metrics(server).get(cancelled, 0)
    long_body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0}
    with httpx.stream("POST", f"{server}{COMPLETION}", headers=AUTH, json={**long_body, "stream": True},
                      timeout=60) as running:  # holds the engine
        lines = running.iter_lines()  # kept open: a closed iterator would close the stream
        next(line for line in lines if line.startswith("data:"))
        with pytest.raises(httpx.TimeoutException):  # queued behind it, then gone
            httpx.post(f"{server}{COMPLETION}", headers=AUTH, json=long_body, timeout=0.5)
        _wait_for(lambda: _metrics(server).get(cancelled, 0) == before + 1, "the queued request was not dropped")
        assert _metrics(server)["hybridspec:num_requests_waiting"] == 0
        assert _metrics(server)["hybridspec:num_requests_running"] == 1  # the stream still runs
    _wait_for(lambda: _metrics(server).get(cancelled, 0) == before + 2, "the stream was not cancelled")
    tokens = _metrics(server)["hybridspec:generation_tokens_total"]
    with pytest.raises(httpx.TimeoutException):  # running, not streamed, then gone
        httpx.post(f"{server}{COMPLETION}", headers=AUTH, json=long_body, timeout=0.3)
    _wait_for(lambda: _metrics(server).get(cancelled, 0) == before + 3, "the running request was not cancelled")
    assert _metrics(server)["hybridspec:generation_tokens_total"] - tokens < 200
    assert _metrics(server, status="499")["hybridspec:http_responses_total"] >= 2
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_engine_failures_are_500_objects_or_an_error_event_then_done(server, service, monkeypatch):
    def broken_stream(*args, **kwargs):
        yield [1], None
        raise RuntimeError("engine broke")

    monkeypatch.setattr(service.session.engine, "stream", broken_stream)
    before = _metrics(server)
    error = _assert_error(_post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 4}), 500, None)
    assert error["type"] == "server_error"
    events = [line for line in _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 4, "stream": True})
              .text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 500 and events[-1] == "data: [DONE]"
    after = _metrics(server)
    assert after["hybridspec:request_failed_total"] - before.get("hybridspec:request_failed_total", 0) == 2
    assert after.get("hybridspec:request_cancelled_total", 0) == before.get("hybridspec:request_cancelled_total", 0)
    assert _metrics(server, status="500")["hybridspec:http_responses_total"] >= 1
    monkeypatch.undo()
    assert _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def _valid(i: int) -> tuple[str, dict]:
    stream = i % 4 >= 2
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    if i % 2:
        return CHAT, {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 3, "seed": i, **extra}
    return COMPLETION, {"prompt": f"{PROMPT} {i}", "max_tokens": 3, "seed": i, **extra}


BAD = [  # (path, body, headers, status)
    (COMPLETION, {"prompt": PROMPT, "seed": 2**70}, {}, 400),
    (COMPLETION, {"prompt": PROMPT, "seed": 2**70, "stream": True}, {}, 400),
    (COMPLETION, '{"prompt": ' + SURROGATE + '}', {}, 400),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, {}, 400),
    (COMPLETION, {"prompt": PROMPT, "presence_penalty": 3.0}, {}, 400),
    (COMPLETION, "{not json", {}, 400),
    (COMPLETION, {"prompt": "x" * CAP}, {}, 413),
    (COMPLETION, {"prompt": PROMPT}, {"Authorization": "Bearer wrong"}, 401),
]


def _usage(response: httpx.Response, stream: bool) -> dict:
    if not stream:
        return response.json()["usage"]
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return json.loads(events[-2])["usage"]


def test_sixteen_clients_mixing_valid_and_bad_requests(server):
    from concurrent.futures import ThreadPoolExecutor

    before = httpx.get(f"{server}/metrics").text

    def client(c: int) -> list:
        out = []
        for r in range(4):
            path, body = _valid(c * 4 + r)
            response = _post(server, path, body)
            out.append(("valid", response.status_code, _usage(response, body.get("stream", False))
                        if response.status_code == 200 else response.text))
            bad_path, bad_body, headers, status = BAD[(c + r) % len(BAD)]
            out.append(("bad", _post(server, bad_path, bad_body, headers).status_code, status))
        if c % 4 == 0:
            out.append(("bad", httpx.get(f"{server}{COMPLETION}", headers=AUTH).status_code, 405))
        return out

    with ThreadPoolExecutor(16) as pool:
        results = [r for rs in pool.map(client, range(16)) for r in rs]
    valid = [usage for kind, status, usage in results if kind == "valid" and status == 200]
    assert len(valid) == 64, [r for r in results if r[0] == "valid" and r[1] != 200][:3]
    assert all(status == want for kind, status, want in results if kind == "bad")
    after = httpx.get(f"{server}/metrics").text

    def delta(name: str, **labels) -> float:
        return scrape(after, **labels).get(name, 0) - scrape(before, **labels).get(name, 0)

    assert delta("hybridspec:request_success_total") == 64
    assert delta("hybridspec:prompt_tokens_total") == sum(u["prompt_tokens"] for u in valid)
    assert delta("hybridspec:generation_tokens_total") == sum(u["completion_tokens"] for u in valid)
    assert delta("hybridspec:request_cancelled_total") == delta("hybridspec:request_failed_total") == 0
    responses = "hybridspec:http_responses_total"
    assert delta(responses, path=COMPLETION, status="200") + delta(responses, path=CHAT, status="200") == 64
    bad = [want for kind, _, want in results if kind == "bad"]
    for status in (400, 401, 405, 413):
        assert delta(responses, status=str(status)) == bad.count(status), status
    assert scrape(after)["hybridspec:num_requests_waiting"] == 0


def test_responses_are_counted_by_the_route_that_answered(server):
    """`http_responses_total`'s path label: each route by its own path (its template where it takes a
    parameter), a request refused before routing by the path it asked for, anything else "other"."""
    def count(path: str, status: str) -> float:
        return _metrics(server, path=path, status=status).get("hybridspec:http_responses_total", 0)

    asks = [(lambda: _post(server, "/tokenize", {"prompt": PROMPT}), "/tokenize", "200"),
            (lambda: _post(server, "/detokenize", {"tokens": [1, 2]}), "/detokenize", "200"),
            (lambda: httpx.get(f"{server}/version"), "/version", "200"),
            (lambda: httpx.get(f"{server}/v1/models/someone/else", headers=AUTH), "/v1/models/{model:path}", "404"),
            (lambda: httpx.get(f"{server}/v1/models", headers={"Authorization": "Bearer nope"}), "/v1/models", "401"),
            (lambda: httpx.get(f"{server}/nothing/here"), "other", "404")]
    for ask, path, status in asks:
        before = count(path, status)
        assert str(ask().status_code) == status, path
        assert count(path, status) == before + 1, path
    assert not _metrics(server, path="/nothing/here")


def test_one_access_log_line_per_request(server, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="hybridspec.access"):
        _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 2})
        _post(server, COMPLETION, {"prompt": PROMPT, "seed": 2**70})
        three = _post(server, COMPLETION, {"prompt": PROMPT, "max_tokens": 3, "n": 3, "temperature": 1, "seed": 1})
        batch = _post(server, COMPLETION, {"prompt": [PROMPT, "import os"], "max_tokens": 2, "n": 2,
                                           "ignore_eos": True})
        access = lambda: [r.getMessage() for r in caplog.records if r.name == "hybridspec.access"]  # noqa: E731
        _wait_for(lambda: len(access()) >= 4, "no access-log line")  # written just after the response is sent
    lines = access()
    assert len(lines) == 4
    assert '"POST /v1/completions" 200 tokens=' in lines[0] and lines[0].endswith("s")
    assert '"POST /v1/completions" 400' in lines[1]
    usage = three.json()["usage"]  # n = 3: the prompt once, then each choice's tokens
    assert f"tokens={usage['prompt_tokens']}+3+3+3 " in lines[2] and usage["completion_tokens"] == 9
    assert f"tokens={batch.json()['usage']['prompt_tokens']}+2+2+2+2 " in lines[3]  # each prompt counted once
