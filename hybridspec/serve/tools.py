"""Tool calls in chat completions: the calls a model writes in its text, in the Hermes format of
Qwen's chat templates (vLLM's `hermes` parser),

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

become OpenAI `tool_calls` (arguments as a JSON string) and the text before the first call the
message's content. Text whose blocks are not such JSON objects stays content. Streamed, content
goes out until a call may begin (`ToolStream` holds back what may be the start of `<tool_call>`
and the space before it); the calls go out whole in the last chunk, and the content streamed is
the content of the whole text (empty where that is None).
"""

from __future__ import annotations

import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a model's text: no calls, the text as it is; else the text before the
    first `<tool_call>` without its trailing space (None when blank) and one OpenAI call per block (a block left open at the
    end of the text counts, as a model stopped by its budget may leave it)."""
    if OPEN not in text:
        return text, []
    calls = []
    for block in _BLOCK.finditer(text):
        try:
            call = json.loads(block.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    content = text[: text.index(OPEN)].rstrip()
    return (content if content.strip() else None), calls


class ToolStream:
    """The content of a streamed chat with tools: `feed` each text delta and send what it returns;
    `finish` gives the rest of the content and the calls (`parse_tool_calls` of the whole text)."""

    def __init__(self):
        self.text, self.sent = "", 0

    def feed(self, delta: str) -> str:
        self.text += delta
        end = self.text.find(OPEN)
        if end < 0:  # hold back a tail that may be the start of `<tool_call>`
            end = len(self.text)
            for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1):
                if OPEN.startswith(self.text[-k:]):
                    end -= k
                    break
        while end > self.sent and self.text[end - 1].isspace():  # content ends before the space before a call
            end -= 1
        out, self.sent = self.text[self.sent : max(end, self.sent)], max(end, self.sent)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, calls): without calls, everything held back is content."""
        _, calls = parse_tool_calls(self.text)
        if not calls:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out, []
        return self.text[self.sent : self.text.index(OPEN)].rstrip(), calls
