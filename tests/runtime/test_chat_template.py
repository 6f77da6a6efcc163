"""Chat messages → prompt text through the tokenizer's own chat template, as transformers renders it."""

from __future__ import annotations

import json
import shutil

import pytest

from hybridspec.runtime.session import EMBEDDED
from hybridspec.runtime.tokenizer import ChatTemplateError, load_codec

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):"},
            {"role": "assistant", "content": "return x"}, {"role": "user", "content": [{"type": "text", "text": "again"}]}]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_embedded_template_equals_transformers_apply_chat_template():
    from transformers import AutoTokenizer

    codec = load_codec(EMBEDDED / "target")
    plain = [{**m, "content": m["content"] if isinstance(m["content"], str) else "again"} for m in MESSAGES]
    oracle = AutoTokenizer.from_pretrained(EMBEDDED / "target").apply_chat_template(
        plain, tokenize=False, add_generation_prompt=True)
    assert codec.render_chat(MESSAGES) == oracle
    assert oracle == "Be brief.\n<|user|>def f(x):\n<|assistant|>return x\n<|user|>again\n<|assistant|>"


def test_chat_template_file_wins_over_tokenizer_config(tmp_path):
    """transformers' order: `chat_template.jinja` replaces the `chat_template` field of tokenizer_config.json."""
    shutil.copy(EMBEDDED / "target" / "tokenizer.json", tmp_path)
    shutil.copy(EMBEDDED / "target" / "tokenizer_config.json", tmp_path)
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    text = load_codec(tmp_path).render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_named_templates_use_default_and_special_tokens_reach_the_template(tmp_path):
    shutil.copy(EMBEDDED / "target" / "tokenizer.json", tmp_path)
    config = {"eos_token": {"content": "<|endoftext|>"},
              "chat_template": [{"name": "tool_use", "template": "tools"},
                                {"name": "default", "template": "{{ messages[0]['content'] + eos_token }}"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_codec(tmp_path).render_chat([{"role": "user", "content": "hi"}]) == "hi<|endoftext|>"


TOOL = {"type": "function", "function": {"name": "clock", "description": "time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("layout", ["config-list", "additional-files"])
def test_a_request_with_tools_renders_the_tool_use_template_as_transformers_picks_it(tmp_path, layout):
    """Named templates, in tokenizer_config.json's list or as `additional_chat_templates/NAME.jinja`:
    with tools the `tool_use` one, without them `default`, each equal to transformers' rendering."""
    from transformers import AutoTokenizer

    shutil.copy(EMBEDDED / "target" / "tokenizer.json", tmp_path)
    default = "{{ messages[0]['content'] }}"
    tool_use = "{{ tools[0]['function']['name'] + ':' + messages[0]['content'] }}"
    config = json.loads((EMBEDDED / "target" / "tokenizer_config.json").read_text())
    if layout == "config-list":
        config["chat_template"] = [{"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]
    else:
        config.pop("chat_template", None)
        (tmp_path / "chat_template.jinja").write_text(default)
        (tmp_path / "additional_chat_templates").mkdir()
        (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    codec, oracle = load_codec(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    chat = [{"role": "user", "content": "hi"}]
    for tools, expected in ((None, "hi"), ([TOOL], "clock:hi")):
        assert codec.render_chat(chat, tools=tools) == expected
        assert oracle.apply_chat_template(chat, tools=tools, tokenize=False) == expected


def test_a_tokenizer_without_a_template_is_named(tmp_path):
    shutil.copy(EMBEDDED / "target" / "tokenizer.json", tmp_path)
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        load_codec(tmp_path).render_chat([{"role": "user", "content": "hi"}])


def test_a_template_that_raises_is_named(tmp_path):
    shutil.copy(EMBEDDED / "target" / "tokenizer.json", tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        load_codec(tmp_path).render_chat([{"role": "user", "content": "hi"}])


def test_token_bytes_join_to_the_text_for_byte_level_tokens():
    """A byte-level tokenizer splits a character over tokens: each token's own bytes (not its
    decoded text, which is a replacement character) join to the text's UTF-8; the server names
    such a token as OpenAI does, `bytes:\\xNN…`."""
    from hybridspec.runtime.session import open_session
    from hybridspec.serve.service import Service

    session = open_session()
    text = "naïve 😀 日本 <|endoftext|>"
    ids = session.codec.encode(text)
    assert b"".join(session.codec.token_bytes(i) for i in ids) == text.encode("utf-8")
    partial = next(i for i in ids if session.codec.decode([i]) == "\ufffd")
    name = Service(session, params=None, policy="ar", model_name="m").token_text(partial)
    assert name.startswith("bytes:\\x") and len(name) == len("bytes:") + 4 * len(session.codec.token_bytes(partial))


TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}({{ t.function.parameters | tojson }});{% endfor %}"
    "</tools>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
    "<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}{{ '|' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")


def test_tools_and_tool_calls_reach_the_chat_template():
    """`tools` and an assistant's `tool_calls` (arguments parsed from OpenAI's JSON string into an
    object, as Qwen's templates expect) reach the template; a tool's answer renders as a message."""
    from hybridspec.serve.api import ChatMessage

    codec = load_codec(EMBEDDED / "target")
    codec.chat_templates = {"default": TOOLS_TEMPLATE}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [ChatMessage(role="user", content="weather?"),
                ChatMessage(role="assistant", content=None, tool_calls=[call]),
                ChatMessage(role="tool", tool_call_id="c1", content="sunny")]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    rendered = codec.render_chat([m.for_template() for m in messages], tools)
    assert rendered == ('<tools>get_weather({"type": "object"});</tools>\nuser: weather?|assistant: '
                        '<call>get_weather {"city": "Paris"}</call>|tool: sunny|assistant:')
