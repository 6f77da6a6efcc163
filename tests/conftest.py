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
