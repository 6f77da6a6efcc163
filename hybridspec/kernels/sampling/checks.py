"""Argument checks shared by the point-mass rule's launchers."""

from __future__ import annotations

import torch
from torch import Tensor

from hybridspec.kernels.interpreter import check_device


def check_rule_args(fn: str, draft: Tensor, logits: Tensor) -> tuple[int, int]:
    """draft [w−1] long and logits [w, V] with unit column stride, on CUDA (or on the CPU under
    the interpreter); returns (w, V). Raises ValueError naming the argument."""
    if logits.dim() != 2:
        raise ValueError(f"{fn}: logits must be [w, V], got {tuple(logits.shape)}")
    w, V = logits.shape
    if logits.stride(1) != 1:
        raise ValueError(f"{fn}: logits must have unit column stride, got {logits.stride()}")
    if tuple(draft.shape) != (w - 1,) or draft.dtype != torch.long:
        raise ValueError(f"{fn}: draft must be long [w − 1] = [{w - 1}], got {draft.dtype} {tuple(draft.shape)}")
    check_device(fn, logits=logits, draft=draft)
    return w, V
