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
rows keep every token). Refused tokens' logits become −inf before penalties and the choice, so every
policy emits the tokens `ar` emits under the same grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

KINDS = ("json", "json_schema", "regex", "choice", "ebnf", "structural_tag")
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
    def tool_calls(cls, fmt: str, tools: list[dict], tool_choice, reasoning: bool) -> "GrammarSpec":
        """The output of a chat request whose `tool_choice` is `required` (at least one call of any
        tool) or names a function (a call of it): calls in format `fmt` (`serve/tools.py`) with
        arguments held to each tool's parameter schema, after a reasoning block closed with
        `</think>` when `reasoning` (the prompt opened one)."""
        import xgrammar as xgr

        try:
            tag = xgr.get_model_structural_tag(TAG_MODELS[fmt], tools=tools, tool_choice=tool_choice,
                                               reasoning="enabled" if reasoning else "disabled")
        except (ValueError, KeyError) as exc:
            raise GrammarError(f"no grammar for these tools: {_first_line(exc)}") from None
        return cls("structural_tag", tag.model_dump_json())


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
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)

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


def _choice_ebnf(options: list[str]) -> str:
    """EBNF whose language is exactly the given strings."""
    return "root ::= " + " | ".join(json.dumps(o) for o in options)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def unpack(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bitmask [w, ⌈V/32⌉] int32 (bit j of word i: token 32·i + j allowed) → allowed [w, V] bool.
    Device ops of fixed shapes only (the resident round applies it inside its graphs)."""
    ids = torch.arange(vocab_size, device=bitmask.device)
    return ((bitmask.index_select(1, ids >> 5) >> (ids & 31)) & 1).bool()


def masked(logits: Tensor, bitmask: Tensor) -> Tensor:
    """logits [w, V] → fp32 logits with the tokens `bitmask` [w, ⌈V/32⌉] refuses at −inf."""
    return logits.float().masked_fill(~unpack(bitmask, logits.shape[1]), float("-inf"))


class GrammarState:
    """One request's matcher: the grammar's state after the output so far, and the masks of a pass's
    rows. Host-side: `rows` fills one bitmask row per pass row; `constrain` applies them to logits
    on any device, as the resident round's graphs apply them (`masked`)."""

    def __init__(self, compiled, end_ids: tuple[int, ...], vocab_size: int):
        import xgrammar as xgr

        if not end_ids:
            raise GrammarError("structured output needs an end token (the model's EOS or stop_token_ids)")
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(end_ids))
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [rows, ⌈V/32⌉] int32, CPU; grows to a pass's w

    def constrain(self, logits: Tensor, drafts: list[int] | None = None) -> Tensor:
        """logits [w, V] of a pass whose row i follows drafts d_1 … d_i → fp32 logits with every token
        the grammar refuses at row i set to −inf (module docstring)."""
        return masked(logits, self.rows(drafts, logits.shape[0]).to(logits.device))

    def rows(self, drafts: list[int] | None, w: int) -> Tensor:
        """The bitmasks [w, ⌈V/32⌉] int32 (CPU) of a pass's rows, row i after drafts d_1 … d_i; the
        matcher's state is left as it was."""
        matcher = self.matcher
        if self.bitmask.shape[0] < w:
            self.bitmask = self._xgr.allocate_token_bitmask(w, self.vocab_size)
        rows = self.bitmask[:w]
        rows.fill_(-1)  # every token, for the rows after a refused draft
        matcher.fill_next_token_bitmask(rows, 0)
        walked = 0
        for i, token in enumerate((drafts or [])[: w - 1], start=1):
            if not matcher.accept_token(token):
                break
            walked += 1
            matcher.fill_next_token_bitmask(rows, i)
        if walked:
            matcher.rollback(walked)
        return rows

    def accept(self, tokens: list[int]) -> None:
        """Advance past emitted tokens (each one allowed by the row that decided it)."""
        for token in tokens:
            if self.matcher.is_terminated():
                return
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"token {token} was emitted although the grammar refuses it")

    @property
    def complete(self) -> bool:
        """Whether the output so far is a whole sentence of the grammar."""
        return self.matcher.is_completed()
