"""The /metrics page: the server's renderer and the parser the demo reads it with."""

from hybridspec.serve.metrics import Metrics, read_metrics


def test_read_metrics_turns_cumulative_buckets_into_counts():
    page = "\n".join([
        "# HELP hybridspec_rounds_total x", "hybridspec_rounds_total 5", "hybridspec_acceptance_length 2.5",
        'hybridspec_verification_length_bucket{le="1"} 0', 'hybridspec_verification_length_bucket{le="2"} 3',
        'hybridspec_verification_length_bucket{le="3"} 3', 'hybridspec_verification_length_bucket{le="4"} 5',
        'hybridspec_verification_length_bucket{le="+Inf"} 5'])
    values = read_metrics(page)
    assert values["rounds_total"] == 5 and values["acceptance_length"] == 2.5
    assert values["verification_lengths"] == {2: 3, 4: 2}


def test_a_rendered_page_reads_back():
    metrics = Metrics(max_length=4, requests=2, generation_tokens=9, decode_tokens=7, rounds=3,
                      verification={1: 1, 4: 2})
    values = read_metrics(metrics.render())
    assert values["requests_total"] == 2 and values["generation_tokens_total"] == 9
    assert values["rounds_total"] == 3 and values["acceptance_length"] == 7 / 3
    assert values["verification_lengths"] == {1: 1, 4: 2}
    assert values["verification_length_count"] == 3 and values["verification_length_sum"] == 9
