"""`offline.py`, the session's compile of the interpreted kernels for sm_90: launches are recorded
(argument types and constexprs, one per specialization), and a recorded kernel that breaks a compiler
rule the interpreter does not apply is reported with the compiler's error, one that compiles as ok."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

from tests.kernels import offline  # noqa: E402
from tests.kernels import offline_cases  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_a_launch_is_recorded_by_type_and_constexpr(tmp_path, monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(offline_cases.good_kernel, InterpretedFunction):
        pytest.skip("needs the interpreter")
    monkeypatch.setattr(InterpretedFunction, "run", InterpretedFunction.run)  # undone after the test
    write = offline.record_launches(tmp_path, modules="tests.kernels.offline_cases")
    x, out = torch.ones(5), torch.zeros(1)
    offline_cases.good_kernel[(1,)](x, out, 5, BLOCK=8, USE_GDC=False, num_warps=2)
    offline_cases.good_kernel[(1,)](x, out, 3, BLOCK=8, USE_GDC=False, num_warps=2)  # the same specialization
    offline_cases.good_kernel[(1,)](x.double(), out, 5, BLOCK=16, USE_GDC=False)  # another
    write()
    assert out.item() == 5.0
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("launches-*.json")]
    assert record == {"tests.kernels.offline_cases:good_kernel": [
        {"x_ptr": {"tensor": "float32"}, "out_ptr": {"tensor": "float32"}, "n": {"value": 5}, "BLOCK": {"value": 8},
         "USE_GDC": {"value": False}, "num_warps": {"value": 2}},
        {"x_ptr": {"tensor": "float64"}, "out_ptr": {"tensor": "float32"}, "n": {"value": 5}, "BLOCK": {"value": 16},
         "USE_GDC": {"value": False}}]}


def test_recorded_kernels_compile_or_report_the_compilers_error(tmp_path):
    launch = {"x_ptr": {"tensor": "float32"}, "out_ptr": {"tensor": "float32"}, "n": {"value": 5},
              "BLOCK": {"value": 64}, "USE_GDC": {"value": False}, "num_warps": {"value": 2}}
    (tmp_path / "launches-1.json").write_text(json.dumps({
        "tests.kernels.offline_cases:good_kernel": [launch],
        "tests.kernels.offline_cases:reshaped_in_a_branch_kernel": [{k: v for k, v in launch.items() if k != "USE_GDC"}]}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "tests.kernels.offline", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert results["tests.kernels.offline_cases:good_kernel"] == "ok"
    assert "redefines" in results["tests.kernels.offline_cases:reshaped_in_a_branch_kernel"]
