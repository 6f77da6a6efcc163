"""The /metrics page: prometheus_client's exposition of `ServerMetrics`, and the demo's reader."""

from hybridspec.serve.metrics import ServerMetrics, read_metrics
from tests.serve.scrape import samples, scrape


def _page() -> str:
    metrics = ServerMetrics("m", max_length=4)
    for policy, ws in (("full", (4, 4, 2)), ("ar", (1,))):
        for w in ws:
            metrics.verification_length.labels("m", policy).observe(w)
            metrics.round_seconds.labels("m", policy).observe(0.01)
        metrics.decode_tokens.labels("m", policy).inc(7 if policy == "full" else 1)
    metrics.response("POST", "/v1/completions", 200)
    metrics.response("BREW", "other", 418)
    return metrics.render().decode()


def test_read_metrics_turns_cumulative_buckets_into_counts_over_every_label():
    values = read_metrics(_page())
    assert values["rounds_total"] == 4 and values["acceptance_length"] == 8 / 4
    assert values["verification_lengths"] == {1: 1, 2: 1, 4: 2}
    assert abs(values["decode_tokens_per_second"] - 8 / 0.04) < 1e-6


def test_names_labels_and_unknown_paths_are_bounded():
    page = _page()
    names = {name for name, _, _ in samples(page)}
    assert {"hybridspec:verification_length_bucket", "hybridspec:round_seconds_count",
            "hybridspec:decode_tokens_total", "process_cpu_seconds_total"} <= names  # process metrics too
    assert scrape(page, policy="full")["hybridspec:verification_length_count"] == 3
    assert scrape(page, path="other", method="other", status="418")["hybridspec:http_responses_total"] == 1
