"""The server's Prometheus metrics (`prometheus_client`: its registry, collectors and exposition),
named and labelled as vLLM names its own (`vllm:spec_decode_num_drafts_total` …) with the prefix
`hybridspec:`, and `read_metrics`, which reads a /metrics page back with the library's parser.

Request and token counters carry `model_name` and `policy`; the spec-decode counters count
speculative rounds only (the `ar` policy drafts nothing):

    spec_decode_num_drafts_total            speculative rounds
    spec_decode_num_draft_tokens_total      draft tokens verified (w − 1 per round)
    spec_decode_num_accepted_tokens_total   draft tokens accepted (A per round)
    spec_decode_num_accepted_tokens_per_pos_total{position}   rounds that accepted position i
    verification_length                     executed w per round (histogram, buckets 1 … W)
    round_seconds                           wall time of one round (histogram)

`http_responses_total{method, path, status}` counts every HTTP response the server sends, errors
included; `path` is the route that answered (its template, `/v1/models/{model:path}`), or
`"other"` for paths outside the API's routes (`app.Gate` labels them).
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, generate_latest)
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "hybridspec:"
METHODS = ("GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)  # vLLM's time_to_first_token buckets
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0)  # vLLM's e2e_request_latency buckets
ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """Every metric of one server in its own registry (tests run several servers in one process).
    The metrics are thread-safe: the engine thread writes, the event loop renders."""

    def __init__(self, model_name: str, max_length: int):
        self.model_name = model_name
        self.registry = registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=registry)
        request = ("model_name", "policy")

        def counter(name: str, help: str, labels=request) -> Counter:
            return Counter(PREFIX + name, help, labels, registry=registry)

        self.request_success = counter("request_success", "Requests that finished.", (*request, "finished_reason"))
        self.request_cancelled = counter("request_cancelled", "Requests whose client went away (queued or running).")
        self.request_failed = counter("request_failed", "Requests the engine failed on (answered 500 or an error event).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that reached the engine.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens (usage.completion_tokens).")
        self.decode_tokens = counter("decode_tokens", "Tokens emitted by rounds (after the prefill anchor).")
        self.num_drafts = counter("spec_decode_num_drafts", "Speculative rounds.")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified (w - 1 per round).")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Speculative rounds that accepted the draft token at this position.",
                                        (*request, "position"))
        self.verification_length = Histogram(PREFIX + "verification_length", "Executed verification length w "
                                             "per round (counts the anchor; 1 for ar).", request,
                                             buckets=tuple(range(1, max_length + 1)), registry=registry)
        self.round_seconds = Histogram(PREFIX + "round_seconds", "Wall time of one decoding round.", request,
                                       buckets=ROUND_BUCKETS, registry=registry)
        self.time_to_first_token = Histogram(PREFIX + "time_to_first_token_seconds", "From the request's "
                                             "arrival to its first token (queue and prefill included).", request,
                                             buckets=TTFT_BUCKETS, registry=registry)
        self.e2e_latency = Histogram(PREFIX + "e2e_request_latency_seconds", "From the request's arrival to its "
                                     "last token, finished requests.", request, buckets=E2E_BUCKETS,
                                     registry=registry)
        self.running = Gauge(PREFIX + "num_requests_running", "Requests on the engine (0 or 1).", ("model_name",),
                             registry=registry).labels(model_name)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for the engine.", ("model_name",),
                             registry=registry).labels(model_name)
        self.http_responses = Counter(PREFIX + "http_responses", "HTTP responses sent, by status.",
                                      ("method", "path", "status"), registry=registry)

    def response(self, method: str, path: str, status: int) -> None:
        """One response: `path` is a route's label (bounded by the caller), methods outside HTTP's
        standard ones are counted as "other"."""
        self.http_responses.labels(method if method in METHODS else "other", path, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def read_metrics(text: str) -> dict:
    """The demo's summary of a /metrics page, over every label: `rounds_total`,
    `acceptance_length` (decode tokens per round), `decode_tokens_per_second`, and
    `verification_lengths` (rounds per executed w, lengths with no round left out)."""
    totals: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX) or sample.name.endswith("_created"):
                continue
            name = sample.name.removeprefix(PREFIX)
            if name == "verification_length_bucket" and sample.labels["le"] != "+Inf":
                buckets[float(sample.labels["le"])] = buckets.get(float(sample.labels["le"]), 0.0) + sample.value
            elif "le" not in sample.labels:
                totals[name] = totals.get(name, 0.0) + sample.value
    rounds = totals.get("round_seconds_count", 0.0)
    histogram, previous = {}, 0.0
    for le in sorted(buckets):  # cumulative buckets → rounds per executed length
        histogram[int(le)], previous = buckets[le] - previous, buckets[le]
    seconds = totals.get("round_seconds_sum", 0.0)
    return {"rounds_total": rounds, "acceptance_length": totals.get("decode_tokens_total", 0.0) / rounds if rounds else 0.0,
            "decode_tokens_per_second": totals.get("decode_tokens_total", 0.0) / seconds if seconds else 0.0,
            "verification_lengths": {w: int(n) for w, n in histogram.items() if n}, **totals}
