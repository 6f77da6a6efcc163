"""The OpenAI-compatible server on a live loopback socket, with the official `openai` client."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import hybridspec  # noqa: E402
from hybridspec.artifacts.artifact import save_artifact  # noqa: E402
from hybridspec.runtime.generation import GenerateRequest, run_generate  # noqa: E402
from hybridspec.serve.service import open_service  # noqa: E402
from hybridspec.runtime.session import default_model, model_identity  # noqa: E402

from tests.runtime.helpers import policy_parameters  # noqa: E402
from tests.serve.live import live_server  # noqa: E402
from tests.serve.scrape import scrape  # noqa: E402

KEY = "test-key"
PROMPT = "def add(a, b):\n    return"
MODEL = "hybridspec-embedded"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    model, drafter = default_model()
    model_id, drafter_id = model_identity(model, drafter)
    path = tmp_path_factory.mktemp("serve") / "policy.safetensors"
    save_artifact(path, policy_parameters(), model_id=model_id, drafter_id=drafter_id, device="cpu",
                  store_digest="none", diagnostics={})
    return path


@pytest.fixture(scope="module")
def server(artifact):
    service = open_service(artifact=artifact, policy="hybridspec", max_context=512)
    with live_server(service, api_key=KEY) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def _metrics(server: str) -> dict[str, float]:
    """Sample name → value summed over its labels, read with prometheus_client's parser."""
    return scrape(httpx.get(f"{server}/metrics").text)


def test_completion_greedy_equals_generate(client, artifact):
    for policy in ("hybridspec", "ar"):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                        extra_body={"policy": policy})
        ref = run_generate(GenerateRequest(prompt=PROMPT, policy=policy, artifact=artifact, max_new_tokens=12))
        assert out.choices[0].text == ref["text"].replace("<|endoftext|>", "")
        assert out.choices[0].finish_reason == ("stop" if ref["finish_reason"] == "eos" else "length")
        assert out.usage.completion_tokens == len(ref["token_ids"])
        assert out.usage.prompt_tokens > 0 and out.choices[0].text


def test_completion_stream_matches_non_stream(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_continuous_usage_stats_count_the_tokens_so_far(client):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far, rising to
    the final usage chunk's."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    chunks = list(client.completions.create(**kw, stream_options={"include_usage": True,
                                                                  "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    final = chunks[-1].usage
    assert counts == sorted(counts) and 0 < counts[-1] == final.completion_tokens and not chunks[-1].choices
    assert {c.usage.prompt_tokens for c in chunks} == {final.prompt_tokens}
    assert all(c.usage is None for c in client.completions.create(**kw, stream_options={"include_usage": True})
               if c.choices)


def test_chat_stream_and_not(client):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "add two numbers"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    assert whole.choices[0].message.role == "assistant" and whole.usage.total_tokens > 0
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_sequence_cuts_text(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    stop = full.strip()[:2]
    assert stop, full
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert (out.choices[0].finish_reason, out.choices[0].stop_reason) == ("stop", stop)  # vLLM's stop_reason
    assert out.choices[0].text == full[: full.find(stop)]
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text
    assert [c.choices[0].stop_reason for c in streamed] == [None] * (len(streamed) - 1) + [stop]
    messages = [{"role": "user", "content": "add two numbers"}]
    said = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    chat_stop = said.choices[0].message.content.strip()[:2]
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, stop=chat_stop)
    assert (cut.choices[0].finish_reason, cut.choices[0].stop_reason) == ("stop", chat_stop)
    # vLLM's include_stop_str_in_output: the stop that ended the text stays in it, streamed or not
    kept = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                extra_body={"include_stop_str_in_output": True})
    with_stop = client.completions.create(**kept).choices[0]
    assert (with_stop.text, with_stop.finish_reason) == (full[: full.find(stop) + len(stop)], "stop")
    assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **kept)) == with_stop.text


