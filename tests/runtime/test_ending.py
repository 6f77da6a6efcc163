"""How an output ends (`runtime/ending.py`): stop sequences found as vLLM's detokenizer finds them,
a token at a time; the end tokens, their stop_reason and the ids left out of the text."""

from __future__ import annotations

import pytest

from hybridspec.runtime.ending import Ending, StopSequences, first_stop, output_text

PIECES = {0: " x", 1: "(", 2: "a", 3: "b)", 4: "ab", 5: "\ufffd", 6: "<eos>", 7: "<sp>"}  # token id → its text
IDS = [0, 1, 2, 3, 4]  # " x(ab)ab"


def _text(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def _vllm(ids: list[int], stops: list[str], min_tokens: int = 0) -> tuple[int, int, str] | None:
    """(tokens, where, which) as vLLM's `check_stop_strings` finds them after each token past the
    first min_tokens: the first stop, in the order given, that ends in the text the token added."""
    for k in range(min_tokens + 1, len(ids) + 1):
        text, new = _text(ids[:k]), len(PIECES[ids[k - 1]])
        for stop in stops:
            at = text.find(stop, max(0, len(text) - new - len(stop) + 1))
            if at >= 0:
                return k, at, stop
    return None


@pytest.mark.parametrize("stops, min_tokens", [(("b)", "(a"), 0), (("(a", "b)"), 0), (("ab", "b)"), 0),
                                               (("b)", "ab"), 0), (("a",), 3), (("(ab",), 2), (("x(",), 1),
                                               (("zz",), 0), (("b)a",), 4)])
def test_stop_sequences_end_where_vllm_ends_them(stops, min_tokens):
    """The fewest ids whose last token's text ends a stop sequence, past the first min_tokens (it may
    begin in their text: `(ab` with min_tokens 2); the first of the stops given wins where several
    end in one token (`ab` and `b)` both end in token 3); whichever count of ids was already seen."""
    sequences = StopSequences(stops, _text, min_tokens)
    want = _vllm(IDS, list(stops), min_tokens)
    for seen in range(len(IDS)):  # the ids shown before, a step at a time
        got = sequences.length(IDS, seen)
        if want is None or want[0] <= max(seen, min_tokens):
            continue
        assert got == want[0], (seen, got, want)
    if want is None:
        assert sequences.length(IDS, 0) is None
    else:
        k, at, stop = want
        assert sequences.cut(IDS[:k]) == (_text(IDS[:k])[:at], stop)


def test_a_trailing_partial_character_is_not_searched():
    """A trailing U+FFFD may be the first bytes of a character the next tokens complete: it is not
    searched; one that stays is, with the text after it."""
    assert first_stop("ab\ufffd", ["\ufffd"]) is None and first_stop("a\ufffdb", ["\ufffd"]) == (1, "\ufffd")
    assert StopSequences(("\ufffd",), _text).length([0, 5], 0) is None
    assert StopSequences(("\ufffd(",), _text).length([0, 5, 1], 0) == 3


def test_end_tokens_their_stop_reason_and_the_text_they_leave():
    """EOS ends the output unless ignore_eos; stop_reason is the stop token id, None for the model's
    EOS (which wins where it is a stop token id too, unless ignore_eos); the text leaves out the end
    tokens unless include_stop, and the skipped (special) ones."""
    plain = Ending((6,), (3,))
    assert plain.end_ids == (6, 3) and plain.stop_reason(3) == 3 and plain.stop_reason(6) is None
    assert Ending((6,), (3,), ignore_eos=True).end_ids == (3,)
    assert Ending((6,), (6,)).stop_reason(6) is None and Ending((6,), (6,), ignore_eos=True).stop_reason(6) == 6
    ids = [0, 7, 2, 6]
    assert output_text(_text, ids, plain.hidden()) == " x<sp>a"
    assert output_text(_text, ids, plain.hidden(frozenset({6, 7}))) == " xa"
    kept = Ending((6,), (3,), include_stop=True)
    assert output_text(_text, ids, kept.hidden()) == " x<sp>a<eos>"
    assert output_text(_text, ids, kept.hidden(frozenset({6, 7}))) == " xa"  # a special end token stays skipped
    assert output_text(_text, [0, 6, 2], Ending((6,), ignore_eos=True).hidden()) == " x<eos>a"


def test_each_length_of_the_output_is_decoded_once():
    """A caller that reads each step's text (`text`) and then searches it (`length`) decodes every
    length of the output once (the empty start once more), not the whole output again per search."""
    decoded = []
    sequences = StopSequences(("zz",), lambda ids: decoded.append(len(ids)) or _text(ids))
    for n in range(1, len(IDS) + 1):
        assert sequences.text(IDS[:n]) == _text(IDS[:n])
        assert sequences.length(IDS[:n], n - 1) is None
    assert decoded == [1, 0, 2, 3, 4, 5]
