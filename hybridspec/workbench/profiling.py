"""Device time by part of a model, from torch.profiler: the code of each part runs inside a profiler
range named after the part (`ranged`), and `part_times` assigns every kernel to a part.

On CUDA a kernel belongs to the range whose span on the device (the profiler's
`gpu_user_annotation` events) contains its start, and to `other` outside every range. Where a
profile has no device spans (a CPU run), each operator's own CPU time goes to its innermost
enclosing range. `replayable` turns a callable into the replay of its CUDA graph, so that latencies
on a GPU measure the device work rather than the launches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch


def ranged(fn: Callable, name: str) -> Callable:
    """`fn`, each call inside a profiler range `name`."""
    from torch.profiler import record_function

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return call


def part_times(prof, parts: Iterable[str], reps: int) -> tuple[dict[str, float], dict[str, float], str]:
    """(µs per part per call, kernels — CPU: operators called from Python — per part per call, the
    attribution used)
    from a profile of `reps` calls; every part of `parts` (which must include `other`) is present."""
    from torch.autograd import DeviceType

    parts = tuple(parts)
    times, counts = dict.fromkeys(parts, 0.0), dict.fromkeys(parts, 0.0)
    events = prof.events()
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    ranges = sorted((e.time_range.start, e.time_range.end, e.name) for e in device
                    if getattr(e, "is_user_annotation", False) and e.name in parts)
    if ranges:
        for k in device:
            if getattr(k, "is_user_annotation", False) or k.name in parts:
                continue
            part = next((name for lo, hi, name in ranges if lo <= k.time_range.start < hi), "other")
            times[part] += (k.time_range.end - k.time_range.start) / reps
            counts[part] += 1 / reps
        return times, counts, "gpu ranges"
    for e in events:
        if e.device_type != DeviceType.CPU or not e.name.startswith("aten::"):
            continue
        top_level = e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        parent = e.cpu_parent
        while parent is not None and parent.name not in parts:
            parent = parent.cpu_parent
        part = parent.name if parent is not None else "other"
        times[part] += e.self_cpu_time_total / reps  # own time: nested operators are not counted twice
        counts[part] += top_level / reps  # operators called from Python, not those they call
    return times, counts, "launching op"


def profile_calls(fn: Callable[[], object], reps: int, device: torch.device):
    """A profile of `reps` calls of `fn` after two unrecorded ones."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for _ in range(reps):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
    return prof


def replayable(fn: Callable[[], object], device: torch.device, *, graphs: bool = True) -> Callable[[], None]:
    """On CUDA: `fn` warmed up on a side stream, captured as a CUDA graph, and its replay returned;
    elsewhere, or with `graphs` off (`--no-graphs`), `fn` itself. `fn` must be graph-safe (no host
    reads, static shapes)."""
    if device.type != "cuda" or not graphs:
        return fn
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay() -> None:
        graph.replay()

    replay.captured = fn  # the graph reads the tensors fn's closure owns: they live as long as the replay
    return replay
