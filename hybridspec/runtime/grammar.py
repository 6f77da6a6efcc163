"""Structured output: the tokens a grammar allows, row by row of a verification pass, exact under
speculation.

A request may hold its output to a grammar (`GrammarSpec`): any JSON value, a JSON schema, a regular
expression, one of given strings, EBNF, or an xgrammar structural tag (the tool calls a chat
request requires, in the model's own call format: `GrammarSpec.tool_calls`). xgrammar compiles it against the tokenizer's vocabulary
(`GrammarCompiler`) and its matcher gives, from any state, the bitmask of the tokens that may come
next; the request's end tokens are allowed once the grammar is complete and end it.

Row i of a verification pass decides the token after the anchor and the drafts d_1 … d_i, so its
mask is the grammar's after the output so far and those drafts (`GrammarState.constrain`): the
matcher accepts d_1 … d_i one at a time, filling row i's bitmask after each, then rolls back. A draft
the grammar refuses ends the walk: the row before it already refuses that draft, so neither greedy
acceptance nor the point-mass rule accepts it, and no later row decides an emitted token (those
rows keep every token); so does an end token once the grammar is complete, which ends the output.
Refused tokens' logits become −inf before penalties and the choice, so every policy emits the tokens
`ar` emits under the same grammar. A state that allows no token at all (a grammar with a dead end)
allows the end tokens, so that the output ends rather than emitting a refused token.

A thinking model's prompt may open a `<think>` block; `GrammarSpec.after_reasoning` then lets the
output reason freely up to `</think>` and holds what follows to the grammar.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from ..kernels.bitmask import reference as bitmask_reference

KINDS = ("json", "json_schema", "regex", "choice", "ebnf", "structural_tag")
WHITESPACE_RUN = 2  # the most whitespace characters in a row inside a forced tool call's JSON arguments
CACHE_BYTES = 256 << 20  # compiled grammars kept for reuse
TAG_MODELS = {"hermes": "qwen_3", "qwen3_xml": "qwen_3_5"}  # a tool-call format → xgrammar's template of it


class GrammarError(ValueError):
    """The grammar cannot be compiled (a bad schema, regular expression or EBNF), or the request
    cannot end under it."""


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match. `value`: the JSON schema's text (`json_schema`), the
    regular expression (`regex`), the choices as a JSON list of strings (`choice`), the EBNF
    (`ebnf`), or "" (`json`: any JSON value)."""

    kind: Literal["json", "json_schema", "regex", "choice", "ebnf", "structural_tag"]
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def choice(cls, options: list[str]) -> "GrammarSpec":
        if not options or any(not isinstance(o, str) or not o for o in options):
            raise GrammarError("choices must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(list(options)))

    @classmethod
    def tool_calls(cls, fmt: str, tools: list[dict], tool_choice, reasoning: str, *,
                   parallel: bool = True) -> "GrammarSpec":
        """The output of a chat request whose `tool_choice` is `required` (at least one call of any
        tool) or names a function (a call of it): calls in format `fmt` (`serve/tools.py`) with
        arguments held to each tool's parameter schema (an object, where a tool gives none); one
        call only unless `parallel`. `reasoning`: `enabled` (the prompt opened a block: reasoning up
        to `</think>` first), `auto` (the model may write a whole block first) or `disabled`."""
        tools = [{**t, "function": {**t["function"], "parameters": t["function"].get("parameters")
                                    or {"type": "object", "properties": {}}}} for t in tools]
        import xgrammar as xgr

        try:
            tag = xgr.get_model_structural_tag(TAG_MODELS[fmt], tools=tools, tool_choice=tool_choice,
                                               reasoning=reasoning, max_whitespace_cnt=WHITESPACE_RUN,
                                               parallel_tool_calls=parallel)
        except (ValueError, KeyError) as exc:
            raise GrammarError(f"no grammar for these tools: {_first_line(exc)}") from None
        return cls("structural_tag", json.dumps(_calls_only(json.loads(tag.model_dump_json()))))

    def after_reasoning(self) -> "GrammarSpec":
        """This grammar after a reasoning block the prompt opened: any text up to `</think>`, a blank
        line, then this grammar's sentence (as vLLM starts a grammar where the reasoning ends)."""
        if self.kind == "structural_tag":
            raise GrammarError("a structural tag carries its own reasoning")
        content = {"json": {"type": "json_schema", "json_schema": True},
                   "json_schema": {"type": "json_schema", "json_schema": json.loads(self.value or "true"),
                                   "max_whitespace_cnt": WHITESPACE_RUN},
                   "regex": {"type": "regex", "pattern": self.value},
                   "choice": {"type": "grammar", "grammar": _choice_ebnf(json.loads(self.value or "[]"))},
                   "ebnf": {"type": "grammar", "grammar": self.value}}[self.kind]
        reasoning = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": "</think>"}
        sequence = [reasoning, {"type": "const_string", "value": "\n\n"}, content]
        return GrammarSpec("structural_tag", json.dumps({"type": "structural_tag",
                                                         "format": {"type": "sequence", "elements": sequence}}))


class GrammarCompiler:
    """xgrammar's compiler for one tokenizer and vocabulary (it caches what it compiled)."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: tuple[int, ...]):
        """tokenizer: a `tokenizers.Tokenizer`; vocab_size: the model's logit width (≥ the
        tokenizer's vocabulary; the padding rows are never allowed); end_ids: the model's EOS
        tokens (a request's matcher takes its own)."""
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                  vocab_size=vocab_size, stop_token_ids=list(end_ids))
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=CACHE_BYTES)

    def compile(self, spec: GrammarSpec):
        """The compiled grammar of `spec` (xgrammar's `CompiledGrammar`); GrammarError says why not."""
        c = self._compiler
        try:
            if spec.kind == "json":
                return c.compile_builtin_json_grammar()
            if spec.kind == "json_schema":
                return c.compile_json_schema(spec.value, any_whitespace=False)  # no whitespace runs between items
            if spec.kind == "regex":
                return c.compile_regex(spec.value)
            if spec.kind == "choice":
                return c.compile_grammar(_choice_ebnf(json.loads(spec.value)))
            if spec.kind == "structural_tag":
                return c.compile_structural_tag(spec.value)
            return c.compile_grammar(spec.value)
        except (RuntimeError, ValueError) as exc:  # xgrammar's parse errors
            raise GrammarError(f"the {spec.kind} grammar does not compile: {_first_line(exc)}") from None


