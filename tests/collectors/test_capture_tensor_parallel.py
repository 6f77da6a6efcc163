"""`capture --tp 2 --expert-parallel` on CPU (gloo, spawned ranks, each holding half the experts
whole): rank 0 writes the store, the other rank runs the same units; the rows equal one process's
(tokens, rounds and acceptance exactly; the drafter's confidences within fp32 rounding of the
all-reduce's other summation order), the run records its layout, and `--resume` of the finished run
commits nothing on any rank. (The other layout, every expert's columns split, runs end to end in
`tests/serve/test_serve_tensor_parallel.py` and `tests/runtime/test_tensor_parallel.py`.)"""

from __future__ import annotations

import json
import subprocess

from tests.collectors.test_capture_cli import (ENV, ROOT, _args, _reference, _subprocess, deterministic_rows,
                                               prompt_file)

__all__ = ["prompt_file"]  # the module fixture


def _close(got: list[tuple], want: list[tuple]) -> bool:
    if len(got) != len(want):
        return False
    for a, b in zip(got, want):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                if abs(x - y) > 1e-4 * max(1.0, abs(y)):
                    return False
            elif x != y:
                return False
    return True


def test_two_ranks_write_one_processs_rows(qwen35_dir, prompt_file, tmp_path):
    db = tmp_path / "tp.duckdb"
    args = _args(qwen35_dir, prompt_file, db, "--passes", "capture", "--max-new-tokens", "24", "--categories", "a",
                 "--tp", "2", "--expert-parallel")  # the 4 prompts of one category
    run = subprocess.run(_subprocess(args), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" committed (") == 4  # rank 0's reporter, one line per prompt
    reference = _reference(qwen35_dir, prompt_file, tmp_path / "one.duckdb", passes=("capture",), max_new_tokens=24,
                           categories=("a",))
    got = deterministic_rows(db)
    for table in ("prompts", "rounds"):
        assert got[table] == reference[table] and got[table], table
    assert _close(got["draft_positions"], reference["draft_positions"])
    (run_row,), (one_row,) = got["runs"], reference["runs"]
    params = json.loads(run_row[6])
    assert (params.pop("tensor_parallel"), params.pop("expert_parallel")) == (2, True)
    assert params == json.loads(one_row[6])
    resumed = subprocess.run(_subprocess([*args, "--resume"]), capture_output=True, text=True, env=ENV, cwd=ROOT,
                             timeout=600)
    assert resumed.returncode == 0 and "4 already committed" in resumed.stdout, resumed.stdout + resumed.stderr
    assert deterministic_rows(db) == got
