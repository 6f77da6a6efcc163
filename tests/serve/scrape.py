"""Reading a /metrics page in tests, with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample on the page."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(text: str, **labels: str) -> dict[str, float]:
    """Sample name → value summed over the samples whose labels include `labels` (buckets left out)."""
    totals: dict[str, float] = {}
    for name, sample_labels, value in samples(text):
        if "le" not in sample_labels and labels.items() <= sample_labels.items():
            totals[name] = totals.get(name, 0.0) + value
    return totals