def _bit(j: int) -> int:
    """Bit j of an int32 word, as a Python int that fits int32 (bit 31 is the sign)."""
    return -(1 << 31) if j == 31 else 1 << j


def _calls_only(node):
    """xgrammar's structural tag with its required calls (`triggered_tags` with `at_least_one`, which
    lets any text run before, between and after the calls) as calls only, one after another on
    their own lines, so that the output ends with the last call's block."""
    if isinstance(node, list):
        return [_calls_only(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "triggered_tags" and node.get("at_least_one"):
        return {"type": "tags_with_separator", "tags": node["tags"], "separator": "\n", "at_least_one": True,
                "stop_after_first": node.get("stop_after_first", False)}
    return {key: _calls_only(value) for key, value in node.items()}


def _choice_ebnf(options: list[str]) -> str:
    """EBNF whose language is exactly the given strings."""
    return "root ::= " + " | ".join(json.dumps(o) for o in options)


def _first_line(exc: Exception) -> str:
    """The message of an xgrammar error without its `[time] source.cc:line:` prefix."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r"^\[[0-9:]+\]\s*\S+:\d+:\s*", "", line)[:300]


def masked(logits: Tensor, bitmask: Tensor, fused: bool = False) -> Tensor:
    """logits [w, V] → fp32 logits with the tokens `bitmask` [w, ⌈V/32⌉] int32 refuses at −inf
    (bit j of word i: token 32·i + j allowed): `kernels/bitmask`, its Triton form (one launch)
    where `fused`. Device ops of fixed shapes only (the resident round applies it inside its graphs)."""
    fn = bitmask_reference.masked_logits
    if fused:
        from ..kernels.bitmask.triton import masked_logits as fn
    return fn(logits, bitmask)


class GrammarState:
    """One request's matcher: the grammar's state after the output so far, and the masks of a pass's
    rows. Host-side: `rows` fills one bitmask row per pass row; `constrain` applies them to logits
    on any device, as the resident round's graphs apply them (`masked`)."""

    def __init__(self, compiled, end_ids: tuple[int, ...], vocab_size: int):
        import xgrammar as xgr

        if not end_ids:
            raise GrammarError("structured output needs an end token (the model's EOS or stop_token_ids)")
        self._xgr = xgr
        self.vocab_size, self.end_ids = vocab_size, tuple(end_ids)
        self.ended = False  # an end token was emitted from a dead end
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(end_ids))
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [rows, ⌈V/32⌉] int32, CPU; grows to a pass's w

    def constrain(self, logits: Tensor, drafts: list[int] | None = None, fused: bool = False) -> Tensor:
        """logits [w, V] of a pass whose row i follows drafts d_1 … d_i → fp32 logits with every token
        the grammar refuses at row i set to −inf (module docstring; `masked`'s `fused`)."""
        return masked(logits, self.rows(drafts, logits.shape[0]).to(logits.device), fused)

    def rows(self, drafts: list[int] | None, w: int) -> Tensor:
        """The bitmasks [w, ⌈V/32⌉] int32 (CPU) of a pass's rows, row i after drafts d_1 … d_i; the
        matcher's state is left as it was."""
        matcher = self.matcher
        if self.bitmask.shape[0] < w:
            self.bitmask = self._xgr.allocate_token_bitmask(w, self.vocab_size)
        rows = self.bitmask[:w]
        rows.fill_(-1)  # every token, for the rows after a refused draft or an end token
        self._fill(rows, 0)
        walked = 0
        for i, token in enumerate((drafts or [])[: w - 1], start=1):
            if not matcher.accept_token(token):
                break
            walked += 1
            if matcher.is_terminated():  # an end token: the output ends there
                break
            self._fill(rows, i)
        if walked:
            matcher.rollback(walked)
        return rows

    def _fill(self, rows: Tensor, i: int) -> None:
        """Row i's bitmask from the matcher's state; a state that allows nothing allows the end tokens."""
        if self.matcher.is_terminated() or self.ended:
            return
        self.matcher.fill_next_token_bitmask(rows, i)
        if not rows[i].any():
            for token in self.end_ids:
                rows[i, token >> 5] |= _bit(token & 31)

    def allows_anything(self) -> bool:
        """Whether the grammar's first state allows any token but an end token."""
        first = self.rows(None, 1)[0].clone()
        for token in self.end_ids:
            first[token >> 5] &= ~_bit(token & 31)
        return bool(first.any())

    def accept(self, tokens: list[int]) -> None:
        """Advance past emitted tokens (each one allowed by the row that decided it)."""
        for token in tokens:
            if self.matcher.is_terminated() or self.ended:
                return
            if not self.matcher.accept_token(token):
                if token in self.end_ids:  # the end a dead end allows (`_fill`)
                    self.ended = True
                    return
                raise RuntimeError(f"token {token} was emitted although the grammar refuses it")

    @property
    def complete(self) -> bool:
        """Whether the output so far is a whole sentence of the grammar."""
        return self.matcher.is_completed()