def test_stop_token_ids_and_ignore_eos(tmp_path):
    """A stop token id ends the request as EOS does (in every policy, mid-round included) and stays
    out of the text unless include_stop_str_in_output; ignore_eos decodes past EOS. The model's EOS is set to a token that its greedy
    output emits, so that both paths are taken."""
    service = open_service(max_context=256)
    codec = service.session.codec
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)

        def complete(**extra):
            return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                             extra_body=extra).choices[0]

        ids = run_generate(GenerateRequest(prompt=PROMPT, policy="ar", max_new_tokens=12))["token_ids"]
        j = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # a token's first appearance
        for policy in ("ar", "full", "static:4"):
            out = complete(policy=policy, stop_token_ids=[ids[j]])
            assert (out.finish_reason, out.text, out.stop_reason) == ("stop", codec.decode(ids[:j]), ids[j]), policy
        kept = complete(stop_token_ids=[ids[j]], include_stop_str_in_output=True)  # vLLM's: the token's text stays
        assert (kept.text, kept.stop_reason) == (codec.decode(ids[: j + 1]), ids[j])
        assert complete(stop_token_ids=[ids[j]]).finish_reason == "stop"
        assert complete().stop_reason is None
        streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                                  extra_body={"stop_token_ids": [ids[j]]}))
        assert (streamed[-1].choices[0].finish_reason, streamed[-1].choices[0].stop_reason) == ("stop", ids[j])
        service.session.eos_ids = (ids[j],)
        eos = complete()
        assert (eos.finish_reason, eos.text, eos.stop_reason) == ("stop", codec.decode(ids[:j]), None)  # EOS: none
        past = complete(ignore_eos=True)  # the EOS is then an ordinary output token (here not a special one)
        assert past.finish_reason == "length"
        assert past.text == codec.decode(ids)
        ended = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                          extra_body={"stop_token_ids": [ids[j]], "ignore_eos": True})
        assert ended.usage.completion_tokens == j + 1  # a stop token id still ends it
        assert ended.choices[0].stop_reason == ids[j]  # as vLLM's: the stop token id, the EOS being ignored
        bad = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "stop_token_ids": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_token_ids"


def test_logprobs_completions_and_chat(client):
    """Logprobs, streamed or not, cover exactly the completion's tokens (a stop sequence cuts them
    with the tokens); a speculative policy gives the `ar` decoding's log-probabilities (raw, so
    the same under temperature); greedy tokens are their own first alternative."""
    def complete(policy, **extra):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3,
                                         extra_body={"policy": policy, **extra})

    spec, ar = complete("hybridspec"), complete("ar")
    for out in (spec, ar):
        lp = out.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens
        assert all(len(top) == 3 and max(top.values()) == pytest.approx(v, abs=1e-6)
                   for top, v in zip(lp.top_logprobs, lp.token_logprobs))
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert spec.choices[0].logprobs.tokens == ar.choices[0].logprobs.tokens
    assert spec.choices[0].logprobs.token_logprobs == pytest.approx(ar.choices[0].logprobs.token_logprobs, abs=2e-4)
    hot = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.5, seed=3, logprobs=0,
                                    extra_body={"policy": "ar"}).choices[0].logprobs
    assert all(v <= 0 for v in hot.token_logprobs)  # logprobs=0: each token's own entry only
    assert [list(top.items()) for top in hot.top_logprobs] == [[(t, v)] for t, v in zip(hot.tokens, hot.token_logprobs)]

    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3,
                                         stream=True, extra_body={"policy": "hybridspec"})
    tokens, values, offsets = [], [], []
    for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    want = spec.choices[0].logprobs
    assert (tokens, values, offsets) == (want.tokens, want.token_logprobs, want.text_offset)

    stop = spec.choices[0].text[4:7]  # a stop sequence inside the output: fewer tokens, as many logprobs
    cut = complete("hybridspec", stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert len(cut.choices[0].logprobs.tokens) == cut.usage.completion_tokens < spec.usage.completion_tokens
    assert cut.choices[0].logprobs.tokens == want.tokens[: cut.usage.completion_tokens]

    messages = [{"role": "user", "content": "Say something."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert entry.bytes == list(entry.token.encode("utf-8")) and len(entry.top_logprobs) == 2
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == chat.choices[0].message.content
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                            logprobs=True, stream=True)
    got = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob, e.top_logprobs) for e in got] == [(e.token, e.logprob, []) for e in content]


