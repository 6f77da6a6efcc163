"""Reasoning in chat completions: the `<think> … </think>` block of Qwen3-family models comes back
as the message's `reasoning_content` and the text after it as `content` (vLLM's `qwen3` reasoning
parser).

Qwen3.5 and Qwen3.6 templates open the block in the prompt (`<think>\\n` after the assistant's turn
opens; with `enable_thinking: false` they write an empty block there instead), so the output starts
inside it and only `</think>` appears; older Qwen3 models write `<think>` themselves. The block is
open at the start of the output when the prompt ends with `<think>`, or when the output begins
with it. A block the budget cut before `</think>` is reasoning only. A `<tool_call>`
inside an open block ends it, as vLLM reads Qwen3.5 (which may call a tool without closing it).
Streamed, reasoning and content go out as they come; a tail that may be the start of `</think>`
waits for the next delta.
"""

from __future__ import annotations

from .tools import OPEN as TOOL_OPEN

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PARSERS = ("auto", "none", "qwen3")


def reasoning_parser(choice: str, templates: list[str]) -> bool:
    """Whether chat outputs are split into reasoning and content: `qwen3`, or `auto` where a chat
    template writes `</think>`."""
    if choice not in PARSERS:
        raise ValueError(f"reasoning parser must be one of {', '.join(PARSERS)}, got {choice!r}")
    return choice == "qwen3" or (choice == "auto" and any(THINK_CLOSE in t for t in templates))


def opens_in_prompt(prompt: str) -> bool:
    """Whether the prompt ends by opening a `<think>` block for the output (as the assistant's turn
    of a Qwen3.5 template does; a `<think>` in an earlier message does not count)."""
    return prompt.rstrip().endswith(THINK_OPEN)


def split_reasoning(text: str, open_: bool) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output; `open_`: the prompt left the block open."""
    stream = ReasoningStream(open_)
    reasoning, content = stream.feed(text)
    rest_reasoning, rest_content = stream.finish()
    reasoning += rest_reasoning
    content += rest_content
    return (reasoning if stream.seen else None), content


class ReasoningStream:
    """`feed` each text delta: (reasoning, content) to send; `finish`: what was held back."""

    def __init__(self, open_: bool):
        self.inside = open_  # within the block
        self.start = not open_  # before any output: a leading `<think>` opens the block
        self.seen = open_  # a block was open at some point (reasoning_content is then a string)
        self.pending = ""  # text not yet classified
        self.trim = False  # just past `</think>`: the blank lines after it are dropped

    def feed(self, delta: str) -> tuple[str, str]:
        self.pending += delta
        reasoning, content = "", ""
        while self.pending:
            if self.start:
                stripped = self.pending.lstrip()
                if THINK_OPEN.startswith(stripped) and len(stripped) < len(THINK_OPEN):
                    break  # may yet become `<think>`
                self.start = False
                if stripped.startswith(THINK_OPEN):
                    self.inside = self.seen = True
                    self.pending = stripped[len(THINK_OPEN):]
                continue
            if not self.inside:
                if self.trim:
                    self.pending = self.pending.lstrip("\n")
                    self.trim = not self.pending
                content, self.pending = content + self.pending, ""
                break
            ends = [(i, marker) for marker in (THINK_CLOSE, TOOL_OPEN) if (i := self.pending.find(marker)) >= 0]
            if ends:
                at, marker = min(ends)
                reasoning += self.pending[:at]
                self.inside = False
                # `</think>` and the blank lines after it are dropped; a `<tool_call>` stays, as content
                closed = marker == THINK_CLOSE
                self.pending, self.trim = self.pending[at + len(THINK_CLOSE):] if closed else self.pending[at:], closed
                continue
            keep = _partial_tail(self.pending, (THINK_CLOSE, TOOL_OPEN))
            reasoning, self.pending = reasoning + self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep:]
            break
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.inside:
            return rest, ""
        return "", rest


def _partial_tail(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest tail of `text` that is a proper prefix of a marker."""
    for k in range(min(max(len(m) for m in markers) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return k
    return 0
