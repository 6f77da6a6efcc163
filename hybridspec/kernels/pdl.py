"""Programmatic dependent launch (SM90 and later) for the decoding round's kernels.

A kernel launched with it may start while the previous kernel of the stream is finishing: its
launch and the scheduling of its programs overlap the previous kernel's tail. Each such kernel
calls `wait_then_release` before it reads anything the previous kernel writes: it waits until the
previous kernel has finished and its writes are visible, then lets the next kernel launch. Weights
(which no kernel writes) may be read before the wait, and so may what a kernel two or more launches
back wrote: every kernel here waits before it releases the next, so when a kernel starts, the one
before its predecessor has finished. The results are unchanged; only the gaps between launches
shrink. `ENABLED` switches it for every kernel (`bench/gpu_round.py --variants shipped,no-pdl`
measures it in whole rounds); the GDN verify kernels may also leave it off per tuning row
(`gdn/launch.py`)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import interpreted

ENABLED = True


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def available(x: Tensor) -> bool:
    """Whether a kernel on x's device can launch with it: a CUDA device of compute capability 9 or
    higher, compiled (the interpreter cannot run the inline PTX); the capability is looked up once
    per device, not at every launch of the decoding round."""
    return x.is_cuda and not interpreted() and _capable(x.device.index)


def options(x: Tensor, enabled: bool = True) -> dict:
    """Launch options for a kernel taking `USE_GDC`: programmatic dependent launch where enabled (by
    the caller and by `ENABLED`) and available."""
    if enabled and ENABLED and available(x):
        return dict(USE_GDC=True, launch_pdl=True)
    return dict(USE_GDC=False)


@triton.jit
def wait_then_release():
    """Wait for the previous kernel of the stream (finished, its writes visible), then let the next
    kernel launch."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
