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
start of `<tool_call>` and the space before it are held back); a hermes call goes out whole as
soon as its block closes, a qwen3_xml call as it is written: its name once `<function=NAME>` is
complete, then its arguments parameter by parameter (a block left open goes out at the end). The
content streamed is the content of the whole text (empty where that is None). A block that is not
a call ends the calls: when none began before it, the whole text is content, as unstreamed; after
calls, that block and the text after it go out as content at the end.
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
_HEAD = "<function="
_FUNCTION_HEAD = re.compile(r"<function=([^>\n]+)>")
_PARAMETER_ENDS = ("</parameter>", "<parameter=", "</function>")  # the tags after which a parameter's value is whole
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
    properties = _properties(name, tools)
    arguments = {}
    for parameter in _PARAMETER.finditer(function.group(2)):
        key = parameter.group(1).strip()
        arguments[key] = _typed(_trim(parameter.group(2)), properties.get(key, {}))
    return name, arguments


def _properties(name: str, tools: list[dict] | None) -> dict:
    """The parameter schemas of the tool called `name` (empty where there is none)."""
    schema = next((t["function"].get("parameters") or {} for t in tools or []
                   if t.get("function", {}).get("name") == name), {})
    return schema.get("properties", {}) if isinstance(schema, dict) else {}


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


class _XmlCall:
    """A `qwen3_xml` call being streamed: where its block begins, what of it went out."""

    def __init__(self, open_at: int):
        self.open_at = open_at  # its `<tool_call>`
        self.body = open_at + len(OPEN)  # where the block's body begins
        self.close_from = self.body  # where the search for its `</tool_call>` resumes
        self.index: int | None = None  # its place among the calls, once its name went out
        self.properties: dict = {}  # its tool's parameter schemas
        self.scan = 0  # where the next parameter is searched for (after the head, then after each one sent)
        self.checked = 0  # how far the text was looked at for a tag that ends a parameter
        self.sent = 0  # parameters sent
        self.finished = False  # its closing brace went out


