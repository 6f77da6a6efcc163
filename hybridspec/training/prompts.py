"""The categorized prompt set (SPEED-Bench style): snippets of held-out standard-library files
cut where the continuation is of a known kind.

    table      a line inside a run of >= 8 lines of one shape holding literals   structured data
               (codec tables, opcode and token numbers, rows of a test table)
    test       an assertion line in a test module                                 repetitive code
    code       a statement inside a function body                                 code
    comment    the text of a comment line                                         prose
    docstring  the text of a docstring, after its opening quotes                  prose
    imports    a top-level import line after at least two others                  boilerplate

A cutter yields the offset where the continuation's first word starts; the prompt then ends on
the boundary that the byte-level BPE puts there (`token_aligned`): the pre-tokens of
"\\n        self" are "\\n       " and " self", so a prompt that kept the whole run of spaces
would end in a token the model only ever saw before more whitespace.

Each category gets `per_category` prompts (at most 6 from one file), chosen and split
calibration/test by a shuffle seeded with (seed, category)."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from .corpus import Corpus

CATEGORIES = ("table", "test", "code", "comment", "docstring", "imports")
CONTEXT_CHARS = 1200  # characters of preceding text kept (then cut to the token limit)
TABLE_BEFORE, TABLE_AFTER = 4, 3  # lines of the same shape before the cut line and after it

_STRING = re.compile(r"""[rRbBuUfF]{0,2}(?:'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")""")
_NUMBER = re.compile(r"\b(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\b")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def line_shape(line: str) -> str:
    """A line with its strings as $, numbers as 9, names as I and any comment as a final #:
    `    0x0041: 0x0041,     #  LATIN CAPITAL LETTER A` → `    9: 9, #`."""
    code, hash_, _ = _STRING.sub("$", line.rstrip("\n")).partition("#")
    return _NAME.sub("I", _NUMBER.sub("9", code.rstrip())) + (" #" if hash_ else "")


def token_aligned(text: str, cut: int) -> int:
    """`cut` moved onto the boundary that byte-level BPE puts there. Before a word, BPE splits a
    run of whitespace into (the run less its last character) + (that character, joined to the word
    when it is a space), so a prompt may end neither in one space nor in a whole run of two or more
    whitespace characters: "\\n        self" is cut before " self", "sys\\n\\nimport" before "\\nimport"."""
    if 0 < cut < len(text) and text[cut - 1].isspace() and not text[cut].isspace():
        if text[cut - 1] == " " or (cut >= 2 and text[cut - 2].isspace()):
            return cut - 1
    return cut


def _cuts_table(path: str, text: str) -> Iterator[int]:
    lines = _lines(text)
    shapes = [line_shape(line) for line in lines]
    starts = list(itertools.accumulate(map(len, lines), initial=0))
    first = 0
    while first < len(lines):  # [first, last]: a run of lines of one shape
        last = first
        while last + 1 < len(lines) and shapes[last + 1] == shapes[first]:
            last += 1
        shape = shapes[first].strip()
        if len(shape) >= 3 and ("9" in shape or "$" in shape):
            for k in range(first + TABLE_BEFORE, last - TABLE_AFTER + 1):
                yield starts[k] + _indent(lines[k])
        first = last + 1


def _cuts_test(path: str, text: str) -> Iterator[int]:
    if "test" not in path.split("/")[0] and "/test" not in path:
        return
    offset = 0
    for line in _lines(text):
        if re.match(r"\s+self\.assert", line):
            yield offset + _indent(line)
        offset += len(line)


def _cuts_code(path: str, text: str) -> Iterator[int]:
    offset = 0
    for line in _lines(text):
        if re.match(r" {8}(if|for|return|while|with|try|[a-z_]+ = )", line):
            yield offset + 8
        offset += len(line)


def _cuts_comment(path: str, text: str) -> Iterator[int]:
    offset = 0
    for line in _lines(text):
        match = re.match(r"(\s*# )[A-Za-z]", line)
        if match:
            yield offset + len(match.group(1))
        offset += len(line)


def _cuts_docstring(path: str, text: str) -> Iterator[int]:
    for match in re.finditer(r"(def|class) [^\n]*:\n\s+\"\"\"", text):
        yield match.end()


def _cuts_imports(path: str, text: str) -> Iterator[int]:
    offset, run = 0, 0
    for line in _lines(text):
        if re.match(r"(import|from) ", line):
            if run >= 2:
                yield offset
            run += 1
        elif line.strip():  # blank lines keep the run; anything else ends it
            run = 0
        offset += len(line)


CUTTERS: dict[str, Callable[[str, str], Iterator[int]]] = {
    "table": _cuts_table, "test": _cuts_test, "code": _cuts_code, "comment": _cuts_comment,
    "docstring": _cuts_docstring, "imports": _cuts_imports,
}


def build_prompt_set(corpus: Corpus, encode: Callable[[str], list[int]], *, per_category: int = 80,
                     max_tokens: int = 512, context_chars: int = CONTEXT_CHARS, seed: int = 0) -> list[dict]:
    """Prompts from held-out files: {"id", "category", "split", "prompt", "source"} records."""
    held = [f for f in corpus.files if f.held_out]
    records = []
    for category in CATEGORIES:
        rng = random.Random(f"{seed}/{category}")  # one stream per category: editing one leaves the others
        cuts = [(f, token_aligned(f.text, cut)) for f in held for cut in CUTTERS[category](f.path, f.text)
                if cut > 200]
        if len(cuts) < per_category:
            raise ValueError(f"prompt set: only {len(cuts)} '{category}' sites in held-out files, need {per_category}")
        rng.shuffle(cuts)
        chosen, per_file = [], Counter()
        for f, cut in cuts:  # at most 6 prompts per file, for variety
            if per_file[f.path] >= 6:
                continue
            text = f.text[max(0, cut - context_chars) : cut]
            while len(encode(text)) > max_tokens:  # dense text: keep less context
                text = text[len(text) // 4 :]
            chosen.append((f.path, cut, text))
            per_file[f.path] += 1
            if len(chosen) == per_category:
                break
        if len(chosen) < per_category:
            raise ValueError(f"prompt set: only {len(chosen)} usable '{category}' prompts, need {per_category}")
        splits = ["calib"] * (per_category // 2) + ["test"] * (per_category - per_category // 2)
        rng.shuffle(splits)
        for i, ((path, cut, text), split) in enumerate(zip(chosen, splits)):
            records.append({"id": f"{category}-{i:03d}", "category": category, "split": split, "prompt": text,
                            "source": f"{path}:{cut}"})
    return records


def write_prompt_set(records: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