def test_echo_with_logprobs_scores_the_prompt(client):
    """echo: the prompt's text before the completion's and, with logprobs, the prompt's logprobs
    (none for its first token) before the completion's, as an evaluation harness scores a text;
    a token-id prompt echoes its decoded text. Streamed, the same in pieces."""
    ids = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1,
                                    extra_body={"policy": "ar"})
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1, echo=True,
                                    extra_body={"policy": "full"})
    choice, n_prompt = out.choices[0], out.usage.prompt_tokens
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == n_prompt + out.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[:n_prompt]) == PROMPT  # the embedded tokenizer's pieces join to the text
    assert lp.tokens[n_prompt] == ids.choices[0].logprobs.tokens[0]
    assert lp.token_logprobs[n_prompt] == pytest.approx(ids.choices[0].logprobs.token_logprobs[0], abs=2e-4)
    assert lp.text_offset[n_prompt] == len(PROMPT)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert plain.choices[0].text == choice.text and plain.choices[0].logprobs is None
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1,
                                         echo=True, stream=True, extra_body={"policy": "full"})
    pieces = [c.choices[0] for c in streamed if c.choices]
    assert "".join(p.text for p in pieces) == choice.text
    assert [v for p in pieces if p.logprobs for v in p.logprobs.token_logprobs] == lp.token_logprobs


def test_echo_with_max_tokens_0_gives_the_prompt_only(client):
    """OpenAI's scoring request (echo, max_tokens 0): the prompt's text and logprobs, those of the
    same prompt with a completion up to its last prompt token, no completion tokens; streamed, the
    same. Without echo, max_tokens 0 asks for nothing and is refused by name."""
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True)
    n_prompt = whole.usage.prompt_tokens
    for stream in (False, True):
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        out = client.completions.create(model=MODEL, prompt=[PROMPT, PROMPT], max_tokens=0, logprobs=1, echo=True,
                                        stream=stream, **usage)
        chunks = list(out) if stream else [out]
        assert chunks[-1].usage.completion_tokens == 0 and chunks[-1].usage.prompt_tokens == 2 * n_prompt
        for index in (0, 1):
            pieces = [c for chunk in chunks for c in chunk.choices if c.index == index]
            assert "".join(p.text for p in pieces) == PROMPT and pieces[-1].finish_reason == "length"
            token_logprobs = [v for p in pieces if p.logprobs for v in p.logprobs.token_logprobs]
            assert token_logprobs[0] is None
            assert token_logprobs[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:n_prompt], abs=2e-4)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"


def test_penalties_change_the_output_and_keep_speculation_exact(client):
    """presence/frequency/repetition penalties apply under greedy decoding; every policy emits the
    `ar` tokens under them (each verification row penalised for its own history)."""
    def complete(policy, **extra):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                         extra_body={"policy": policy, **extra}).choices[0].text

    penalties = dict(presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.2)
    ar = complete("ar", **penalties)
    assert ar != complete("ar")
    assert complete("hybridspec", **penalties) == complete("full", **penalties) == ar

    def usage_and_tokens(policy, **extra):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0,
                                        extra_body={"policy": policy, **extra})
        return out.usage.completion_tokens, out.choices[0].logprobs.tokens, out.choices[0].finish_reason

    hot = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.5, seed=9,
                                    extra_body={"policy": "hybridspec", "min_p": 1.0})
    assert hot.choices[0].text == complete("ar")  # min_p = 1 keeps the argmax alone

    forced = {"logit_bias": {"100": 100}}  # token 100 wins every row
    n, tokens, _ = usage_and_tokens("full", **forced)
    assert n == 8 and len(set(tokens)) == 1
    # token 100 also ends the request, but not among the first 3 output tokens
    assert usage_and_tokens("full", **forced, stop_token_ids=[100])[0::2] == (1, "stop")
    for policy in ("ar", "full", "hybridspec"):
        n, tokens, reason = usage_and_tokens(policy, **forced, stop_token_ids=[100], min_tokens=3)
        assert (n, reason) == (4, "stop") and tokens[0] != tokens[3], policy


