"""skip_special_tokens (vLLM's, default true): the tokens the tokenizer marks special are left out of
the output text, streamed or not, and stop sequences are matched in that text; echo, /detokenize
and the logprobs' token strings keep them; the reasoning and tool-call markers stay where a chat
output is parsed. The embedded model is pushed to write `<|endoftext|>` mid-output (`EMITS`); the
parsers run on a scripted output of a Qwen-like tokenizer (`qwen_like_codec`)."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from tokenizers import AddedToken, Tokenizer  # noqa: E402

from hybridspec.runtime.engine import PrefillRecord, RoundRecord  # noqa: E402
from hybridspec.runtime.session import EMBEDDED  # noqa: E402
from hybridspec.runtime.tokenizer import TextCodec  # noqa: E402
from hybridspec.serve.service import PARSED_MARKERS, open_service  # noqa: E402
from tests.serve.live import live_server  # noqa: E402

MODEL = "hybridspec-embedded"
PROMPT = "def add(a, b):\n    return"
EOT = "<|endoftext|>"  # the embedded tokenizer's EOS, marked special
# ignore_eos with the EOS favoured, and penalised each time it comes: greedy output is code with a
# run of `<|endoftext|>` in it
EMITS = {"ignore_eos": True, "logit_bias": {"0": 8}, "frequency_penalty": 1.0}


@pytest.fixture(scope="module")
def service():
    return open_service(max_context=256)


@pytest.fixture(scope="module")
def server(service):
    with live_server(service) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=60)


def _complete(client, stream: bool = False, **extra):
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, logprobs=0,
                                     stream=stream, extra_body={**EMITS, **extra})


def _streamed_texts(chunks, n: int = 1, chat: bool = False) -> list[str]:
    """Each choice's text joined from its streamed chunks."""
    texts = [""] * n
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += (c.delta.content or "") if chat else c.text
    return texts


def _joined(tokens: list[str], special: set[str]) -> str:
    """The oracle: the embedded tokenizer's token strings join to the text; skipping drops the special ones."""
    return "".join(t for t in tokens if t not in special)


def _special(service) -> set[str]:
    codec = service.session.codec
    return {codec.decode([i]) for i in codec.special_ids}


def test_special_tokens_are_left_out_of_the_text_unless_asked_for(client, service):
    """Completions and chat, in one policy and in a speculative one: the default text is the tokens'
    text without the special ones; skip_special_tokens false keeps them; the logprobs name every
    token either way."""
    special = _special(service)
    assert EOT in special
    for policy in ("ar", "static:4"):
        kept = _complete(client, policy=policy, skip_special_tokens=False).choices[0]
        skipped = _complete(client, policy=policy).choices[0]
        tokens = kept.logprobs.tokens
        first = tokens.index(EOT)
        assert 0 < first and tokens[-1] != EOT, tokens  # special tokens mid-output, text on both sides
        assert skipped.logprobs.tokens == tokens
        assert kept.text == "".join(tokens) and EOT in kept.text
        assert skipped.text == _joined(tokens, special) and EOT not in skipped.text and skipped.text != kept.text
    messages = [{"role": "user", "content": "add two numbers"}]
    chats = {skip: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                  logprobs=True, extra_body={**EMITS, "skip_special_tokens": skip}
                                                  ).choices[0] for skip in (True, False)}
    tokens = [e.token for e in chats[False].logprobs.content]
    assert EOT in tokens and [e.token for e in chats[True].logprobs.content] == tokens
    assert chats[False].message.content == "".join(tokens)
    assert chats[True].message.content == _joined(tokens, special)


