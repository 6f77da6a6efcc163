"""Tool calls (serve/tools.py): the Hermes blocks of a model's text become OpenAI calls, the text
before them the content; anything else stays text; streamed, the content sent plus the rest equals
the content of the whole text, nothing of a call is sent as content, and each call goes out as its
block closes."""

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


def _streamed(stream: ToolStream, text: str, step: int) -> tuple[str, list[tuple[int, dict]], str, list[dict]]:
    """(content sent, (characters fed, call) as each call went out, finish's content, finish's calls)."""
    sent, calls = "", []
    for i in range(0, len(text), step):
        content, found = stream.feed(text[i : i + step])
        sent += content
        calls += [(min(i + step, len(text)), call) for call in found]
    rest, more = stream.finish()
    return sent, calls, rest, more


def merged(deltas: list[dict]) -> list[dict]:
    """OpenAI's `tool_calls` deltas put together as a client does: per index, the first delta's id,
    type and name, and every delta's arguments concatenated."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        first = delta["index"] not in calls
        assert ("id" in delta) == ("name" in delta["function"]) == first  # id, type and name once, first
        call = calls.setdefault(delta["index"], {"id": delta.get("id"), "type": delta.get("type"),
                                                 "function": {"name": delta["function"].get("name"), "arguments": ""}})
        call["function"]["arguments"] += delta["function"].get("arguments", "")
    assert list(calls) == list(range(len(calls)))  # indices from 0, each call's deltas after the one before's
    return list(calls.values())


@pytest.mark.parametrize("text", [TWO_CALLS, "plain text < with a bracket <tool", "x <tool_call>oops</tool_call>"])
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_content_and_calls_equal_the_whole_texts(text, step):
    sent, fed, rest, more = _streamed(ToolStream(), text, step)
    assert "<tool_call>" not in sent  # held back until the text says whether it is a call
    content, want_calls = parse_tool_calls(text)
    calls = merged([call for _, call in fed] + more)
    assert [c["function"] for c in calls] == [c["function"] for c in want_calls]
    assert sent + rest == (content or "" if calls else text)


@pytest.mark.parametrize("step", [1, 4])
def test_each_call_goes_out_when_its_block_closes(step):
    text = TWO_CALLS + "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}"  # the last block left open
    sent, fed, rest, more = _streamed(ToolStream(), text, step)
    closes = [TWO_CALLS.index("</tool_call>") + len("</tool_call>"), len(TWO_CALLS)]
    assert [(at, call["function"]["name"]) for at, call in fed] == [
        (min(-(-end // step) * step, len(text)), name) for end, name in zip(closes, ("get_weather", "get_time"))]
    assert [call["function"] for call in more] == [{"name": "f", "arguments": "{}"}]  # the open block, at the end
    assert (sent, rest) == ("Let me check.", "")


def test_a_block_that_is_not_a_call_ends_the_calls():
    good = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    sent, fed, rest, more = _streamed(ToolStream(), "Hi " + good + " <tool_call>oops</tool_call> " + good, 5)
    assert sent == "Hi" and [c["function"]["name"] for _, c in fed] == ["f"] and not more
    assert rest == "<tool_call>oops</tool_call> " + good  # after a call went out: content at the end
    text = "Hi <tool_call>oops</tool_call> " + good  # before any call: the whole text is content, as unstreamed
    sent, fed, rest, more = _streamed(ToolStream(), text, 5)
    assert (sent + rest, fed, more) == (text, [], [])


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "warm": {"type": "boolean"}, "scale": {"type": "number"},
    "where": {"type": "object"}, "tags": {"type": "array"}, "code": {"type": "string"}, "note": {"type": ["string", "null"]}}}}}]
XML_CALLS = ("I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n<parameter=warm>\nTrue\n</parameter>\n<parameter=scale>\n1.5\n"
             "</parameter>\n<parameter=where>\n{\"lat\": 40}\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
             "<parameter=code>\n007\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>\n"
             "<tool_call>\n<function=get_time>\n<parameter=zone>\nline one\nline two\n</parameter>\n</function>\n</tool_call>")


def test_qwen3_xml_blocks_become_calls_typed_by_the_tools_schema():
    content, calls = parse_tool_calls(XML_CALLS, "qwen3_xml", WEATHER)
    assert content == "I will look it up."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "New York", "days": 3, "warm": True, "scale": 1.5, "where": {"lat": 40}, "tags": ["a", "b"],
        "code": "007", "note": None}
    assert json.loads(calls[1]["function"]["arguments"]) == {"zone": "line one\nline two"}  # no schema: JSON or text
    cut = "<tool_call>\n<function=get_weather>\n<parameter=days>\n12"  # left open by the budget
    assert json.loads(parse_tool_calls(cut, "qwen3_xml", WEATHER)[1][0]["function"]["arguments"]) == {"days": 12}
    bad = "<tool_call>\n<function=get_weather>\n<parameter=days>\nmany\n</parameter>\n</function>\n</tool_call>"
    assert json.loads(parse_tool_calls(bad, "qwen3_xml", WEATHER)[1][0]["function"]["arguments"]) == {"days": "many"}
    assert parse_tool_calls("<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "qwen3_xml") == (
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", [])  # not this format's block: text


XML_CASES = [
    XML_CALLS,
    XML_CALLS + "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOs",  # left open mid-value by the budget
    "Go.\n<tool_call>\n<function=ping>\n</function>\n</tool_call>",  # no parameters: {}
    "<tool_call><function=get_weather><parameter=city>A<parameter=days>4</function></tool_call>",  # unclosed values
    "<tool_call>\n<function=get_weather>\n<parameter=where>\n{\"a\": \"</para\"}\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n<parameter=</parameter>\nx\n</function>\n</tool_call>",  # a name that ends like the close
]


@pytest.mark.parametrize("text", XML_CASES)
@pytest.mark.parametrize("step", [1, 2, 5, 13, 1000])
def test_streamed_xml_calls_equal_the_whole_text(text, step):
    """The name, then the arguments parameter by parameter: put together, the unstreamed calls."""
    sent, fed, rest, more = _streamed(ToolStream("qwen3_xml", WEATHER), text, step)
    content, want = parse_tool_calls(text, "qwen3_xml", WEATHER)
    calls = merged([call for _, call in fed] + more)
    assert sent + rest == (content or "") and want
    assert [c["function"] for c in calls] == [c["function"] for c in want]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_xml_names_and_parameters_go_out_as_they_are_whole():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
    _, fed, _, more = _streamed(ToolStream("qwen3_xml", WEATHER), text, 1)
    at = [(n, d["function"].get("name"), d["function"]["arguments"]) for n, d in fed]
    assert at == [(text.index("<function=get_weather>") + len("<function=get_weather>"), "get_weather", ""),
                  (text.index("</parameter>") + len("</parameter>"), None, '{"city": "Paris"'),
                  (text.index("</parameter>\n</function>") + len("</parameter>"), None, ', "days": 3'),
                  (text.index("</function>") + len("</function>"), None, "}")] and not more


def test_an_xml_block_that_is_not_a_call_after_one_ends_the_calls():
    good = "<tool_call>\n<function=ping>\n</function>\n</tool_call>"
    text = "Hi " + good + "\n<tool_call>\n{\"name\": \"f\"}\n</tool_call> " + good
    sent, fed, rest, more = _streamed(ToolStream("qwen3_xml", WEATHER), text, 3)
    assert sent == "Hi" and [c["function"] for c in merged([d for _, d in fed] + more)] == [
        {"name": "ping", "arguments": "{}"}]
    assert rest == text[text.index("<tool_call>", 4) :]


@pytest.mark.parametrize("schema, value, want", [
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "12345", "12345"),  # pydantic's Optional[str]
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "12", 12),
    ({"enum": ["1", "2"]}, "1", "1"),
    ({"enum": [1, 2]}, "1", 1),
    ({"const": True}, "true", True),
    ({}, "true", "true"),  # no type known: the text, as vLLM keeps it
    ({"type": "number"}, "NaN", "NaN"),  # not finite: kept as text, so that arguments stay JSON
    ({"type": "number"}, "1e400", "1e400"),
    ({"type": "number"}, "2.5", 2.5),
    ({"type": "object"}, "[1]", "[1]"),
    ({"type": ["integer", "null"]}, "null", None),
    ({"type": "string"}, "null", "null"),
])
def test_xml_values_follow_their_schema(schema, value, want):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"p": schema}}}}]
    text = f"<tool_call>\n<function=f>\n<parameter=p>\n{value}\n</parameter>\n</function>\n</tool_call>"
    arguments = parse_tool_calls(text, "qwen3_xml", tools)[1][0]["function"]["arguments"]
    assert json.loads(arguments) == {"p": want} and "NaN" not in arguments.replace('"NaN"', "")


def test_the_template_names_the_format():
    from hybridspec.serve.tools import tool_format

    assert tool_format("...<tool_call>\n<function=example_function_name>\n<parameter=x>...") == "qwen3_xml"
    assert tool_format('...<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}...') == "hermes"
    assert tool_format(None) == "hermes"


def test_blocks_are_parsed_only_when_one_closes(monkeypatch):
    """A long call streamed a character at a time is searched for its blocks once per closing tag,
    not once per delta (a rescan per delta would be quadratic in the call's length)."""
    import hybridspec.serve.tools as tools

    scans = []

    class Counting:
        def finditer(self, text, pos=0):
            scans.append(pos)
            return tools._CLOSED_BLOCK_PATTERN.finditer(text, pos)

    monkeypatch.setattr(tools, "_CLOSED_BLOCK_PATTERN", tools._CLOSED_BLOCK, raising=False)
    monkeypatch.setattr(tools, "_CLOSED_BLOCK", Counting())
    text = TWO_CALLS.replace("Paris", "P" * 3000)
    sent, fed, rest, more = _streamed(ToolStream(), text, 1)
    assert [c["function"]["name"] for _, c in fed] == ["get_weather", "get_time"] and not more
    assert len(scans) == 2
