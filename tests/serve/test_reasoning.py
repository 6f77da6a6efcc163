"""Reasoning (serve/reasoning.py): a `<think>` block becomes reasoning_content and the rest content,
whether the prompt opened the block or the output does; streamed in any pieces, the reasoning and
content sent equal the whole text's split."""

from __future__ import annotations

import pytest

from hybridspec.serve.reasoning import ReasoningStream, opens_in_prompt, reasoning_parser, split_reasoning

CASES = [  # (output, block opened by the prompt, reasoning, content)
    ("The user wants 2+2.\n</think>\n\nIt is 4.", True, "The user wants 2+2.\n", "It is 4."),
    ("<think>\nhmm\n</think>\n\nHi", False, "\nhmm\n", "Hi"),
    ("Hi there", False, None, "Hi there"),
    ("cut by the budget", True, "cut by the budget", ""),
    ("I should call it.\n<tool_call>\n<function=f>\n</function>\n</tool_call>", True, "I should call it.\n",
     "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    ("a < b and </thin is not the end</think>x", True, "a < b and </thin is not the end", "x"),
]


@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
def test_split_reasoning(text, opened, reasoning, content):
    assert split_reasoning(text, opened) == (reasoning, content)


@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
@pytest.mark.parametrize("step", [1, 2, 7])
def test_streamed_pieces_add_up_to_the_split(text, opened, reasoning, content, step):
    stream = ReasoningStream(opened)
    parts = [stream.feed(text[i : i + step]) for i in range(0, len(text), step)] + [stream.finish()]
    assert "".join(r for r, _ in parts) == (reasoning or "") and "".join(c for _, c in parts) == content
    assert not any("</think>" in r or "</think>" in c for r, c in parts)


def test_the_prompt_and_the_template_decide():
    assert opens_in_prompt("<|im_start|>assistant\n<think>\n")
    assert not opens_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking: false
    assert not opens_in_prompt("<|im_start|>assistant\n")
    assert reasoning_parser("auto", ["... <think>\n' + content + '\n</think> ..."])
    assert not reasoning_parser("auto", ["{{ messages }}"]) and reasoning_parser("qwen3", [])
    assert not reasoning_parser("none", ["</think>"])
    with pytest.raises(ValueError, match="reasoning parser"):
        reasoning_parser("deepseek", [])
