"""`bench/serving/grammar_fill.py` on the CPU: its synthetic vocabulary encodes the answer it walks,
and the script runs to its table on a small vocabulary."""

from __future__ import annotations

import json

from bench.serving import grammar_fill


def test_the_vocabulary_encodes_the_answer_and_the_script_writes_its_rows(tmp_path):
    vocab = grammar_fill.synthetic_vocab(5000)
    assert len(vocab) == len(set(vocab)) == 5000 and vocab[0] == "<eos>"
    ids = grammar_fill.encode(grammar_fill.ANSWER, {t: i for i, t in enumerate(vocab)})
    assert "".join(vocab[i] for i in ids) == grammar_fill.ANSWER
    assert grammar_fill.main(["--vocab", "5000", "--draft-len", "4", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "grammar_fill.json").read_text())["rows"]
    assert [r["grammar"] for r in rows] == ["json_schema", "json"] and all(r["tokens"] == len(ids) for r in rows)
