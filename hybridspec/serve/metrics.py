"""The server's counters, rendered as Prometheus text for /metrics, and the parser that reads
such a page back (the demo's round statistics). Every sample is named `hybridspec_<name>`."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

PREFIX = "hybridspec_"
HISTOGRAM = "verification_length"  # executed w per round; buckets le="1" … le="W", "+Inf"
_SAMPLE = re.compile(rf"^{PREFIX}([a-z_]+)(\{{[^}}]*\}})? ([0-9.eE+-]+|[+-]?Inf|NaN)$")
_BUCKET = re.compile(r'^\{le="(\d+)"\}$')


@dataclass
class Metrics:
    """Counters for /metrics; written from the worker thread, read under `lock`."""

    max_length: int  # W, the histogram's largest bucket
    requests: int = 0
    cancelled: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    decode_tokens: int = 0  # tokens from rounds (after the prefill anchor)
    decode_seconds: float = 0.0
    rounds: int = 0
    verification: dict[int, int] = field(default_factory=dict)  # executed w → rounds
    waiting: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def render(self) -> str:
        with self.lock:
            al = self.decode_tokens / self.rounds if self.rounds else 0.0
            tps = self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0
            lines = [
                *metric_lines("requests_total", "counter", "Finished generation requests.", self.requests),
                *metric_lines("requests_cancelled_total", "counter", "Requests whose client went away.",
                              self.cancelled),
                *metric_lines("request_errors_total", "counter", "Requests answered with a 4xx/5xx.", self.errors),
                *metric_lines("prompt_tokens_total", "counter", "Prompt tokens of served requests.",
                              self.prompt_tokens),
                *metric_lines("generation_tokens_total", "counter", "Generated tokens (usage.completion_tokens).",
                              self.generation_tokens),
                *metric_lines("rounds_total", "counter", "Decoding rounds (AR steps or speculative rounds).",
                              self.rounds),
                *metric_lines("acceptance_length", "gauge", "Decode tokens per round, all requests.", al),
                *metric_lines("decode_tokens_per_second", "gauge", "Decode tokens per decode second, all requests.",
                              tps),
                *metric_lines("queue_depth", "gauge", "Requests waiting for the engine.", self.waiting),
                *metric_lines("requests_running", "gauge", "Requests on the engine (0 or 1).", self.running),
                f"# HELP {PREFIX}{HISTOGRAM} Executed verification length w per round.",
                f"# TYPE {PREFIX}{HISTOGRAM} histogram",
            ]
            cumulative = 0
            for w in range(1, self.max_length + 1):
                cumulative += self.verification.get(w, 0)
                lines.append(f'{PREFIX}{HISTOGRAM}_bucket{{le="{w}"}} {cumulative}')
            lines += [f'{PREFIX}{HISTOGRAM}_bucket{{le="+Inf"}} {self.rounds}',
                      f"{PREFIX}{HISTOGRAM}_sum {sum(w * c for w, c in self.verification.items())}",
                      f"{PREFIX}{HISTOGRAM}_count {self.rounds}"]
        return "\n".join(lines) + "\n"


def metric_lines(name: str, kind: str, help: str, value: float) -> list[str]:
    return [f"# HELP {PREFIX}{name} {help}", f"# TYPE {PREFIX}{name} {kind}", f"{PREFIX}{name} {value}"]


def parse_samples(text: str) -> dict[tuple[str, str], float]:
    """(name without the prefix, labels as written or "") → value, for every sample of a page."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            samples[match.group(1), match.group(2) or ""] = float(match.group(3))
    return samples


def read_metrics(text: str) -> dict:
    """The unlabelled samples of a page by name (without the prefix), and `verification_lengths`:
    rounds per executed length w, from the histogram's cumulative buckets (lengths with no round left out)."""
    samples = parse_samples(text)
    values = {name: value for (name, labels), value in samples.items() if not labels}
    buckets = {int(m.group(1)): value for (name, labels), value in samples.items()
               if name == f"{HISTOGRAM}_bucket" and (m := _BUCKET.match(labels))}
    histogram, previous = {}, 0.0
    for le in sorted(buckets):  # cumulative buckets → rounds per executed length
        histogram[le], previous = buckets[le] - previous, buckets[le]
    values["verification_lengths"] = {w: int(n) for w, n in histogram.items() if n}
    return values
