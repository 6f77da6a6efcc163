"""How a request's output ends and which of its tokens are text, as vLLM's OpenAI server has it:
the end tokens (the model's EOS unless ignore_eos, and stop_token_ids), stop sequences matched
token by token in the text the client gets, and the tokens left out of that text (the end token
unless include_stop_str_in_output; special tokens under skip_special_tokens). `generate` and
`serve` both end their outputs here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Ending:
    """A request's end tokens and what its text keeps of them."""

    eos_ids: tuple[int, ...]  # the model's
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # the model's EOS is an ordinary token
    include_stop: bool = False  # include_stop_str_in_output: the stop sequence or end token that ends it stays

    @property
    def end_ids(self) -> tuple[int, ...]:
        """The tokens that end the output: the model's EOS (unless ignore_eos) and the stop token ids."""
        return tuple(dict.fromkeys((*(() if self.ignore_eos else self.eos_ids), *self.stop_token_ids)))

    def stop_reason(self, last: int) -> int | None:
        """vLLM's stop_reason of an output that token `last` ended: the stop token id; None for the
        model's EOS (which wins where it is a stop token id too, unless ignore_eos)."""
        if not self.ignore_eos and last in self.eos_ids:
            return None
        return last if last in self.stop_token_ids else None

    def hidden(self, skipped: frozenset[int] = frozenset()) -> frozenset[int]:
        """The ids left out of the output's text: the end tokens (no more part of it than a stop
        sequence is, unless include_stop) and `skipped` (the special tokens, under
        skip_special_tokens)."""
        return (frozenset() if self.include_stop else frozenset(self.end_ids)) | skipped


def output_text(decode: Callable[[list[int]], str], ids: list[int], hidden: frozenset[int]) -> str:
    """The text of output `ids` without the `hidden` ones (`Ending.hidden`)."""
    return decode([i for i in ids if i not in hidden])


def first_stop(text: str, stops: Sequence[str], new_from: int = 0) -> tuple[int, str] | None:
    """(where, which) of the first of `stops`, in their order, that ends past text[:new_from], or
    None: vLLM's rule, which searches each step's new text for a stop sequence that ends in it. A
    trailing U+FFFD is not searched: it may be the first bytes of a character that the next tokens
    complete (one that stays a U+FFFD is searched with them)."""
    text = text.rstrip("\ufffd")
    for stop in stops:
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at >= 0:
            return at, stop
    return None


@dataclass
class StopSequences:
    """vLLM's stop sequences over an output's tokens, one token at a time: a stop sequence counts
    once it ends in the text of a token after the first `min_tokens` (it may begin before); the
    output ends at that token, its text before the stop sequence. `text_of`: the text of output ids
    (`output_text`). One instance follows one output, whose ids only grow: `text` keeps the texts of
    the last two lengths asked for, so that a step decodes its output once (the step before's text
    is where its search starts)."""

    stops: tuple[str, ...]
    text_of: Callable[[list[int]], str]
    min_tokens: int = 0
    _texts: dict[int, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def text(self, ids: list[int]) -> str:
        """`text_of(ids)`, kept for the last two lengths asked for (a length names one prefix of the
        output this instance follows)."""
        text = self._texts.get(len(ids))
        if text is None:
            if len(self._texts) >= 2:
                del self._texts[min(self._texts)]
            text = self._texts[len(ids)] = self.text_of(ids)
        return text

    def length(self, ids: list[int], seen: int) -> int | None:
        """`Engine.generate`'s `stop`: the fewest ids whose last one's text ends a stop sequence,
        past the first `seen` (already searched) and the first min_tokens; None while none does."""
        start = max(seen, self.min_tokens)
        if len(ids) <= start:
            return None
        searched = self._searched(ids[:start])
        if first_stop(self.text(ids), self.stops, searched) is None:
            return None
        for k in range(start + 1, len(ids) + 1):
            text = self.text(ids[:k])
            if first_stop(text, self.stops, searched) is not None:
                return k
            searched = len(text.rstrip("\ufffd"))
        return None  # pragma: no cover (the whole text held one)

    def cut(self, ids: list[int]) -> tuple[str, str]:
        """(text before the stop sequence, the stop sequence) of output `ids` that `length` ended:
        the stop sequence ends in the last token's text."""
        text = self.text(ids)
        at, stop = first_stop(text, self.stops, self._searched(ids[:-1]))
        return text[:at], stop

    def _searched(self, ids: list[int]) -> int:
        """How much of the text of `ids` the search has seen (a trailing U+FFFD it has not)."""
        return len(self.text(ids).rstrip("\ufffd"))
