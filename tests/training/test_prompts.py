"""The prompt set's cutters on texts with known cut points, the token-boundary rule, and the
rebuild of the shipped prompt set."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from hybridspec.runtime.session import EMBEDDED
from hybridspec.training import prompts
from hybridspec.training.corpus import Corpus, SourceFile, build_corpus
from hybridspec.training.embedded import RECIPES, write_prompts
from hybridspec.training.prompts import CUTTERS, build_prompt_set, line_shape, token_aligned

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = EMBEDDED / "target" / "tokenizer.json"
CORPUS_TARBALL = REPO / ".corpus" / "python3.11.tar.xz"

TABLE = ("decoding_map = {\n"
         + "".join(f"    0x{i:04x}: 0x{i + 7:04x},     #  LETTER {chr(65 + i)}\n" for i in range(10))
         + "}\n")
TEST = ('class T(unittest.TestCase):\n    def test_a(self):\n        x = f()\n'
        '        self.assertEqual(x, 1)\n        self.assertTrue(x)\n')
CODE = "def f(a):\n    if a:\n        b = a + 1\n        return b\n    else:\n        for i in a:\n            pass\n"
COMMENT = "x = 1\n# first line\n    # Second line\n    #no space\n    # 3 digits\n"
DOCSTRING = 'def f():\n    """Return one."""\n\nclass C:\n    """A class.\n    """\n'
IMPORTS = ('"""Doc."""\nimport os\nimport sys\n\nimport re\nfrom x import y\n# a comment\nimport z\nimport w\n'
           'def f():\n    import inner\n')


def _line_start(text: str, n: int) -> int:
    return sum(len(line) for line in text.splitlines(keepends=True)[:n])


def test_table_cuts_inside_a_run_of_one_shape():
    # lines 1..10 share one shape; cuts need 4 of them before and 3 after: lines 5, 6, 7, after the indent
    assert list(CUTTERS["table"]("x.py", TABLE)) == [_line_start(TABLE, n) + 4 for n in (5, 6, 7)]
    shapes = {line_shape(line) for line in TABLE.splitlines()[1:11]}
    assert shapes == {"    9: 9, #"}


def test_table_needs_literals_and_a_long_enough_run():
    names = "".join(f"import mod{i}\n" for i in range(12))  # one shape, but no literal in it
    assert list(CUTTERS["table"]("x.py", names)) == []
    short = "".join(TABLE.splitlines(keepends=True)[:8])  # 7 lines of the shape: too few
    assert list(CUTTERS["table"]("x.py", short)) == []


def test_test_cuts_before_each_assertion_of_a_test_module():
    expected = [TEST.index("self.assertEqual"), TEST.index("self.assertTrue")]
    assert list(CUTTERS["test"]("test/test_x.py", TEST)) == expected
    assert list(CUTTERS["test"]("pkg/x.py", TEST)) == []  # not a test module


def test_code_cuts_at_statements_of_a_function_body():
    assert list(CUTTERS["code"]("x.py", CODE)) == [CODE.index("b = a"), CODE.index("return b"), CODE.index("for i")]


def test_comment_cuts_after_the_hash_and_space():
    assert list(CUTTERS["comment"]("x.py", COMMENT)) == [COMMENT.index("first"), COMMENT.index("Second")]


def test_docstring_cuts_after_the_opening_quotes():
    assert list(CUTTERS["docstring"]("x.py", DOCSTRING)) == [DOCSTRING.index("Return"), DOCSTRING.index("A class")]


def test_imports_cuts_at_a_top_level_import_after_two_others():
    assert list(CUTTERS["imports"]("x.py", IMPORTS)) == [IMPORTS.index("import re"), IMPORTS.index("from x")]


def test_line_shape():
    assert line_shape("def_op('LOAD_CONST', 100)  # a comment\n") == "I($, 9) #"
    assert line_shape("    '\\x13'     #  0x0013 -> DEVICE CONTROL THREE\n") == "    $ #"
    assert line_shape('        self.assertEqual(f("a#b"), 1.5e3)\n') == "        I.I(I($), 9)"


def test_token_aligned_gives_the_words_space_to_the_continuation():
    text = "x = 1\n        self.a()\n# note\n"
    assert token_aligned(text, text.index("self")) == text.index("self") - 1
    assert token_aligned(text, text.index("note")) == text.index("note") - 1
    assert token_aligned(text, text.index("#")) == text.index("#")  # after one newline: unchanged
    blank = "import os\n\nimport re\n"
    assert token_aligned(blank, blank.index("import re")) == blank.index("import re") - 1  # "\n" + "\nimport"
    assert token_aligned(text, text.index("(")) == text.index("(")  # not after a space


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="embedded tokenizer absent")
@pytest.mark.parametrize("category,path,text", [("table", "x.py", TABLE), ("test", "test/test_x.py", TEST),
                                                ("code", "x.py", CODE), ("comment", "x.py", COMMENT),
                                                ("docstring", "x.py", DOCSTRING), ("imports", "x.py", IMPORTS)])
def test_aligned_prompts_end_on_a_token_boundary_of_the_whole_text(category, path, text):
    """A prompt's tokens are a prefix of the tokens of prompt + continuation (BPE's own boundary)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))

    def encode(t: str) -> list[int]:
        return tokenizer.encode(t, add_special_tokens=False).ids

    whole = encode(text)
    for cut in CUTTERS[category](path, text):
        head = encode(text[: token_aligned(text, cut)])
        assert whole[: len(head)] == head, (category, cut)
    if category == "test":  # the unaligned cut, after the indentation, ends in a token the text never has
        raw = encode(text[: next(CUTTERS["test"](path, text))])
        assert whole[: len(raw)] != raw


