"""Latency samples: CUDA events with synchronization on a GPU, `perf_counter_ns` on a CPU.

`sample_latencies(fn, samples=, warmup=)` calls `fn` `warmup` times unrecorded (first-call costs:
allocation, kernel compilation, caches), then times each of `samples` calls separately; µs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def sample_latencies(fn: Callable[[], object], *, samples: int, warmup: int, device: torch.device | str = "cpu"
                     ) -> list[float]:
    """Per-call latencies of `fn` in microseconds (warm-up calls excluded)."""
    if samples < 1 or warmup < 0:
        raise ValueError(f"samples must be ≥ 1 and warmup ≥ 0, got {samples}, {warmup}")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        return _cuda_latencies(fn, samples)
    out = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def timing_params(device: torch.device, graphs: bool = True) -> dict:
    """The run parameter saying how a pass on `device` timed its calls: on CUDA, replays of each
    call's CUDA graph, or the eager calls without graphs (`--no-graphs`); absent elsewhere, where
    the call itself is timed."""
    if torch.device(device).type != "cuda":
        return {}
    return {"timing": "cuda graph replays" if graphs else "eager calls"}


def _cuda_latencies(fn: Callable[[], object], samples: int) -> list[float]:
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # the host waits for this sample's kernels only
        out.append(start.elapsed_time(end) * 1e3)  # ms → µs
    return out
