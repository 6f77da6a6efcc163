"""CUDA-graph and copy-bandwidth timing, and the result files' head, shared by the kernel
benchmarks (GPU only)."""

from __future__ import annotations

import datetime as dt
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton


def capture(rounds: list[Callable[[], None]]) -> torch.cuda.CUDAGraph:
    """One graph of all rounds, after a warm-up on a side stream (compiles, autotunes)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in rounds:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in rounds:
            fn()
    return graph


def graph_us(calls: list[Callable[[], None]], samples: int, replays: int) -> float:
    """Median µs per call of one CUDA graph holding `calls` in order (warm-up on a side stream); the
    graph is freed before returning."""
    graph = capture(calls)
    result = median_us(graph, len(calls), samples, replays)
    del graph
    return result


def max_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| / max |want|, in fp32: a benchmark's check before it times a form."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def median_us(graph: torch.cuda.CUDAGraph, rounds: int, samples: int, replays: int) -> float:
    """Median over samples of (replays graph replays) per round, in microseconds."""
    graph.replay()
    torch.cuda.synchronize()
    per_round = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_round.append(start.elapsed_time(end) * 1e3 / (replays * rounds))
    return statistics.median(per_round)


def copy_bandwidth(samples: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy_ bandwidth in bytes/s, counting read + write."""
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / statistics.median(times)


def run_header(script: str, argv: list[str] | None, bandwidth: float, **extra) -> dict:
    """The head of a benchmark's result file: device, date, the command (`script` with its
    arguments), versions and the copy bandwidth (bytes/s, stored in GB/s), plus `extra`, and an
    empty `rows`; printed as one line."""
    head = dict(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(),
                command=f"python3 bench/kernels/{script} " + " ".join(argv or sys.argv[1:]),
                versions=dict(python=platform.python_version(), torch=torch.__version__,
                              cuda=str(torch.version.cuda), triton=triton.__version__),
                copy_bandwidth_GBps=bandwidth / 1e9, **extra, rows=[])
    print(f"{head['device']} {extra or ''} {head['versions']} copy {bandwidth / 1e9:.0f} GB/s", flush=True)
    return head


def gpu_run(script: str, argv: list[str] | None, **extra) -> tuple[float, dict] | None:
    """A benchmark's start: None (with a message on stderr) where there is no CUDA GPU; else the copy
    bandwidth (bytes/s, 10 samples) and the result file's head (`run_header`)."""
    if not torch.cuda.is_available():
        print(f"{script} needs a CUDA GPU", file=sys.stderr)
        return None
    bandwidth = copy_bandwidth(samples=10)
    return bandwidth, run_header(script, argv, bandwidth, **extra)


def write_result(out: Path, name: str, result: dict) -> None:
    """The result as out/name (JSON), out made if missing."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=1))