def _small_corpus() -> Corpus:
    files = [SourceFile(f"test/test_{i}.py", "\n" * 250 + TABLE + TEST + CODE + COMMENT + DOCSTRING + IMPORTS,
                        True)
             for i in range(8)]
    return Corpus("synthetic", "3.11", tuple(files))


def test_prompt_set_is_deterministic_and_categories_are_independent(monkeypatch):
    encode = lambda t: list(t.encode())  # noqa: E731 - bytes as tokens
    a = build_prompt_set(_small_corpus(), encode, per_category=6, seed=3)
    assert a == build_prompt_set(_small_corpus(), encode, per_category=6, seed=3)
    assert {r["category"] for r in a} == set(prompts.CATEGORIES)
    assert a != build_prompt_set(_small_corpus(), encode, per_category=6, seed=4)
    monkeypatch.setattr(prompts, "CATEGORIES", tuple(c for c in prompts.CATEGORIES if c != "table"))
    without_table = build_prompt_set(_small_corpus(), encode, per_category=6, seed=3)
    assert without_table == [r for r in a if r["category"] != "table"]


def test_prompt_set_names_a_category_without_enough_sites():
    corpus = Corpus("synthetic", "3.11", (SourceFile("x.py", "\n" * 250 + CODE, True),))
    with pytest.raises(ValueError, match="'table' sites"):
        build_prompt_set(corpus, lambda t: list(t.encode()), per_category=2)


@pytest.fixture(scope="module")
def stdlib_311(tmp_path_factory) -> Path:
    """CPython 3.11.7's standard library, the shipped pair's corpus (from the repo's ignored tarball)."""
    if not CORPUS_TARBALL.is_file():
        pytest.skip(f"{CORPUS_TARBALL} absent")
    root = tmp_path_factory.mktemp("std")
    with tarfile.open(CORPUS_TARBALL) as tar:
        tar.extractall(root, filter="data")
    return root / "python3.11"


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="embedded pair absent")
def test_shipped_prompt_set_is_rebuilt_byte_for_byte(stdlib_311, tmp_path):
    assert build_corpus(root=stdlib_311).summary()["held_out_files"] == 169
    write_prompts(tmp_path, EMBEDDED / "target", RECIPES["full"], stdlib=stdlib_311)
    assert (tmp_path / "prompts.jsonl").read_bytes() == (EMBEDDED / "prompts.jsonl").read_bytes()
