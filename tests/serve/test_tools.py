"""Tool calls (serve/tools.py): the Hermes blocks of a model's text become OpenAI calls, the text
before them the content; anything else stays text; streamed, the content sent plus the rest equals
the content of the whole text, and nothing of a call is sent as content."""

from __future__ import annotations

import json

import pytest

from hybridspec.serve.tools import ToolStream, parse_tool_calls

TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "note": "é"}}\n</tool_call>')


def test_hermes_blocks_become_openai_calls():
    content, calls = parse_tool_calls(TWO_CALLS)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"zone": "CET", "note": "é"}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    only, [call] = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')  # left open by the budget
    assert only is None and call["function"] == {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize("text", ["no calls here", "<tool_call>not json</tool_call>", '<tool_call>["f"]</tool_call>',
                                  '<tool_call>{"arguments": {}}</tool_call>'])
def test_text_that_is_not_a_call_stays_content(text):
    assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize("text", [TWO_CALLS, "plain text < with a bracket <tool", "x <tool_call>oops</tool_call>"])
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_content_equals_the_whole_texts(text, step):
    stream = ToolStream()
    sent = "".join(stream.feed(text[i : i + step]) for i in range(0, len(text), step))
    assert "<tool_call>" not in sent  # held back until the whole text says whether it is a call
    rest, calls = stream.finish()
    content, want_calls = parse_tool_calls(text)
    assert [c["function"] for c in calls] == [c["function"] for c in want_calls]
    if calls:
        assert sent + rest == (content or "")
    else:
        assert sent + rest == text
