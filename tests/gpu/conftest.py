"""GPU tests (`@pytest.mark.gpu`): run on a CUDA machine with `python3 -m pytest -m gpu tests/gpu`;
skipped, with the reason, where CUDA is missing or the Triton kernels would be interpreted.

tests/conftest.py asks for the Triton interpreter (the CPU tests run the kernels on CPU tensors).
A run of tests/gpu alone compiles the kernels instead; in a run of the whole suite the GPU tests
are skipped unless TRITON_INTERPRET=0 was set (the interpreter tests then skip themselves)."""

import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if paths and all(path.is_relative_to(HERE) for path in paths):
        os.environ["TRITON_INTERPRET"] = "0"  # before anything imports the kernels


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs CUDA"
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on"):
        return "the Triton kernels are interpreted here: run tests/gpu alone, or with TRITON_INTERPRET=0"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=reason))
