"""Prompt files are validated on load; every error names the file and line."""

from __future__ import annotations

import json

import pytest

from hybridspec.workbench.prompts import PromptFileError, load_prompts, parse_categories, select_categories

GOOD = {"id": "a", "category": "code", "split": "calib", "prompt": "def f():"}


def _write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_loads_and_filters_by_split(tmp_path):
    path = _write(tmp_path, [GOOD, {**GOOD, "id": "b", "split": "test"}, "", {**GOOD, "id": "c", "prompt": None,
                                                                               "prompt_ids": [1, 2]}])
    assert [p.id for p in load_prompts(path)] == ["a", "b", "c"]
    assert [p.id for p in load_prompts(path, split="test")] == ["b"]
    assert load_prompts(path)[2].ids == (1, 2)


@pytest.mark.parametrize("bad,message", [
    ("{oops", "p.jsonl:2: invalid JSON"),
    ({**GOOD, "id": "b", "split": "train"}, "p.jsonl:2: split 'train'"),
    ({"id": "b", "split": "test", "prompt": "x"}, "p.jsonl:2: missing field 'category'"),
    ({**GOOD, "id": "a"}, "p.jsonl:2: id 'a' already used on line 1"),
    ({**GOOD, "id": "b", "prompt": ""}, "p.jsonl:2: field 'prompt' must be a non-empty str"),
    ({**GOOD, "id": "b", "prompt_ids": [1]}, "p.jsonl:2: give exactly one of"),
    ([1, 2], "p.jsonl:2: expected a JSON object"),
])
def test_bad_line_is_reported_with_its_number(tmp_path, bad, message):
    with pytest.raises(PromptFileError, match=message):
        load_prompts(_write(tmp_path, [GOOD, bad]))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(PromptFileError, match="no such prompt file"):
        load_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(tmp_path / "e.jsonl")
    with pytest.raises(PromptFileError, match="a directory, not a prompt file"):
        load_prompts(tmp_path)


def test_a_byte_order_mark_is_read_past(tmp_path):
    path = _write(tmp_path, [GOOD, {**GOOD, "id": "b"}])
    plain = load_prompts(path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_prompts(path) == plain


def test_categories_keep_file_order_and_name_what_is_missing(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"id": f"{c}{i}", "category": c, "split": "calib", "prompt": "x"} for i in range(2) for c in ("b", "a", "c")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(path, split="calib")
    assert parse_categories(" c, a,c ") == ("c", "a") and parse_categories(None) is None
    assert [p.id for p in select_categories(prompts, ("c", "a"), "here")] == ["a0", "c0", "a1", "c1"]
    assert select_categories(prompts, None, "here") == prompts
    with pytest.raises(PromptFileError, match=r"'d', 'e' not in here \(its categories: a, b, c\)"):
        select_categories(prompts, ("a", "d", "e"), "here")
    with pytest.raises(PromptFileError, match="--categories is empty"):
        parse_categories(",")
