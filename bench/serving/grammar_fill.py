"""What the host spends filling a grammar's bitmask rows (`runtime/grammar.py`), per row and per
verification round, on a vocabulary of a Qwen3.5/3.6 size.

No Qwen tokenizer can be downloaded here, so the vocabulary is synthetic: 248,320 strings of one to
eight characters (letters, digits, punctuation, space-led words), matched greedily. xgrammar's
mask cost depends on the grammar's state and on how many tokens stay possible there (inside a JSON
string nearly all do), not on what the strings mean. For each grammar the script walks a JSON
answer token by token and times `GrammarState.rows` at every position as a verification round
would call it: the row of the output so far and one row after each of the next D tokens as drafts.

    python3 bench/serving/grammar_fill.py [--vocab 248320] [--draft-len 15] [--out DIR]

Prints a table and writes DIR/grammar_fill.json. Times are this machine's CPU, one thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import string
import sys
import time
from pathlib import Path

import torch

ANSWER = ('{"name": "alpha beta gamma delta", "items": [1, 22, 333, 4444, 5], "ok": true, '
          '"note": "a longer string, with punctuation: and words"}')
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "items": {"type": "array", "items": {
    "type": "integer"}}, "ok": {"type": "boolean"}, "note": {"type": "string"}},
          "required": ["name", "items", "ok", "note"]}


def synthetic_vocab(size: int, seed: int = 0) -> list[str]:
    """`size` distinct strings: every single character of the alphabet, then random ones; id 0 is
    the end token."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + ' _-.,:;{}[]"\'()\n/\\'
    vocab = set(alphabet)
    while len(vocab) < size - 1:
        n = rng.choice([2, 3, 3, 4, 4, 5, 6, 7, 8])
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
        vocab.add(" " + word if rng.random() < 0.5 else "".join(rng.choice(alphabet) for _ in range(n)))
    return ["<eos>", *sorted(vocab)]


def encode(text: str, index: dict[str, int]) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        length = next(n for n in range(8, 0, -1) if text[i : i + n] in index)
        ids.append(index[text[i : i + length]])
        i += length
    return ids


def main(argv: list[str] | None = None) -> int:
    import xgrammar as xgr

    from hybridspec.runtime.grammar import GrammarState

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=248_320)
    ap.add_argument("--draft-len", type=int, default=15)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    vocab = synthetic_vocab(args.vocab)
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=[0])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    ids = encode(ANSWER, {t: i for i, t in enumerate(vocab)})
    rows = []
    for name, compile_ in (("json_schema", lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)),
                           ("json", compiler.compile_builtin_json_grammar)):
        t0 = time.perf_counter()
        compiled = compile_()
        compile_s = time.perf_counter() - t0
        state = GrammarState(compiled, (0,), len(vocab))
        per_round = []
        for k in range(len(ids)):
            drafts = ids[k : k + args.draft_len]
            t0 = time.perf_counter()
            state.rows(drafts, len(drafts) + 1)
            per_round.append(time.perf_counter() - t0)
            state.accept([ids[k]])
        one = GrammarState(compiled, (0,), len(vocab))
        per_row = []
        for token in ids:
            t0 = time.perf_counter()
            one.rows(None, 1)
            per_row.append(time.perf_counter() - t0)
            one.accept([token])
        row = dict(grammar=name, vocab=len(vocab), tokens=len(ids), compile_s=round(compile_s, 3),
                   row_us_median=round(statistics.median(per_row) * 1e6, 1),
                   row_us_p90=round(sorted(per_row)[int(0.9 * len(per_row))] * 1e6, 1),
                   round_ms_median=round(statistics.median(per_round) * 1e3, 3),
                   round_ms_p90=round(sorted(per_round)[int(0.9 * len(per_round))] * 1e3, 3),
                   round_ms_max=round(max(per_round) * 1e3, 3))
        rows.append(row)
        print(f"{name:12s} vocab {row['vocab']}  one row: median {row['row_us_median']} µs, p90 {row['row_us_p90']} µs"
              f"  |  a round of {args.draft_len + 1} rows: median {row['round_ms_median']} ms, p90 "
              f"{row['round_ms_p90']} ms, max {row['round_ms_max']} ms")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(machine=platform.processor() or platform.machine(), python=platform.python_version(),
                      torch=torch.__version__, command="python3 bench/serving/grammar_fill.py " + " ".join(
                          argv if argv is not None else sys.argv[1:]), rows=rows)
        (args.out / "grammar_fill.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
