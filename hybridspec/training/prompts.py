"""The categorized prompt set (SPEED-Bench style): snippets of held-out standard-library files
cut where the continuation is of a known kind.

    literal    inside a long run of similar lines ending in "," (tables, lists)   predictable
    test       just before an assertion line in a test module                     repetitive
    code       at the start of a statement inside a function body                 code
    comment    right after "# " that opens a comment line                         prose
    docstring  right after the opening quotes of a docstring                      prose

Each category gets `per_category` prompts, split calibration/test by a seeded shuffle."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from .corpus import Corpus

CATEGORIES = ("literal", "test", "code", "comment", "docstring")
CONTEXT_CHARS = 1200  # characters of preceding text kept (then cut to the token limit)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _cuts_literal(path: str, text: str) -> Iterator[int]:
    lines, offset, run = _lines(text), 0, 0
    for line in lines:
        run = run + 1 if line.rstrip().endswith(",") and len(line.strip()) > 3 else 0
        offset += len(line)
        if run >= 6 and run % 6 == 0:  # every sixth similar line, cut after it
            yield offset


def _cuts_test(path: str, text: str) -> Iterator[int]:
    if "test" not in path.split("/")[0] and "/test" not in path:
        return
    offset = 0
    for line in _lines(text):
        if re.match(r"\s+self\.assert", line):
            yield offset + len(line) - len(line.lstrip())
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


CUTTERS: dict[str, Callable[[str, str], Iterator[int]]] = {
    "literal": _cuts_literal, "test": _cuts_test, "code": _cuts_code, "comment": _cuts_comment,
    "docstring": _cuts_docstring,
}


def build_prompt_set(corpus: Corpus, encode: Callable[[str], list[int]], *, per_category: int = 80,
                     max_tokens: int = 512, context_chars: int = CONTEXT_CHARS, seed: int = 0) -> list[dict]:
    """Prompts from held-out files: {"id", "category", "split", "prompt"} records."""
    rng = random.Random(seed)
    held = [f for f in corpus.files if f.held_out]
    records = []
    for category in CATEGORIES:
        cuts = [(f, cut) for f in held for cut in CUTTERS[category](f.path, f.text) if cut > 200]
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
