"""Text ↔ ids through a model directory's `tokenizer.json` (the `tokenizers` library), and chat
messages → prompt text through the tokenizer's own `chat_template`.

The template is read as transformers reads it: `chat_template.jinja` when present, else the
`chat_template` field of `tokenizer_config.json` (a string, or a list of named templates), with
`additional_chat_templates/NAME.jinja` beside it; a request with tools renders with the template
named `tool_use` when there is one, else `default`. It is rendered by transformers' sandboxed Jinja environment with the special
tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, …) and `add_generation_prompt=True`,
as `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` does.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

from .config import ConfigError

SPECIAL_TOKEN_FIELDS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(ConfigError):
    """The model has no chat template, or the template refused the messages."""


class TextCodec:
    def __init__(self, tokenizer: Tokenizer, chat_template: str | dict[str, str] | None = None,
                 special_tokens: dict[str, str] | None = None, source: str = "tokenizer"):
        self.tokenizer = tokenizer
        # name → template; a single template is the `default` one
        self.chat_templates = dict(chat_template) if isinstance(chat_template, dict) else (
            {"default": chat_template} if chat_template is not None else {})
        self.special_tokens = dict(special_tokens or {})
        self.source = source
        self._byte_map: dict[str, int] | None = None  # byte-level tokenizers: char → byte (`token_bytes`)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens included (a caller leaves out the ids it hides, as
        `Service.visible_text` does)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """The ids of the added tokens the tokenizer marks special (`<|im_end|>`, `<|endoftext|>`):
        those `skip_special_tokens` leaves out of a text, as the tokenizer's own decode would. Qwen's
        tokenizers add `<think>`, `</think>`, `<tool_call>` and `</tool_call>` unmarked, so those stay."""
        return frozenset(i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special)

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes, which may be part of a UTF-8 character: through the byte map of a
        byte-level tokenizer (GPT-2's, as Qwen's), else the UTF-8 of its decoded text."""
        if self._byte_map is None:
            state = self.tokenizer.decoder.__getstate__() if self.tokenizer.decoder is not None else b"{}"
            decoder = json.loads(state)  # the decoder's own JSON (small), not the whole tokenizer's
            byte_level = decoder.get("type") == "ByteLevel" or any(
                d.get("type") == "ByteLevel" for d in decoder.get("decoders", []))
            if byte_level:
                from transformers.convert_slow_tokenizer import bytes_to_unicode

                self._byte_map = {char: byte for byte, char in bytes_to_unicode().items()}
            else:
                self._byte_map = {}
        piece = self.tokenizer.id_to_token(token)
        if not self._byte_map or piece is None:
            return self.decode([token]).encode("utf-8")
        return b"".join(bytes([self._byte_map[c]]) if c in self._byte_map else c.encode("utf-8") for c in piece)

    @property
    def chat_template(self) -> str | None:
        return self.chat_templates.get("default")

    def template_for(self, tools: list[dict] | None) -> str | None:
        """The template a request renders with, as transformers picks it: `tool_use` when the request
        has tools and the tokenizer names one, else `default`."""
        if tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        return self.chat_template

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    variables: dict | None = None) -> str:
        """The prompt text of OpenAI-style `messages` ({"role", "content"}; a content list keeps its text
        parts; an assistant's `tool_calls` and a tool's `tool_call_id` pass through) under the
        tokenizer's chat template (`template_for`), with OpenAI-style `tools` when given and the
        caller's extra template `variables` (e.g. `enable_thinking`), ending with the assistant's turn
        opened."""
        template = self.template_for(tools)
        if template is None:
            raise ChatTemplateError(f"{self.source}: no chat_template (chat_template.jinja or tokenizer_config.json); "
                                    "use plain completions")
        from jinja2.exceptions import TemplateError
        from transformers.utils.chat_template_utils import render_jinja_template

        chat = [{**m, "content": _text(m.get("content"))} for m in messages]
        try:
            rendered, _ = render_jinja_template([chat], tools=tools, chat_template=template,
                                                add_generation_prompt=True, **{**self.special_tokens, **(variables or {})})
        except TemplateError as exc:
            raise ChatTemplateError(f"{self.source}: the chat template refused the messages: {exc}") from exc
        except Exception as exc:  # a variable of the caller's that the template cannot use (TypeError, …)
            raise ChatTemplateError(f"{self.source}: the chat template failed ({type(exc).__name__}: {exc})") from exc
        return rendered[0]


def _text(content) -> str:
    """A message's content as text: a string as is, the text parts of a content list joined by
    newlines (as vLLM joins them for a template that reads strings)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))


def read_chat_template(directory: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(chat templates by name, special tokens by field name) of a tokenizer directory: the
    `chat_template` field (a string is `default`; a list names its templates), then
    `chat_template.jinja` as `default` and `additional_chat_templates/NAME.jinja`, as transformers
    reads them."""
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    field = config.get("chat_template")
    if isinstance(field, list):
        templates = {t["name"]: t["template"] for t in field}
    else:
        templates = {"default": field} if isinstance(field, str) else {}
    if (directory / "chat_template.jinja").is_file():
        templates["default"] = (directory / "chat_template.jinja").read_text()
    for path in sorted((directory / "additional_chat_templates").glob("*.jinja")):
        templates[path.stem] = path.read_text()
    special = {}
    for field in SPECIAL_TOKEN_FIELDS:
        value = config.get(field)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[field] = value
    return templates, special


def load_codec(directory: Path | None) -> TextCodec | None:
    """The directory's tokenizer and chat template, or None when it has no tokenizer (random presets)."""
    if directory is None or not (Path(directory) / "tokenizer.json").is_file():
        return None
    directory = Path(directory)
    templates, special = read_chat_template(directory)
    return TextCodec(Tokenizer.from_file(str(directory / "tokenizer.json")), templates, special, str(directory))
