"""Shared fixtures: tiny random checkpoints written by transformers (the numerical oracle)."""

from __future__ import annotations

import os

# Triton kernels run on CPU tensors through the interpreter (set before anything imports triton).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from tests.checkpoints import write_tiny_qwen3_5_moe, write_tiny_qwen3_next
from tests.interpreter import patch_the_language_once_per_launch

# The tests run tiny models: one thread avoids thread start-up cost per op (several times faster).
torch.set_num_threads(1)


def pytest_sessionstart(session):
    """After every conftest's pytest_configure (tests/gpu's turns the interpreter off for a GPU run):
    the interpreter's set-up once per launch, where the kernels are interpreted. Triton is first
    imported here or later, never while TRITON_INTERPRET may still change."""
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on"):
        patch_the_language_once_per_launch()


# The files that take longest on one worker, longest first (about 150 … 40 s each on the 2-core
# machine, `pytest --durations`): `make test` hands whole files to its workers in collection order
# (--dist loadfile --no-loadscope-reorder), so these start first and no long file starts last while
# the other worker idles. Only the order changes; a file missing here runs after them.
SLOWEST_FILES = (
    "tests/collectors/test_capture_cli.py", "tests/runtime/test_engine_greedy.py", "tests/report/test_report.py",
    "tests/kernels/test_gdn_triton_recurrent.py", "tests/runtime/test_resident.py", "tests/test_demo.py",
    "tests/kernels/test_gdn_triton.py", "tests/runtime/test_triton_backend.py", "tests/runtime/test_engine_sampling.py",
    "tests/runtime/test_engine_sampling_hybridspec.py", "tests/kernels/test_gdn_triton_fold.py",
    "tests/training/test_drafter_sweep.py", "tests/runtime/test_engine_sampling_power.py",
    "tests/collectors/test_capture_tensor_parallel.py", "tests/kernels/test_gdn_triton_commit.py",
    "tests/kernels/test_select_triton.py", "tests/kernels/test_moe_triton.py", "tests/kernels/test_attention_triton.py",
    "tests/runtime/test_tensor_parallel.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


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