class ToolStream:
    """A streamed chat with tools: `feed` each text delta and send the content and the `tool_calls`
    deltas it returns (OpenAI's: each with its call's `index`; the first of a call with its `id`,
    `type` and `name`); `finish` gives the rest (module docstring). In `hermes` a call goes out whole
    when its block closes. In `qwen3_xml` its name goes out when `<function=NAME>` is complete, then
    its arguments, parameter by parameter as each value is whole, as pieces of the JSON object that
    `parse_tool_calls` writes (the same string, unless a parameter is repeated: then the same object)."""

    def __init__(self, fmt: str = "hermes", tools: list[dict] | None = None):
        self.fmt, self.tools = fmt, tools
        self.text, self.sent = "", 0  # the text so far; how much of it went out as content
        self.calls = 0  # calls begun (their first delta sent)
        self.scanned: int | None = None  # where the blocks not yet sent begin (None: before the first call)
        self.opened = -1  # where the first `<tool_call>` begins (−1: not yet)
        self.closes = 0  # where the search for the next `</tool_call>` resumes
        self.broken = False  # a block was not a call
        self.current: _XmlCall | None = None  # qwen3_xml: the call being streamed

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """(content to send, `tool_calls` deltas)."""
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
        if self.broken or self.opened < 0:
            return out, []
        return out, self._xml_deltas(final=False) if self.fmt == "qwen3_xml" else self._closed_calls()

    def _closed_calls(self) -> list[dict]:
        """hermes: the calls of the blocks closed since the last ones sent, each whole."""
        start = self.opened if self.scanned is None else self.scanned
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
            self.scanned = start
        return self._indexed(calls)

    def _indexed(self, calls: list[dict]) -> list[dict]:
        out = [{"index": self.calls + k, **call} for k, call in enumerate(calls)]
        self.calls += len(calls)
        return out

    def _xml_deltas(self, final: bool) -> list[dict]:
        """qwen3_xml: the deltas of the calls' heads and whole parameters since the last ones sent;
        `final`: the text is complete (an open block ends with it)."""
        out = []
        while not self.broken:
            if self.current is None:
                open_at = self.text.find(OPEN, self.opened if self.scanned is None else self.scanned)
                if open_at < 0:
                    return out
                self.current = _XmlCall(open_at)
            call = self.current
            close_at = self.text.find(CLOSE, call.close_from)
            call.close_from = close_at if close_at >= 0 else max(call.body, len(self.text) - len(CLOSE) + 1)
            ended = close_at >= 0 or final
            end = close_at if close_at >= 0 else len(self.text)
            if call.index is None and not self._head(call, end, ended, out):
                return out
            if not call.finished and not self._parameters(call, end, ended, out):
                return out
            if close_at < 0:
                if final:
                    self.current, self.scanned = None, len(self.text)
                return out
            self.current, self.scanned = None, close_at + len(CLOSE)
        return out

    def _head(self, call: _XmlCall, end: int, ended: bool, out: list[dict]) -> bool:
        """Send the call's name once `<function=NAME>` is complete; False while it is not (and once
        the block turns out not to be a call)."""
        body = self.text[call.body : end]
        lead = body.lstrip()
        head = _FUNCTION_HEAD.match(lead)
        if head is None:
            undecided = _HEAD.startswith(lead) or (lead.startswith(_HEAD) and not re.search(r"[>\n]", lead[len(_HEAD) :]))
            if ended or not undecided:
                self.broken, self.scanned, self.current = True, call.open_at, None
            return False
        name = head.group(1).strip()
        call.index, call.properties = self.calls, _properties(name, self.tools)
        call.scan = call.checked = call.body + len(body) - len(lead) + head.end()
        self.calls += 1
        out.append({"index": call.index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": name, "arguments": ""}})
        return True

    def _parameters(self, call: _XmlCall, end: int, ended: bool, out: list[dict]) -> bool:
        """Send the parameters whose values are whole, then the closing brace once the function is
        (`</function>`, or the block ended); True once it went out."""
        fresh = self.text[max(call.scan, call.checked - len(_PARAMETER_ENDS[0])) : end]
        call.checked = end
        if not ended and not any(tag in fresh for tag in _PARAMETER_ENDS):
            return False  # no value became whole
        rest = self.text[call.scan : end]  # from the next parameter to the block's end so far
        closing = rest.find("</function>")
        closed = closing >= 0 or ended
        body = rest[:closing] if closing >= 0 else rest.rstrip() if ended else rest
        base = call.scan
        for parameter in _PARAMETER.finditer(body):
            # whole: the function ended, or `</parameter>` was read past the value (the other two ends
            # of `_PARAMETER` read nothing), or the next parameter begins
            whole = closed or parameter.end() > parameter.end(2) or body.startswith("<parameter=", parameter.end())
            if not whole:
                break
            key = parameter.group(1).strip()
            value = _typed(_trim(parameter.group(2)), call.properties.get(key, {}))
            out.append({"index": call.index, "function": {"arguments": ("{" if not call.sent else ", ") + json.dumps(
                key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)}})
            call.sent, call.scan = call.sent + 1, base + parameter.end()
        if not closed:
            return False
        out.append({"index": call.index, "function": {"arguments": "}" if call.sent else "{}"}})
        call.finished = True
        return True

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, `tool_calls` deltas not yet sent): before any call began,
        `parse_tool_calls` of the whole text (without calls, everything held back is content);
        after, the rest of the calls (a block left open included), or the text from a block that
        is not a call on."""
        if not self.calls:
            _, calls = parse_tool_calls(self.text, self.fmt, self.tools)
            if not calls:
                out, self.sent = self.text[self.sent :], len(self.text)
                return out, []
            return self.text[self.sent : self.text.index(OPEN)].rstrip(), self._indexed(calls)
        if self.fmt == "qwen3_xml":
            deltas = self._xml_deltas(final=True)
            calls: list[dict] | None = [] if not self.broken else None
        else:
            deltas = []
            calls = None if self.broken else _calls(_BLOCK.finditer(self.text[self.scanned :]), self.fmt, self.tools)
        if calls is None:
            rest = self.text[self.scanned :]
            return rest[rest.find(OPEN) :].strip(), deltas
        return "", deltas + self._indexed(calls)
