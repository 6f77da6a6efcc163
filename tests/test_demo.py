"""`hybridspec demo`: capture → fit → eval → serve + one openai request → report, on a smaller
prompt set (2 categories, few tokens) so that it runs in CI."""

import duckdb
import pytest
from rich.console import Console

from hybridspec.artifacts.artifact import load_artifact
from hybridspec.demo import CAMPAIGN, DemoConfig, run_demo_workflow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    console = Console(record=True, width=160)
    config = DemoConfig(out=out, max_new_tokens=10, categories=2, capture_tokens=16, eval_tokens=12)
    return run_demo_workflow(config, console), console.export_text(), out


def test_every_step_leaves_its_output(demo):
    result, text, out = demo
    params, meta = load_artifact(out / "policy.safetensors")
    assert params.rho > 0 and meta["model_id"] == result["fit"].model_id
    with duckdb.connect(str(out / "store.duckdb"), read_only=True) as db:
        passes = {p for (p,) in db.execute("SELECT pass FROM runs WHERE name = ?", [CAMPAIGN]).fetchall()}
        assert passes == {"capture", "fixed", "stage0", "moe", "routing", "eval"}
        mismatches = db.execute("SELECT count(*) FROM eval_requests WHERE mismatch_position IS NOT NULL").fetchone()
        assert mismatches == (0,)
    assert result["report"].path.is_file() and str(result["report"].path.resolve()) in text.replace("\n", "")
    for step in ("1/5 capture", "2/5 fit", "3/5 eval", "4/5 serve", "5/5 report"):
        assert step in text


def test_the_served_answer_and_its_round_statistics(demo):
    result, text, out = demo
    response, metrics = result["response"], result["metrics"]
    assert response["object"] == "text_completion" and response["choices"][0]["text"]
    assert response["usage"]["completion_tokens"] <= 10
    # one request was served: the server's counters are that request's
    assert metrics["request_success_total"] == 1 and metrics.get("request_failed_total", 0) == 0
    assert metrics["generation_tokens_total"] == response["usage"]["completion_tokens"]
    assert sum(metrics["verification_lengths"].values()) == metrics["rounds_total"] > 0
    assert "server stopped" in text and (out / "serve.log").is_file()
