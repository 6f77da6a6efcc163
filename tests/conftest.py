"""Shared fixtures: tiny random checkpoints written by transformers (the numerical oracle)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Triton kernels run on CPU tensors through the interpreter (set before anything imports triton).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from tests.checkpoints import write_tiny_qwen3_5_moe, write_tiny_qwen3_next
from tests.interpreter import patch_the_language_once_per_launch, skip_the_overflow_checks

# The tests run tiny models: one thread avoids thread start-up cost per op (several times faster).
torch.set_num_threads(1)


LAUNCHES = "HYBRIDSPEC_TEST_LAUNCHES"  # the directory where every test process records its kernels' launches


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def pytest_configure(config):
    """In the main process (workers inherit the variable): a directory for the launch records, which
    this session then compiles and removes (a session started inside another records into the
    outer one's)."""
    if not hasattr(config, "workerinput") and LAUNCHES not in os.environ:
        os.environ[LAUNCHES] = config._launches = tempfile.mkdtemp(prefix="hybridspec-launches-")


def pytest_sessionstart(session):
    """After every conftest's pytest_configure (tests/gpu's turns the interpreter off for a GPU run):
    the interpreter's set-up once per launch and without its overflow checks (`tests/interpreter.py`),
    and the record of each kernel's launches (`tests/kernels/offline.py`), where the kernels are
    interpreted. Triton is first imported here or later, never while TRITON_INTERPRET may still
    change."""
    if _interpreted():
        patch_the_language_once_per_launch()
        skip_the_overflow_checks()
        if os.environ.get(LAUNCHES):
            from tests.kernels.offline import record_launches
            session.config._write_launches = record_launches(Path(os.environ[LAUNCHES]))


def pytest_sessionfinish(session, exitstatus):
    """Every process writes its launch records; the main process then compiles each kernel they name
    for sm_90 (`tests/kernels/offline.py`) and fails the session if one does not compile."""
    write = getattr(session.config, "_write_launches", None)
    if write is not None:
        write()
    directory = getattr(session.config, "_launches", None)
    if directory is None:
        return
    recorded = any(Path(directory).glob("launches-*.json"))
    if recorded:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = subprocess.run([sys.executable, "-m", "tests.kernels.offline", directory], env=env, capture_output=True,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    shutil.rmtree(directory, ignore_errors=True)
    if recorded:
        _report_compiles(session, done)


def _report_compiles(session, done: subprocess.CompletedProcess) -> None:
    """The compile's summary, kept for `pytest_terminal_summary` (which writes after the progress
    line has ended); the session fails on a kernel that does not compile."""
    lines = []
    if done.returncode or not done.stdout.strip():
        failures = {"tests.kernels.offline": done.stderr[-3000:] or "printed nothing"}
    else:
        results = json.loads(done.stdout.splitlines()[-1])
        failures = {k: v for k, v in results.items() if v != "ok" and not v.startswith("skipped")}
        lines.append((f"kernels compiled for sm_90 from the interpreted launches: "
                      f"{sum(v == 'ok' for v in results.values())} of {len(results)}"
                      + "".join(f"\n  {k}: {v}" for k, v in results.items() if v.startswith("skipped")), False))
    if failures:
        lines.append(("kernels that do not compile for sm_90:", True))
        lines += [(f"  {key}: {error}", True) for key, error in failures.items()]
        session.exitstatus = 1
    session.config._compile_lines = lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line, red in getattr(config, "_compile_lines", ()):
        terminalreporter.write_line(line, red=red)


@pytest.fixture(scope="session")
def qwen35_dir(tmp_path_factory):
    return write_tiny_qwen3_5_moe(tmp_path_factory.mktemp("qwen35"))


@pytest.fixture(scope="session")
def qwen3next_dir(tmp_path_factory):
    return write_tiny_qwen3_next(tmp_path_factory.mktemp("qwen3next"))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