def test_n_choices_decode_one_after_another(client):
    """n choices: choice i samples as a request with seed + i would, streamed or not; the usage
    counts the prompt once and every choice's tokens; greedy choices are equal."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, extra_body={"policy": "hybridspec"})
    out = client.completions.create(n=3, seed=40, **kw)
    singles = [client.completions.create(n=1, seed=40 + i, **kw) for i in range(3)]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [s.choices[0].text for s in singles]
    assert out.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert out.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    texts = ["", "", ""]
    for chunk in client.completions.create(n=3, seed=40, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in out.choices]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          temperature=0, n=2)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content == chat.choices[1].message.content


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "size": {"type": "integer"}},
          "required": ["name", "size"], "additionalProperties": False}


def test_structured_output_json_schema_regex_and_choice(client):
    """response_format (json_schema, json_object), structured_outputs and the guided_* fields hold
    the output to their grammar; greedy speculative policies give `ar`'s text; stream equals JSON."""
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    messages = [{"role": "user", "content": "An item as JSON:"}]
    chats = {policy: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                    response_format=fmt, extra_body={"policy": policy})
             for policy in ("ar", "hybridspec")}
    text = chats["ar"].choices[0].message.content
    assert chats["hybridspec"].choices[0].message.content == text and chats["ar"].choices[0].finish_reason == "stop"
    item = json.loads(text)
    assert set(item) == {"name", "size"} and isinstance(item["size"], int) and len(item["name"]) <= 10
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, response_format=fmt, stream=True,
        extra_body={"policy": "hybridspec"}) if c.choices)
    assert streamed == text
    anything = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0.8, seed=2,
                                              response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)
    for extra, check in (({"guided_regex": "[a-z]{3,8}"}, lambda t: t.isalpha() and 3 <= len(t) <= 8),
                         ({"structured_outputs": {"regex": "[0-9]{2}-[0-9]{2}"}}, lambda t: t[2] == "-"),
                         ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
                         ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
                         ({"guided_grammar": 'root ::= "x" [0-9] [0-9]? "y"'}, lambda t: t[0] == "x" and t[-1] == "y")):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                        extra_body={**extra, "policy": "hybridspec"}).choices[0]
        assert out.finish_reason == "stop" and check(out.text), (extra, out.text)


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_choice": ["a", ""]}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"jsonn": {}}}, "structured_outputs"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
    ({"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    ({"guided_grammar": "root ::= root"}, "guided_grammar"),  # a grammar that allows no output
    ({"guided_regex": "[a-", "max_tokens": 100000}, "max_tokens"),  # the request's own checks come first
])
def test_bad_output_constraints_are_named(server, client, body, param):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    response = httpx.post(f"{server}/v1/completions", headers=headers,
                          content=json.dumps({"prompt": PROMPT, "max_tokens": 4, **body}))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0).choices[0].text is not None


def test_min_tokens_holds_back_stop_sequences_too(client):
    """As vLLM: a stop sequence in the text of the first min_tokens tokens does not end the request."""
    kw = dict(model=MODEL, prompt=PROMPT, temperature=0, extra_body={"policy": "full"})
    free = client.completions.create(max_tokens=12, logprobs=0, **kw).choices[0]
    tokens, offsets = free.logprobs.tokens, free.logprobs.text_offset
    i = next(i for i in range(1, 8) if tokens[i].strip() and tokens[i] not in free.text[: offsets[i]])
    stop = tokens[i]  # its first appearance: a stop there ends the request at token i
    assert client.completions.create(max_tokens=12, stop=[stop], **kw).usage.completion_tokens == i + 1
    extra = {**kw["extra_body"], "min_tokens": i + 3}
    held = client.completions.create(max_tokens=12, stop=[stop], **{**kw, "extra_body": extra})
    assert held.usage.completion_tokens > i + 3 and held.choices[0].text.startswith(free.text[: offsets[i + 3]])


