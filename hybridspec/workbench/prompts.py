"""Prompt sets: JSONL with `id`, `category`, `split` (`calib` or `test`) and `prompt` (text) or
`prompt_ids` (token ids, for models without a tokenizer). Validated on load; every error, a line
that is not UTF-8 or JSON included, is a `PromptFileError` naming the file and line."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

SPLITS = ("calib", "test")
MAX_TOKEN_ID = 2**31 - 1  # ids become int64 tensors; anything larger is no vocabulary's


class PromptFileError(ValueError):
    """A prompt file that cannot be used."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    split: str
    text: str | None
    ids: tuple[int, ...] | None
    line: int = field(default=0, compare=False)  # its line in the prompt file (0: not read from one)


def _field(record: dict, name: str, kind: type, where: str):
    if name not in record:
        raise PromptFileError(f"{where}: missing field '{name}'")
    value = record[name]
    if not isinstance(value, kind) or (isinstance(value, str) and not value):
        raise PromptFileError(f"{where}: field '{name}' must be a non-empty {kind.__name__}")
    return _text(value, name, where) if isinstance(value, str) else value


def _text(value: str, name: str, where: str) -> str:
    """`value`, if it is Unicode text (JSON's "\\ud800" escapes decode to lone surrogates, which no
    tokenizer or database takes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptFileError(f"{where}: field '{name}' is not valid Unicode text ({exc.reason} at character "
                              f"{exc.start})") from None
    return value


def parse_prompt(record: object, where: str) -> Prompt:
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: expected a JSON object")
    split = _field(record, "split", str, where)
    if split not in SPLITS:
        raise PromptFileError(f"{where}: split {split!r} is not one of {', '.join(SPLITS)}")
    text, ids = record.get("prompt"), record.get("prompt_ids")
    if (text is None) == (ids is None):
        raise PromptFileError(f"{where}: give exactly one of 'prompt' or 'prompt_ids'")
    if text is not None and (not isinstance(text, str) or not text):
        raise PromptFileError(f"{where}: field 'prompt' must be a non-empty str")
    if text is not None:
        _text(text, "prompt", where)
    if ids is not None and (not isinstance(ids, list) or not ids or not all(
            type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in ids)):
        raise PromptFileError(f"{where}: field 'prompt_ids' must be a non-empty list of integers in 0 … {MAX_TOKEN_ID}")
    return Prompt(_field(record, "id", str, where), _field(record, "category", str, where), split, text,
                  tuple(ids) if ids is not None else None)


def parse_categories(text: str | None) -> tuple[str, ...] | None:
    """`code,docstring` → ("code", "docstring") in the given order, duplicates dropped (None: all)."""
    if text is None:
        return None
    names = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if not names:
        raise PromptFileError("--categories is empty")
    return names


def select_categories(prompts: list[Prompt], categories: tuple[str, ...] | None, where: str) -> list[Prompt]:
    """The prompts of the given categories, in file order (None: all); an unknown category is an
    error that lists the categories `where` (a file and split) has."""
    if categories is None:
        return prompts
    present = sorted({p.category for p in prompts})
    missing = [c for c in categories if c not in present]
    if missing:
        raise PromptFileError(f"--categories: {', '.join(map(repr, missing))} not in {where} "
                              f"(its categories: {', '.join(present)})")
    return [p for p in prompts if p.category in categories]


def load_prompts(path: Path, *, split: str | None = None) -> list[Prompt]:
    """All prompts of a JSONL file (optionally one split), in file order; ids must be unique."""
    path = Path(path)
    if path.is_dir():
        raise PromptFileError(f"{path}: a directory, not a prompt file (JSONL)")
    if not path.is_file():
        raise PromptFileError(f"{path}: no such prompt file")
    prompts, seen = [], {}
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)  # editors that write a byte-order mark
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptFileError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: invalid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; nesting too deep
            raise PromptFileError(f"{where}: unreadable JSON ({type(exc).__name__}: {exc})") from None
        prompt = replace(parse_prompt(record, where), line=number)
        if prompt.id in seen:
            raise PromptFileError(f"{where}: id {prompt.id!r} already used on line {seen[prompt.id]}")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return [p for p in prompts if split is None or p.split == split]