def test_streamed_text_equals_the_whole_text_with_or_without_special_tokens(client):
    """n sampled choices (seed + i each), streamed or not, give the same text in either mode; the
    kept text is the skipped one with the special tokens in place."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=5, n=3)
    texts = {}
    for skip in (True, False):
        extra = {"extra_body": {**EMITS, "skip_special_tokens": skip, "policy": "static:4"}}
        whole = [c.text for c in client.completions.create(**kw, **extra).choices]
        assert _streamed_texts(client.completions.create(**kw, stream=True, **extra), 3) == whole
        texts[skip] = whole
    assert all(EOT in t for t in texts[False]) and not any(EOT in t for t in texts[True])
    assert [t.replace(EOT, "") for t in texts[False]] == texts[True]
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=16, temperature=1.0, seed=2, n=2)
    for skip in (True, False):
        extra = {"extra_body": {**EMITS, "skip_special_tokens": skip}}
        whole = [c.message.content for c in client.chat.completions.create(**chat, **extra).choices]
        assert _streamed_texts(client.chat.completions.create(**chat, stream=True, **extra), 2, chat=True) == whole
        assert any(EOT in t for t in whole) != skip


def test_a_stop_token_id_ends_the_text_in_either_mode(client, service):
    """stop_token_ids after special tokens: the text stops before the stop token, which is hidden in
    both modes; the special tokens before it follow skip_special_tokens."""
    special = _special(service)
    tokens = _complete(client, skip_special_tokens=False).choices[0].logprobs.tokens
    k = next(i for i in range(tokens.index(EOT), len(tokens)) if tokens[i] != EOT)  # the first token after the run
    [stop_id] = service.session.codec.encode(tokens[k])
    assert tokens[k] not in tokens[:k]
    for skip in (True, False):
        out = _complete(client, stop_token_ids=[stop_id], skip_special_tokens=skip).choices[0]
        assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
        assert out.text == _joined(tokens[:k], special if skip else set()) and (EOT in out.text) != skip
        assert out.logprobs.tokens == tokens[: k + 1]
        streamed = _complete(client, True, stop_token_ids=[stop_id], skip_special_tokens=skip)
        assert _streamed_texts(streamed) == [out.text]


def test_stop_sequences_are_matched_in_the_text_the_client_gets(client, service):
    """A stop sequence that is a special token's text stops only the text that keeps it; one that
    spans the place where special tokens were left out stops only the text without them."""
    tokens = _complete(client, skip_special_tokens=False).choices[0].logprobs.tokens
    kept, skipped = "".join(tokens), _joined(tokens, _special(service))
    out = _complete(client, stop=[EOT], skip_special_tokens=False).choices[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", EOT, kept[: kept.index(EOT)])
    out = _complete(client, stop=[EOT]).choices[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("length", None, skipped)
    at = len("".join(tokens[: tokens.index(EOT)]))  # where the skipped text closes over the special tokens
    across = skipped[at - 2: at + 4]
    assert across not in kept, across
    out = _complete(client, stop=[across]).choices[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", across, skipped[: skipped.index(across)])
    assert _streamed_texts(_complete(client, True, stop=[across])) == [out.text]
    kept_out = _complete(client, stop=[across], skip_special_tokens=False).choices[0]
    assert (kept_out.finish_reason, kept_out.text) == ("length", kept)


def test_echo_detokenize_and_logprobs_keep_special_tokens(client, server, service):
    """echo writes the prompt with its special tokens whatever skip_special_tokens says (a token-id
    prompt decoded, a text prompt as sent), and the prompt's logprobs name them; /detokenize keeps them."""
    codec = service.session.codec
    head = codec.encode(PROMPT)
    ids = head + [codec.tokenizer.token_to_id(EOT)] + codec.encode(" x")
    for prompt in (ids, PROMPT + EOT + " x"):
        for skip in (True, False):
            out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                            logprobs=0, extra_body={"skip_special_tokens": skip}).choices[0]
            assert out.text.startswith(PROMPT + EOT + " x"), (prompt, skip)
            assert out.logprobs.tokens[len(head)] == EOT
    assert httpx.post(f"{server}/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPT + EOT + " x"


def qwen_like_codec(markers_special: bool) -> TextCodec:
    """The embedded tokenizer with Qwen's chat tokens added after its vocabulary: `<|im_end|>` marked
    special and the reasoning and tool-call markers unmarked, as Qwen's tokenizers add them (or,
    `markers_special`, marked special, as some tokenizers do)."""
    tokenizer = Tokenizer.from_file(str(EMBEDDED / "target" / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    markers = [AddedToken(m, special=markers_special) for m in PARSED_MARKERS]
    (tokenizer.add_special_tokens if markers_special else tokenizer.add_tokens)(markers)
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}assistant:"
    return TextCodec(tokenizer, template, source="qwen-like")


def test_the_parsers_markers_are_not_special_in_the_embedded_and_qwen_like_tokenizers(service):
    """`<think>`, `</think>`, `<tool_call>`, `</tool_call>` survive skipping where they are not marked
    special: the embedded tokenizer writes them as ordinary tokens, a Qwen-like one as unmarked added
    tokens; leaving the special ids out is the tokenizer's own skip_special_tokens decode."""
    marked = qwen_like_codec(markers_special=True)
    for codec in (service.session.codec, qwen_like_codec(markers_special=False), marked):
        text = "<think>a<|im_end|>b</think>\n<tool_call>{}</tool_call><|endoftext|>"
        ids = codec.encode(text)
        assert codec.decode([i for i in ids if i not in codec.special_ids]) == \
            codec.tokenizer.decode(ids, skip_special_tokens=True)
        if codec is not marked:
            for marker in PARSED_MARKERS:
                assert not set(codec.encode(marker)) & codec.special_ids, (codec.source, marker)
    assert {marked.tokenizer.token_to_id(m) for m in PARSED_MARKERS} <= marked.special_ids


SCRIPT = ('<think>Let me think<|im_end|> more.</think>\n\nChecking.\n<tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _scripted(ids: list[int], step: int = 2):
    """An engine's round stream that writes `ids`, `step` tokens a round."""
    yield ids[:1], PrefillRecord()
    for i in range(1, len(ids), step):
        chunk = ids[i: i + step]
        yield chunk, RoundRecord(w0=None, u=1, w=len(chunk), accepted=0, accepted_full=None, emitted=len(chunk),
                                 truncated=False)


def test_reasoning_and_tool_calls_survive_skipping_whatever_the_markers_are():
    """A chat output split into reasoning and tool calls: `<|im_end|>` in the reasoning is left out
    by default and kept with skip_special_tokens false; the markers stay, so reasoning_content and
    tool_calls come back, streamed or not, also where the tokenizer marks the markers special.
    Completions (no parser) leave out every special token, markers marked special included."""
    service = open_service(policy="ar", max_context=256)
    service.tool_format, service.reasoning = "hermes", True
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=40, temperature=0,
              tools=TOOLS)
    with live_server(service) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
        for markers_special in (False, True):
            codec = service.session.codec = qwen_like_codec(markers_special)
            ids = codec.encode(SCRIPT)
            service.steps = lambda request: _scripted(ids)
            for skip, thought in ((True, "Let me think more."), (False, "Let me think<|im_end|> more.")):
                out = client.chat.completions.create(**kw, extra_body={"skip_special_tokens": skip}).choices[0]
                assert out.message.model_extra["reasoning_content"] == thought, (markers_special, skip)
                assert (out.finish_reason, out.message.content) == ("tool_calls", "Checking.")
                assert [(c.function.name, json.loads(c.function.arguments)) for c in out.message.tool_calls] == \
                    [("get_weather", {"city": "Paris"})]
                streamed, content, calls = "", "", []
                chunks = client.chat.completions.create(**kw, stream=True, extra_body={"skip_special_tokens": skip})
                for chunk in chunks:
                    delta = chunk.choices[0].delta
                    streamed += (delta.model_extra or {}).get("reasoning_content") or ""
                    content, calls = content + (delta.content or ""), calls + (delta.tool_calls or [])
                assert (streamed, content, [c.function.name for c in calls]) == (thought, "Checking.", ["get_weather"])
            texts = {skip: client.completions.create(model=MODEL, prompt="weather?", max_tokens=40,
                                                     extra_body={"skip_special_tokens": skip}).choices[0].text
                     for skip in (True, False)}
            assert texts[False] == SCRIPT
            left_out = ["<|im_end|>", *(PARSED_MARKERS if markers_special else ())]
            assert texts[True] == _remove(SCRIPT, left_out)


def _remove(text: str, pieces: list[str]) -> str:
    for piece in pieces:
        text = text.replace(piece, "")
    return text