def test_models_health_and_auth(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert (card.id, card.parent, card.max_model_len) == (MODEL, None, 512) and card.root.endswith("target")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("other/model")
    assert httpx.get(f"{server}/health").status_code == 200
    assert httpx.get(f"{server}/version").json() == {"version": hybridspec.__version__}  # vLLM's, open as /health
    assert httpx.get(f"{server}/v1/models").status_code == 401
    bad = httpx.post(f"{server}/v1/completions", headers={"Authorization": "Bearer nope"},
                     json={"prompt": "x", "max_tokens": 2})
    assert bad.status_code == 401


@pytest.mark.parametrize("body, param", [
    ("{not json", "body"),
    ({"prompt": PROMPT, "max_tokens": -1}, "max_tokens"),
    ({"prompt": PROMPT, "temperature": -0.5}, "temperature"),
    ({"prompt": PROMPT, "policy": "bogus"}, "policy"),
    ({"prompt": PROMPT, "policy": "static:1"}, "policy"),
    ({"prompt": PROMPT, "n": 17}, "n"),
    ({"prompt": "x " * 600, "max_tokens": 2}, "prompt"),
    ({"prompt": PROMPT, "max_tokens": 600}, "max_tokens"),
    ({"prompt": PROMPT, "model": "other"}, "model"),
])
def test_bad_request_names_field_and_server_keeps_serving(server, client, body, param):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{server}/v1/completions", headers=headers, content=content)
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["param"] == param
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0).choices[0].text is not None


def test_disconnect_mid_stream_cancels(server, client):
    before = _metrics(server)
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "policy": "ar", "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", headers=headers, json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    deadline = time.monotonic() + 20
    cancelled = "hybridspec:request_cancelled_total"
    while _metrics(server).get(cancelled, 0) == before.get(cancelled, 0):
        assert time.monotonic() < deadline, "the disconnected request was not cancelled"
        time.sleep(0.05)
    after = _metrics(server)
    assert after["hybridspec:generation_tokens_total"] - before["hybridspec:generation_tokens_total"] < 400
    assert httpx.get(f"{server}/health").status_code == 200
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3).usage.completion_tokens >= 1


def test_load_all_succeed_and_metrics_equal_usage(server, client):
    before = _metrics(server)
    policies = ("ar", "full", "hybridspec", "static:4")

    before_text = httpx.get(f"{server}/metrics").text

    def worker(c: int) -> list:
        out = []
        for r in range(10):
            kw = dict(model=MODEL, max_tokens=4, temperature=0.7, seed=c * 10 + r, extra_body={"policy": policies[c % 4]})
            if r % 2:
                out.append((policies[c % 4], client.completions.create(prompt=f"{PROMPT} {r}", **kw).usage))
            else:
                out.append((policies[c % 4], client.chat.completions.create(
                    messages=[{"role": "user", "content": f"hi {r}"}], **kw).usage))
        return out

    with ThreadPoolExecutor(8) as pool:
        labelled = [u for us in pool.map(worker, range(8)) for u in us]
    usages = [u for _, u in labelled]
    assert len(usages) == 80
    after_text = httpx.get(f"{server}/metrics").text
    for policy in policies:  # per label: each policy's counters equal its own requests' usage
        mine = [u for p, u in labelled if p == policy]
        got = {k: scrape(after_text, policy=policy).get(k, 0) - scrape(before_text, policy=policy).get(k, 0)
               for k in ("hybridspec:request_success_total", "hybridspec:generation_tokens_total")}
        assert got == {"hybridspec:request_success_total": len(mine),
                       "hybridspec:generation_tokens_total": sum(u.completion_tokens for u in mine)}, policy
    after = _metrics(server)
    diff = {k: after[k] - before.get(k, 0) for k in ("hybridspec:request_success_total", "hybridspec:prompt_tokens_total",
                                                     "hybridspec:generation_tokens_total")}
    assert diff == {"hybridspec:request_success_total": 80,
                    "hybridspec:prompt_tokens_total": sum(u.prompt_tokens for u in usages),
                    "hybridspec:generation_tokens_total": sum(u.completion_tokens for u in usages)}
    assert after["hybridspec:num_requests_waiting"] == 0
    assert after["hybridspec:verification_length_count"] == after["hybridspec:round_seconds_count"]


