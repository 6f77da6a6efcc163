"""Programmatic dependent launch is only ever asked of a compiled kernel on a CUDA device of
compute capability 9 or higher: never under the interpreter or for CPU tensors, whatever the switch."""

import torch

from hybridspec.kernels import pdl


def test_never_under_the_interpreter_or_on_cpu(monkeypatch):
    for enabled in (False, True):
        monkeypatch.setattr(pdl, "ENABLED", enabled)
        assert pdl.options(torch.zeros(1)) == {"USE_GDC": False}
