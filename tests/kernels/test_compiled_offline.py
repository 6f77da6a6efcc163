"""The request-op kernels compiled for an SM90 GPU on the CPU (`offline.py`), at the 35B preset's
vocabulary and the shapes the resident rounds launch: what the interpreter's tests cannot see (a
kernel that runs as Python but breaks a compiler rule fails here, as the logprob kernel's combine
once did by giving a variable another shape in a branch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parents[2]
V = 248_320


def offline_cases() -> dict:
    from hybridspec.kernels.bitmask.triton import masked_logits
    from hybridspec.kernels.logprobs.triton import logprob_rows
    from hybridspec.kernels.penalties.triton import penalized_logits

    logits = torch.zeros(16, V, dtype=torch.bfloat16)
    tokens = torch.zeros(16, dtype=torch.long)
    state = (torch.zeros(V), torch.zeros(V, dtype=torch.bool), torch.zeros(V), torch.zeros(V, dtype=torch.bool),
             torch.zeros(6))
    return {"logprobs top 20": (logprob_rows, (logits, tokens, 20)),
            "logprobs top 0": (logprob_rows, (logits[:1], tokens[:1], 0)),
            "penalties": (penalized_logits, (logits, torch.zeros(15, dtype=torch.long), *state)),
            "bitmask": (masked_logits, (logits, torch.zeros(16, (V + 31) // 32, dtype=torch.int32)))}


def test_request_op_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "tests.kernels.offline", f"{__name__}:offline_cases"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "logprobs top 20": ["_logprob_rows_kernel"], "logprobs top 0": ["_logprob_rows_kernel"],
        "penalties": ["_penalize_kernel", "_ban_and_min_p_kernel"], "bitmask": ["_masked_logits_kernel"]}
