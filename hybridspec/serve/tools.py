"""Tool calls in chat completions: the calls a model writes in its text become OpenAI `tool_calls`
(arguments as a JSON string) and the text before the first call the message's content. Two
formats, as the model's chat template teaches it (`tool_format`):

    hermes (Qwen3, Qwen3-Next; vLLM's `hermes` parser):
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    qwen3_xml (Qwen3.5, Qwen3.6; vLLM's `qwen3_coder` parser):
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

An XML parameter's text is converted by the type its tool's JSON schema gives it (integer, number,
boolean, object, array, null; a string stays as written). Text whose blocks are not such calls
stays content. Streamed (`ToolStream`), content goes out until a call may begin (what may be the
start of `<tool_call>` and the space before it are held back), and each call goes out whole as
soon as its block closes (a block left open goes out at the end); the content streamed is the
content of the whole text (empty where that is None). A block that is not a call ends the calls:
when none went out before it, the whole text is content, as unstreamed; after calls, that block
and the text after it go out as content at the end.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FORMATS = ("hermes", "qwen3_xml")
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)
_CLOSED_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def tool_format(template: str | None) -> str:
    """The call format a chat template teaches: `qwen3_xml` where it shows `<function=…>` blocks,
    else `hermes`."""
    return "qwen3_xml" if template and "<function=" in template else "hermes"


def parse_tool_calls(text: str, fmt: str = "hermes", tools: list[dict] | None = None) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a model's text in format `fmt` (`tools`: the request's, whose
    parameter schemas type the XML format's values): no calls, the text as it is; else the text
    before the first `<tool_call>` without its trailing space (None when blank) and one OpenAI
    call per block (a block left open at the end of the text counts, as a model stopped by its
    budget may leave it)."""
    if OPEN not in text:
        return text, []
    calls = _calls(_BLOCK.finditer(text), fmt, tools)
    if calls is None:
        return text, []
    content = text[: text.index(OPEN)].rstrip()
    return (content if content.strip() else None), calls


def _calls(blocks, fmt: str, tools: list[dict] | None) -> list[dict] | None:
    """One OpenAI call per block match (group 1: the block's body), or None when one is not a call."""
    calls = []
    for block in blocks:
        parsed = _xml_call(block.group(1), tools) if fmt == "qwen3_xml" else _json_call(block.group(1))
        if parsed is None:
            return None
        name, arguments = parsed
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls


def _json_call(body: str) -> tuple[str, Any] | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    return call["name"], call.get("arguments", call.get("parameters", {}))


def _xml_call(body: str, tools: list[dict] | None) -> tuple[str, dict] | None:
    function = _FUNCTION.match(body.strip())
    if function is None:
        return None
    name = function.group(1).strip()
    schema = next((t["function"].get("parameters") or {} for t in tools or []
                   if t.get("function", {}).get("name") == name), {})
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    arguments = {}
    for parameter in _PARAMETER.finditer(function.group(2)):
        key = parameter.group(1).strip()
        arguments[key] = _typed(_trim(parameter.group(2)), properties.get(key, {}))
    return name, arguments


