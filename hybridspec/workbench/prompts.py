"""Prompt sets: JSONL with `id`, `category`, `split` (`calib` or `test`) and `prompt` (text) or
`prompt_ids` (token ids, for models without a tokenizer). Validated on load; errors name the file
and line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("calib", "test")


class PromptFileError(ValueError):
    """A prompt file that cannot be used."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    split: str
    text: str | None
    ids: tuple[int, ...] | None


def _field(record: dict, name: str, kind: type, where: str):
    if name not in record:
        raise PromptFileError(f"{where}: missing field '{name}'")
    value = record[name]
    if not isinstance(value, kind) or (isinstance(value, str) and not value):
        raise PromptFileError(f"{where}: field '{name}' must be a non-empty {kind.__name__}")
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
    if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids)):
        raise PromptFileError(f"{where}: field 'prompt_ids' must be a non-empty list of integers")
    return Prompt(_field(record, "id", str, where), _field(record, "category", str, where), split, text,
                  tuple(ids) if ids is not None else None)


def load_prompts(path: Path, *, split: str | None = None) -> list[Prompt]:
    """All prompts of a JSONL file (optionally one split), in file order; ids must be unique."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"{path}: no such prompt file")
    prompts, seen = [], {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: invalid JSON ({exc.msg})") from None
        prompt = parse_prompt(record, where)
        if prompt.id in seen:
            raise PromptFileError(f"{where}: id {prompt.id!r} already used on line {seen[prompt.id]}")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return [p for p in prompts if split is None or p.split == split]
