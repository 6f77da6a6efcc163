"""CUDA graphs by key, captured once per process, and per-phase times from CUDA events (the
resident round's, `resident.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class Graphs:
    """CUDA graphs by key, captured once (after one eager warm-up run that compiles every kernel)
    into one shared memory pool; captures are counted (a test checks that decoding captures
    nothing)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.captures = 0

    def capture(self, key: tuple, run: Callable[[], None], restore: Callable[[], None]) -> None:
        """Warm up `run` on a side stream, restore the host state it advanced, capture it."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        restore()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run()
        restore()
        self.graphs[key] = graph
        self.captures += 1

    def forget(self) -> None:
        """Drop every graph (the next replay of a key needs a new capture); the capture count stays."""
        self.graphs.clear()

    def replay(self, key: tuple) -> None:
        graph = self.graphs.get(key)
        if graph is None:
            raise RuntimeError(f"no CUDA graph captured for {key}; prepare() the policy before its request")
        graph.replay()


class PhaseTimer:
    """Per-phase times: CUDA events recorded between launches and read after the round's one
    synchronisation (GPU time, nothing waits between phases), or the wall clock on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self._now())]
        self.done = None  # the event after the report's copy (`close`)
        self.seconds: dict[str, float] = {}

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def close(self) -> None:
        """Mark the end of the round's work, its report's copy included: what `finish` waits for."""
        self.done = self._now()

    def finish(self) -> None:
        """Wait for the round and its report's copy (the one host synchronisation) and turn the
        marks into seconds."""
        if self.cuda:
            self.done.synchronize()
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
            self.seconds[phase] = (a.elapsed_time(b) / 1e3) if self.cuda else b - a
        first, last = self.marks[0][1], self.marks[-1][1]
        self.seconds["total"] = (first.elapsed_time(last) / 1e3) if self.cuda else last - first
