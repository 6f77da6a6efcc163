"""The prompts-file parser never raises anything but its own error naming `file:line`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridspec.workbench.prompts import PromptFileError, load_prompts

GOOD = {"id": "a", "category": "code", "split": "calib", "prompt": "def f():"}


@pytest.mark.parametrize("line, message", [
    (b'{"id": "b", "category": "c", "split": "test", "prompt": "\xff\xfe"}', "not UTF-8 text"),
    (b'{"id": "b", "category": "c", "split": "test", "prompt": "\\ud800"}', "field 'prompt' is not valid Unicode"),
    (b'{"id": "\\udfff", "category": "c", "split": "test", "prompt": "x"}', "field 'id' is not valid Unicode"),
    (b'{"id": "b", "category": "c", "split": "test", "prompt_ids": [true]}', "prompt_ids"),
    (b'{"id": "b", "category": "c", "split": "test", "prompt_ids": [' + b"9" * 30 + b"]}", "prompt_ids"),
    (b'{"id": "b", "category": "c", "split": "test", "prompt_ids": [' + b"9" * 5000 + b"]}", "unreadable JSON"),
    (b"[" * 100_000, "unreadable JSON"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\n" + line + b"\n")
    with pytest.raises(PromptFileError, match=message) as info:
        load_prompts(path)
    assert str(info.value).startswith(f"{path}:3: ")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=8)
records = st.fixed_dictionaries({}, optional={"id": json_values | st.text(), "category": json_values | st.text(),
                                              "split": st.sampled_from(["calib", "test", "", "x"]) | json_values,
                                              "prompt": json_values | st.text(),
                                              "prompt_ids": st.lists(st.integers(), max_size=3) | json_values})
lines = st.one_of(records.map(lambda r: json.dumps(r).encode()), json_values.map(lambda v: json.dumps(v).encode()),
                  st.binary(max_size=40))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, min_size=1, max_size=4))
def test_random_lines_raise_only_the_parsers_error(tmp_path, random_lines):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(random_lines))
    try:
        prompts = load_prompts(path)
    except PromptFileError as exc:
        assert str(exc).startswith(f"{path}:") or str(exc) == f"{path}: no prompts"
    else:
        assert prompts and all(p.split in ("calib", "test") for p in prompts)