def test_start_up_refuses_a_foreign_artifact(tmp_path):
    path = tmp_path / "foreign.safetensors"
    save_artifact(path, policy_parameters(), model_id="sha256:other-model", drafter_id="sha256:other-drafter",
                  device="cpu", store_digest="none", diagnostics={})
    with pytest.raises(ValueError, match="other-model") as info:
        open_service(artifact=path, max_context=64)
    assert "is sha256:" in str(info.value) or "loaded model is" in str(info.value)
    assert open_service(artifact=path, max_context=64, force=True).model_name == MODEL


def test_serve_command_needs_an_artifact_for_calibrated_policies():
    from typer.testing import CliRunner

    from hybridspec.cli import app

    result = CliRunner().invoke(app, ["serve", "--policy", "hybridspec"])
    assert result.exit_code == 2 and "needs --artifact" in result.output


def test_tool_calls_parsed_from_the_model_text():
    """With `tools`, a Hermes `<tool_call>` block in the output comes back as OpenAI tool_calls
    (finish_reason "tool_calls"), streamed (the call as soon as its block closes) or not; tool_choice
    "none" leaves the text as content; a
    follow-up with the assistant's call and the tool's answer is accepted. The model's text is
    scripted (the embedded pair does not call tools): it grows with the tokens decoded."""
    from tests.runtime.test_chat_template import TOOLS_TEMPLATE

    service = open_service(max_context=256)
    codec = service.session.codec
    codec.chat_templates = {"default": TOOLS_TEMPLATE}  # renders tools, calls and tool answers (this service's codec only)
    script = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' + "…" * 60
    service.visible_text = lambda ids, hidden=frozenset(): script[: 6 * len(ids)]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=40, temperature=0,
              tools=tools, extra_body={"ignore_eos": True})
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        out = client.chat.completions.create(**kw).choices[0]
        assert (out.finish_reason, out.message.content) == ("tool_calls", "Checking.")
        assert [(c.function.name, json.loads(c.function.arguments)) for c in out.message.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
        usage = {"include_usage": True, "continuous_usage_stats": True}  # each chunk: the tokens decoded so far
        content, calls, finish = "", [], None
        chunks = [c for c in client.chat.completions.create(stream=True, stream_options=usage, **kw) if c.choices]
        for chunk in chunks:
            delta = chunk.choices[0].delta
            content, calls = content + (delta.content or ""), calls + (delta.tool_calls or [])
            finish = chunk.choices[0].finish_reason or finish
        assert (content, finish) == ("Checking.", "tool_calls")
        assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
            [(0, "get_weather", {"city": "Paris"})]
        sent = next(chunk for chunk in chunks if chunk.choices[0].delta.tool_calls)
        assert sent.usage.completion_tokens < 20 < 40 == chunks[-1].usage.completion_tokens  # sent when its block closed
        plain = client.chat.completions.create(tool_choice="none", **kw).choices[0]
        assert (plain.message.content, plain.finish_reason, plain.message.tool_calls) == (script, "length", None)
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        follow = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, tools=tools, messages=[
            {"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
        rendered = ('<tools>get_weather({"properties": {"city": {"type": "string"}}, "type": "object"});</tools>\n'
                    'user: weather?|assistant: <call>get_weather {"city": "Paris"}</call>|tool: sunny|assistant:')
        assert follow.usage.prompt_tokens == len(codec.encode(rendered))  # tools, the call and the answer rendered
        bad = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": None}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


QWEN35_LIKE = (  # the parts of Qwen3.5's template the server reads: XML calls in the tools block, <think> opened
    "{%- set ns = namespace(last=0) -%}{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
    "</tool_call>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}assistant:"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n"
    "{% endif %}")


def test_parallel_tool_calls_false_keeps_the_first_call():
    """parallel_tool_calls false: of two calls in the model's text, the first comes back, streamed
    or not; by default both do."""
    from tests.runtime.test_chat_template import TOOLS_TEMPLATE

    service = open_service(max_context=256)
    service.session.codec.chat_templates = {"default": TOOLS_TEMPLATE}
    call = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
    script = "Checking.\n" + call.format("Paris") + "\n" + call.format("Rome")
    service.visible_text = lambda ids, hidden=frozenset(): script[: 8 * len(ids)]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=40, temperature=0,
              tools=tools, extra_body={"ignore_eos": True})
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        for parallel, cities in ((True, ["Paris", "Rome"]), (False, ["Paris"])):
            out = client.chat.completions.create(parallel_tool_calls=parallel, **kw).choices[0]
            assert [json.loads(c.function.arguments)["city"] for c in out.message.tool_calls] == cities
            streamed = [call for chunk in client.chat.completions.create(stream=True, parallel_tool_calls=parallel, **kw)
                        for call in chunk.choices[0].delta.tool_calls or []]
            assert [(c.index, json.loads(c.function.arguments)["city"]) for c in streamed] == list(enumerate(cities))


def test_reasoning_and_qwen35_tool_calls_through_the_client():
    """A Qwen3.5-style template: the output's reasoning comes back as reasoning_content and its XML
    call as tool_calls typed by the tool's schema, streamed or not; with enable_thinking false
    (chat_template_kwargs) the output is content. The model's text is scripted."""
    service = open_service(max_context=256)
    service.session.codec.chat_templates = {"default": QWEN35_LIKE}
    service.tool_format, service.reasoning = "qwen3_xml", True  # what `auto` picks for this template at start-up
    script = ("The user asks for weather.\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n"
              "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    service.visible_text = lambda ids, hidden=frozenset(): script[: 6 * len(ids)]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=60, temperature=0,
              tools=tools, extra_body={"ignore_eos": True})
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        out = client.chat.completions.create(**kw).choices[0]
        assert out.message.model_extra["reasoning_content"] == "The user asks for weather.\n"
        assert (out.finish_reason, out.message.content) == ("tool_calls", "Checking.")
        assert [(c.function.name, json.loads(c.function.arguments)) for c in out.message.tool_calls] == \
            [("get_weather", {"city": "Paris", "days": 2})]
        thought, content, calls = "", "", []
        for chunk in client.chat.completions.create(stream=True, **kw):
            delta = chunk.choices[0].delta
            thought += (delta.model_extra or {}).get("reasoning_content") or ""
            content, calls = content + (delta.content or ""), calls + (delta.tool_calls or [])
        assert (thought, content) == ("The user asks for weather.\n", "Checking.")
        # the name first, then the arguments in pieces, parameter by parameter, as a client joins them
        assert [(c.index, c.function.name) for c in calls][0] == (0, "get_weather") and len(calls) == 4
        assert {c.index for c in calls} == {0} and all(c.function.name is None for c in calls[1:])
        assert json.loads("".join(c.function.arguments for c in calls)) == {"city": "Paris", "days": 2}
        service.visible_text = lambda ids, hidden=frozenset(): "Plain answer."[: 6 * len(ids)]
        direct = client.chat.completions.create(model=MODEL, messages=kw["messages"], max_tokens=4, temperature=0,
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        message = direct.choices[0].message
        assert (message.content, message.model_extra["reasoning_content"]) == ("Plain answer.", None)
        for variables in ({"add_generation_prompt": False}, {"namespace": 5}):  # reserved; breaks the template
            bad = httpx.post(f"{base}/v1/chat/completions", json={
                "messages": kw["messages"], "chat_template_kwargs": variables})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs", bad.text
        # a prompt that opened <think>: the grammar lets the reasoning run to </think>, then holds the answer
        import asyncio

        from hybridspec.serve.api import ChatRequest

        asked = ChatRequest(messages=kw["messages"], response_format={"type": "json_object"})
        ids = service.session.codec.encode("weather?")
        spec = asyncio.run(service.check_grammar(asked, ids, 8, "messages", thinking=True))
        assert spec.kind == "structural_tag" and "</think>" in spec.value
        assert asyncio.run(service.check_grammar(asked, ids, 8, "messages", thinking=False)).kind == "json_schema"
        bad_name = dict(tools[0], function={**tools[0]["function"], "name": 'a"b'})
        bad = httpx.post(f"{base}/v1/chat/completions", json={"messages": kw["messages"], "tools": [bad_name]})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("tools"), bad.text


def test_tool_choice_required_and_named_hold_the_model_to_calls():
    """tool_choice `required` or a named function: the embedded model (which never calls tools by
    itself) is held by a grammar to the call format its template teaches, with arguments of the
    tool's schema; greedy speculative decoding gives `ar`'s calls; bad choices are named."""
    from tests.runtime.test_chat_template import TOOLS_TEMPLATE

    service = open_service(max_context=512)
    service.session.codec.chat_templates = {"default": TOOLS_TEMPLATE}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}}},
             {"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                 "additionalProperties": False}}}]
    messages = [{"role": "user", "content": "weather?"}]
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        named = {"type": "function", "function": {"name": "get_time"}}
        runs = {policy: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                       tools=tools, tool_choice=named,
                                                       extra_body={"policy": policy}).choices[0]
                for policy in ("ar", "full")}
        out = runs["ar"]
        assert out.finish_reason == "tool_calls" and [c.function.name for c in out.message.tool_calls] == ["get_time"]
        assert json.loads(out.message.tool_calls[0].function.arguments)["zone"] in ("UTC", "CET")
        assert [c.function.arguments for c in runs["full"].message.tool_calls] == \
            [c.function.arguments for c in out.message.tool_calls]
        required = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                  tools=tools, tool_choice="required", logprobs=True).choices[0]
        assert required.finish_reason == "tool_calls" and required.message.tool_calls
        assert all(c.function.name in ("get_weather", "get_time") for c in required.message.tool_calls)
        assert required.message.content is None
        block = r"<tool_call>\n\{.*?\}\n</tool_call>"  # calls only, one a line (the last cut by max_tokens)
        assert re.fullmatch(f"{block}(\n{block})*(\n<tool_c.*)?", "".join(t.token for t in required.logprobs.content),
                            re.S)
        one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                             tools=tools, tool_choice="required", parallel_tool_calls=False,
                                             logprobs=True).choices[0]
        [call] = one.message.tool_calls  # the grammar ends the output with the call's block, then the EOS
        text = f'<tool_call>\n{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}\n</tool_call>'
        eos = service.token_text(service.session.eos_ids[0])
        assert "".join(t.token for t in one.logprobs.content) == text + eos
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                     tools=tools, tool_choice="required", stream=True))
        assert all(c.choices[0].delta.tool_calls or c.choices[0].finish_reason for c in chunks[1:]), \
            [c.choices[0].delta for c in chunks]  # no empty deltas while the calls' text is held back
        for body, param in (({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                            ({"tool_choice": "required", "tools": None}, "tool_choice"),
                            ({"tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
                            ({"tool_choice": "required", "ignore_eos": True}, "ignore_eos")):
            bad = httpx.post(f"{base}/v1/chat/completions", json={"messages": messages, "tools": tools, **body})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (body, bad.text)