def _trim(value: str) -> str:
    """A parameter's text without the one newline the format puts on each side of it."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _typed(value: str, schema: dict) -> Any:
    """An XML parameter's text as the value its JSON schema types (`type`, through `anyOf`/`oneOf`,
    or the kinds of its `enum`/`const` values): a string where a string is allowed, where no type
    is known (an unknown parameter or tool, as vLLM keeps it) or where the text does not parse as
    any allowed type; `null` as None unless only strings are allowed."""
    kinds = _kinds(schema)
    if value.strip().lower() == "null" and kinds != ["string"]:
        return None
    if not kinds or "string" in kinds:
        return value
    text = value.strip()
    for kind in kinds:
        try:
            if kind == "integer" and re.fullmatch(r"-?\d+", text):
                return int(text)
            if kind == "number":
                number = float(text)
                if math.isfinite(number):
                    return int(text) if re.fullmatch(r"-?\d+", text) else number
            if kind == "boolean" and text.lower() in ("true", "false"):
                return text.lower() == "true"
            if kind in ("object", "array"):
                parsed = json.loads(text)
                if isinstance(parsed, dict if kind == "object" else list):
                    return parsed
        except ValueError:
            continue
    return value


def _kinds(schema) -> list[str]:
    """The JSON types a schema allows, as far as its `type`, `anyOf`/`oneOf`, `enum` and `const` say."""
    if not isinstance(schema, dict):
        return []
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            kinds += _kinds(sub)
    values = list(schema.get("enum") or []) + ([schema["const"]] if "const" in schema else [])
    kinds += [_json_kind(v) for v in values]
    return list(dict.fromkeys(kinds))


def _json_kind(value) -> str:
    for kind, types in (("null", type(None)), ("boolean", bool), ("integer", int), ("number", float),
                        ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, types):
            return kind
    return "string"


class ToolStream:
    """A streamed chat with tools: `feed` each text delta and send the content and calls it returns;
    `finish` gives the rest (module docstring)."""

    def __init__(self, fmt: str = "hermes", tools: list[dict] | None = None):
        self.fmt, self.tools = fmt, tools
        self.text, self.sent = "", 0  # the text so far; how much of it went out as content
        self.calls = 0  # calls sent
        self.scanned: int | None = None  # where the blocks not yet sent begin (None: before the first call)
        self.opened = -1  # where the first `<tool_call>` begins (−1: not yet)
        self.closes = 0  # where the search for the next `</tool_call>` resumes
        self.broken = False  # a closed block was not a call

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """(content to send, calls whose blocks closed with this delta)."""
        before = len(self.text)
        self.text += delta
        if self.opened < 0:  # the first `<tool_call>`, searched for where the new text can complete one
            self.opened = self.text.find(OPEN, max(0, before - len(OPEN) + 1))
        end = self.opened
        if end < 0:  # hold back a tail that may be the start of `<tool_call>`
            end = len(self.text)
            for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1):
                if OPEN.startswith(self.text[-k:]):
                    end -= k
                    break
        while end > self.sent and self.text[end - 1].isspace():  # content ends before the space before a call
            end -= 1
        out, self.sent = self.text[self.sent : max(end, self.sent)], max(end, self.sent)
        return out, self._closed_calls()

    def _closed_calls(self) -> list[dict]:
        """The calls of the blocks closed since the last ones sent; none once a block was not a call."""
        start = self.opened if self.scanned is None else self.scanned
        if self.broken or start < 0:
            return []
        close = self.text.find(CLOSE, max(self.closes, start))  # blocks are parsed only when one closes
        self.closes = len(self.text) - len(CLOSE) + 1 if close < 0 else close + len(CLOSE)
        if close < 0:
            return []
        calls = []
        for block in _CLOSED_BLOCK.finditer(self.text, start):
            call = _calls([block], self.fmt, self.tools)
            if call is None:
                self.broken = True
                break
            calls, start = calls + call, block.end()
        if calls:
            self.scanned, self.calls = start, self.calls + len(calls)
        return calls

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, calls not yet sent): before any call went out, `parse_tool_calls` of
        the whole text (without calls, everything held back is content); after, the calls of the
        blocks left (one left open included), or the text from a block that is not a call on."""
        if not self.calls:
            _, calls = parse_tool_calls(self.text, self.fmt, self.tools)
            if not calls:
                out, self.sent = self.text[self.sent :], len(self.text)
                return out, []
            return self.text[self.sent : self.text.index(OPEN)].rstrip(), calls
        rest = self.text[self.scanned :]
        calls = None if self.broken else _calls(_BLOCK.finditer(rest), self.fmt, self.tools)
        if calls is None:
            first = rest.find(OPEN)
            return rest[first:].strip(), []
        return "", calls
