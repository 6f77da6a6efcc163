"""`hybridspec eval` on the embedded default pair: rows per (policy, prompt) that add up, greedy
outputs equal to ar's, Table 1 equal to a recomputation from the rows, mismatches reported, a
resumed run equal to an uninterrupted one, and the CLI's refusals before any model loads."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import save_artifact
from hybridspec.cli import app
from hybridspec.collectors import evaluate
from hybridspec.collectors.campaign import run_campaign
from hybridspec.collectors.common import CaptureConfig
from hybridspec.collectors.eval_output import eval_json, exactness_lines
from hybridspec.collectors.evaluate import EvalConfig, first_mismatch, run_eval
from hybridspec.evaluation.offline import AVERAGE, ESTIMATE_COLUMNS, MEASURED_COLUMNS, METRICS
from hybridspec.evaluation.tables import measured_table
from hybridspec.runtime.engine import Engine
from hybridspec.runtime.session import default_model, model_identity
from hybridspec.workbench.store import Store, run_id_for
from tests.runtime.helpers import policy_parameters

POLICIES = ("ar", "full", "static:4", "hybridspec")
NEW_TOKENS = 12
TEXTS = {"code": ("def add(a, b):\n    return", "class Point:\n    def __init__(self, x, y):\n"),
         "docs": ('"""Return the sum of the', "# Copyright (C) 2001 Python Software Foundation\n# ")}
runner = CliRunner()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """Short prompts (2 categories × 2 test prompts, 1 calibration prompt each), a hand-built artifact
    for the embedded pair, and a store holding a capture run of campaign `t` on the calibration prompts."""
    if default_model()[1] is None:
        pytest.skip("the embedded pair is not installed")
    path = tmp_path_factory.mktemp("eval")
    lines = [json.dumps({"id": f"{c}-{i}", "category": c, "split": "test" if i < 2 else "calib", "prompt": text})
             for c, texts in TEXTS.items() for i, text in enumerate((*texts, texts[0] + " "))]
    (path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    model_id, drafter_id = model_identity(*default_model())
    save_artifact(path / "a.safetensors", policy_parameters(), model_id=model_id, drafter_id=drafter_id,
                  device="cpu", store_digest="x", diagnostics={})
    run_campaign(CaptureConfig(prompts=path / "prompts.jsonl", db=path / "s.duckdb", name="t", passes=("capture",),
                               max_new_tokens=NEW_TOKENS))
    return {"prompts": path / "prompts.jsonl", "artifact": path / "a.safetensors", "db": path / "s.duckdb"}


def _config(setup, **kw) -> EvalConfig:
    return EvalConfig(**{"prompts": setup["prompts"], "artifact": setup["artifact"], "db": setup["db"], "name": "t",
                         "policies": POLICIES, "max_new_tokens": NEW_TOKENS, **kw})


@pytest.fixture(scope="module")
def evaluated(setup):
    return run_eval(_config(setup))


def _rows(db: Path, run_id: str) -> tuple[list[tuple], list[tuple]]:
    """eval_requests and eval_rounds without timings, in key order."""
    with Store(db, read_only=True) as store:
        requests = store.query("SELECT policy, prompt_id, category, prompt_tokens, emitted_tokens, rounds, mean_w, "
                               "mismatch_position, finish_reason, token_ids FROM eval_requests WHERE run_id = ? "
                               "ORDER BY policy, prompt_id", [run_id])
        rounds = store.query("SELECT policy, prompt_id, round_idx, w0, u, w, accepted, emitted, truncated "
                             "FROM eval_rounds WHERE run_id = ? ORDER BY policy, prompt_id, round_idx", [run_id])
    return requests, rounds


def test_rows_per_request_add_up_and_equal_ar(evaluated, setup):
    with Store(setup["db"], read_only=True) as store:
        run = store.run_row(evaluated.run_id)
        requests = store.frame("SELECT * FROM eval_requests WHERE run_id = ?", [evaluated.run_id])
        rounds = store.frame("SELECT policy, prompt_id, count(*) AS n, sum(emitted) AS emitted, avg(w) AS w "
                             "FROM eval_rounds WHERE run_id = ? GROUP BY ALL", [evaluated.run_id])
    params = json.loads(run["params"])
    assert (run["pass"], run["status"], params["policies"], params["max_new_tokens"], params["split"]) == \
        ("eval", "finished", list(POLICIES), NEW_TOKENS, "test")
    assert params["temperature"] == 0.0 and params["artifact"].startswith("sha256:") and params["graphs"] is True
    assert sorted(requests.select("policy", "prompt_id").rows()) == sorted(
        (p, f"{c}-{i}") for p in POLICIES for c in TEXTS for i in range(2))
    per_round = {(r["policy"], r["prompt_id"]): r for r in rounds.iter_rows(named=True)}
    outputs = defaultdict(set)
    for r in requests.iter_rows(named=True):
        agg = per_round[r["policy"], r["prompt_id"]]
        assert (agg["n"], agg["emitted"]) == (r["rounds"], r["emitted_tokens"])
        assert agg["w"] == pytest.approx(r["mean_w"])
        assert r["emitted_tokens"] == len(json.loads(r["token_ids"])) - 1 and r["mismatch_position"] is None
        outputs[r["prompt_id"]].add(r["token_ids"])
    assert all(len(o) == 1 for o in outputs.values())  # every policy emitted exactly ar's tokens
    assert evaluated.mismatches.is_empty() and exactness_lines(evaluated)[0][1]
    assert requests.filter(pl.col("policy") == "full")["mean_w"].max() > 4  # the policies really differ
    assert requests.filter(pl.col("policy") == "static:4")["mean_w"].max() <= 4


def test_table_equals_a_recomputation_from_the_rows(evaluated, setup):
    with Store(setup["db"], read_only=True) as store:
        rows = store.frame("SELECT * FROM eval_requests WHERE run_id = ?", [evaluated.run_id]).to_dicts()
    table = measured_table(setup["db"], "t")
    assert table.equals(evaluated.measured) and tuple(table.columns) == MEASURED_COLUMNS
    sums = defaultdict(lambda: defaultdict(float))
    for r in rows:
        s = sums[r["policy"], r["category"]]
        s["emitted"] += r["emitted_tokens"]
        s["seconds"] += r["decode_seconds"]
        s["rounds"] += r["rounds"]
        s["w"] += r["mean_w"] * r["rounds"]
    for policy in POLICIES:
        want = []
        for category in TEXTS:
            s, ar = sums[policy, category], sums["ar", category]
            tps = s["emitted"] / s["seconds"]
            want.append({"al": s["emitted"] / s["rounds"], "mean_w": s["w"] / s["rounds"], "tps": tps,
                         "sr": tps / (ar["emitted"] / ar["seconds"]), "rounds": s["rounds"],
                         "decode_seconds": s["seconds"]})
            got = table.filter((pl.col("policy") == policy) & (pl.col("category") == category)).to_dicts()[0]
            for key, value in want[-1].items():
                assert got[key] == pytest.approx(value, rel=1e-9), (policy, category, key)
        average = table.filter((pl.col("policy") == policy) & (pl.col("category") == AVERAGE)).to_dicts()[0]
        for key in ("al", "mean_w", "tps", "sr"):
            assert average[key] == pytest.approx(sum(w[key] for w in want) / len(want), rel=1e-9)
    assert table.filter(pl.col("policy") == "ar")["sr"].to_list() == pytest.approx([1.0] * (len(TEXTS) + 1))
    summary = eval_json(evaluated)  # --json: measured seconds named as measured, estimated as estimated
    assert [tuple(row) for row in summary["measured"]] == [MEASURED_COLUMNS] * table.height
    assert summary["measured"] == table.to_dicts()
    assert [tuple(row) for row in summary["estimates"]] == [ESTIMATE_COLUMNS] * evaluated.estimates.height


def test_offline_estimates_are_stored_beside_the_run(evaluated, setup):
    assert evaluated.estimates is not None and not evaluated.notes
    assert evaluated.estimates["policy"].unique(maintain_order=True).to_list() == list(POLICIES)
    with Store(setup["db"], read_only=True) as store:
        stored = store.frame("SELECT * FROM offline_estimates WHERE run_id = ?", [evaluated.run_id])
    assert set(stored["capture_run_id"]) == {run_id_for("t", "capture")}
    assert {"static:2", "static:16", "ratio", "nominal"} <= set(stored["policy"])  # every policy is estimated
    comparison = evaluated.comparison
    assert comparison.height == evaluated.measured.height
    row = comparison.filter((pl.col("policy") == "full") & (pl.col("category") == AVERAGE)).to_dicts()[0]
    assert row["al_diff"] == pytest.approx(row["al_estimated"] - row["al_measured"])


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 9, 3], [1, 2, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2 == first_mismatch([1, 2, 3, 4], [1, 2])


def test_a_wrong_output_is_reported_with_its_position(setup, tmp_path, monkeypatch):
    original = Engine.generate

    def corrupted(self, prompt_ids, *, policy, **kw):  # static:4 emits one wrong token at index 3
        result = original(self, prompt_ids, policy=policy, **kw)
        if policy.name == "static:4" and len(result.token_ids) > 3:
            result.token_ids[3] += 1
        return result

    monkeypatch.setattr(Engine, "generate", corrupted)
    result = run_eval(_config(setup, db=tmp_path / "m.duckdb", artifact=None, policies=("ar", "static:4", "full")))
    assert result.mismatches.select("policy", "mismatch_position").rows() == [("static:4", 3)] * 4
    (line, fine), = exactness_lines(result)
    assert not fine and "MISMATCH static:4: 4 of 4 outputs differ from ar" in line and "code-0 at 3" in line
    with Store(tmp_path / "m.duckdb", read_only=True) as store:
        assert store.query("SELECT policy, count(*) FROM eval_requests WHERE mismatch_position IS NULL "
                           "GROUP BY 1 ORDER BY 1") == [("ar", 4), ("full", 4)]


def test_resume_after_a_crash_gives_the_uninterrupted_rows(evaluated, setup, tmp_path, monkeypatch):
    db, original, calls = tmp_path / "r.duckdb", evaluate.EvalPass.collect, []

    def crashing(self, ctx, item):
        calls.append(item[0])
        if len(calls) == 5:  # the second prompt's `full`, after its ar output was committed
            raise RuntimeError("killed")
        return original(self, ctx, item)

    monkeypatch.setattr(evaluate.EvalPass, "collect", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        run_eval(_config(setup, db=db, artifact=None, policies=None))
    with Store(db, read_only=True) as store:
        assert store.query("SELECT count(*) FROM eval_requests") == [(4,)]
    monkeypatch.setattr(evaluate.EvalPass, "collect", original)
    resumed = run_eval(_config(setup, db=db, artifact=None, policies=None, resume=True))
    assert resumed.summary.resumed == 4 and resumed.summary.committed == 8
    assert resumed.policies == ("ar", "full", "static:7")
    requests, rounds = _rows(db, resumed.run_id)
    assert len(requests) == 12 and len({r[:2] for r in requests}) == 12
    want_requests, want_rounds = _rows(setup["db"], evaluated.run_id)  # the same greedy rows, uninterrupted
    assert [r for r in requests if r[0] in ("ar", "full")] == [r for r in want_requests if r[0] in ("ar", "full")]
    assert [r for r in rounds if r[0] in ("ar", "full")] == [r for r in want_rounds if r[0] in ("ar", "full")]
    assert all(r[7] is None for r in requests)  # the crashed prompt compared with its ar output from the store


def test_cli_refuses_bad_policies_before_loading(setup, tmp_path):
    bad = runner.invoke(app, ["eval", "--policies", "ar,bogus", "--db", str(tmp_path / "x.duckdb")])
    text = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "unknown policy 'bogus'" in text and "ar, full, static:N, ratio" in text
    missing = runner.invoke(app, ["eval", "--policies", "ar,hybridspec,nominal", "--db", str(tmp_path / "x.duckdb")])
    text = " ".join(missing.output.split())
    assert missing.exit_code == 2 and "hybridspec, nominal need --artifact" in text
    length = runner.invoke(app, ["eval", "--policies", "static:40", "--db", str(tmp_path / "x.duckdb")])
    assert length.exit_code == 2 and "length must be in 2..16" in " ".join(length.output.split())
    assert not (tmp_path / "x.duckdb").exists()


def test_cli_quick_run_prints_table_one(setup, tmp_path):
    result = runner.invoke(app, ["eval", "--quick", "--prompts", str(setup["prompts"]), "--max-new-tokens", "6",
                                 "--policies", "static:4", "--db", str(tmp_path / "c.duckdb")])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "measured" in text and "TPS" in text and "SR" in text and "Average" in text and "static:4" in text
    assert "equals ar's on all 4 prompts" in " ".join(text.split()) and "no --artifact" in text
    # --json: one object on stdout (progress goes to stderr), the same run's rows
    as_json = runner.invoke(app, ["eval", "--quick", "--prompts", str(setup["prompts"]), "--max-new-tokens", "6",
                                  "--policies", "static:4", "--db", str(tmp_path / "c.duckdb"), "--name", "j",
                                  "--json"])
    assert as_json.exit_code == 0, as_json.output
    summary = json.loads(as_json.stdout)
    assert summary["policies"] == ["ar", "static:4"] and summary["exact"] and summary["prompts"] == 4
    assert {row["policy"] for row in summary["measured"]} == {"ar", "static:4"} and summary["mismatches"] == []


def test_eval_takes_the_stores_only_campaign_and_threads(monkeypatch, tmp_path):
    from hybridspec.workbench.store import RunSpec

    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda config, reporter: seen.append(config) or None)
    monkeypatch.setattr("hybridspec.collectors.eval_output.print_eval", lambda console, result: None)
    runner = CliRunner()
    assert runner.invoke(app, ["eval", "--db", str(tmp_path / "new.duckdb"), "--threads", "2"]).exit_code == 0
    assert (seen[-1].name, seen[-1].threads) == ("default", 2)  # no store yet: the default name
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.start_run(RunSpec(name="calib", pass_name="capture", model_id="m", drafter_id="d", device="cpu",
                                dtype="float32", backend="torch"))
    assert runner.invoke(app, ["eval", "--db", str(db)]).exit_code == 0
    assert seen[-1].name == "calib" and seen[-1].threads is None


def test_categories_select_prompts_and_static_best_is_chosen_on_the_capture(setup, tmp_path):
    """--categories keeps the named categories (recorded with the run); static:best becomes the static
    length the offline estimate ranks first on the campaign's capture run, named in a note."""
    from hybridspec.artifacts.artifact import load_artifact
    from hybridspec.evaluation.offline import best_static_length

    db = tmp_path / "s.duckdb"
    db.write_bytes(setup["db"].read_bytes())  # the capture run of campaign t
    result = run_eval(_config({**setup, "db": db}, policies=("static:best",), categories=("docs",), max_new_tokens=6,
                              overwrite=True))  # the module's other tests may have evaluated campaign t already
    params, meta = load_artifact(setup["artifact"])
    with Store(db, read_only=True) as store:
        k, table = best_static_length(store, params, meta, campaign="t")
        (run_params,) = store.query("SELECT params FROM runs WHERE run_id = ?", [result.run_id])[0]
        categories = {c for (c,) in store.query("SELECT DISTINCT category FROM eval_requests WHERE run_id = ?",
                                                 [result.run_id])}
    average = table.filter(pl.col("category") == AVERAGE)
    assert average["tps"].max() == average.filter(pl.col("policy") == f"static:{k}")["tps"][0]
    assert result.policies == ("ar", f"static:{k}")
    assert any(note.startswith(f"static:best = static:{k}") for note in result.notes)
    assert categories == {"docs"} and json.loads(run_params)["categories"] == ["docs"]
    # the capture holds code and docs: the estimates keep docs alone, so each Average row (stored,
    # shown and compared) means the same one category as the measured Average
    with Store(db, read_only=True) as store:
        stored = {c for (c,) in store.query("SELECT DISTINCT category FROM offline_estimates WHERE run_id = ?",
                                            [result.run_id])}
    assert stored == set(result.estimates["category"]) == set(result.comparison["category"]) == {"docs", AVERAGE}
    for policy in result.policies:
        rows = {r["category"]: r for r in result.comparison.filter(pl.col("policy") == policy).iter_rows(named=True)}
        for m in METRICS:
            assert rows[AVERAGE][f"{m}_diff"] == pytest.approx(rows["docs"][f"{m}_diff"], rel=1e-12, abs=1e-12)


def test_unknown_categories_and_static_best_without_artifact_are_refused(setup, tmp_path):
    with pytest.raises(ValueError, match=r"'prose' not in split 'test'.*its categories: code, docs"):
        run_eval(_config(setup, db=tmp_path / "x.duckdb", categories=("code", "prose")))
    with pytest.raises(ValueError, match="static:best: needs --artifact"):
        run_eval(_config(setup, db=tmp_path / "y.duckdb", artifact=None, policies=("static:best",)))
    assert not (tmp_path / "y.duckdb").exists()
    bad = runner.invoke(app, ["eval", "--categories", " , ", "--db", str(tmp_path / "z.duckdb")])
    assert bad.exit_code == 2 and "--categories is empty" in " ".join(bad.output.split())


def test_a_refused_prompt_file_leaves_no_store_and_an_existing_one_as_it_was(setup, tmp_path):
    empty, db = tmp_path / "empty.jsonl", tmp_path / "e.duckdb"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: no prompts"):
        run_eval(_config(setup, db=db, prompts=empty))
    bad = runner.invoke(app, ["eval", "--prompts", str(empty), "--db", str(db)])
    assert bad.exit_code == 2 and "no prompts" in " ".join(bad.output.split())
    with pytest.raises(ValueError, match="not in split 'test'"):
        run_eval(_config(setup, db=db, categories=("prose",)))
    with pytest.raises(ValueError, match="static:best: .*campaign 't' has no capture run"):
        run_eval(_config(setup, db=db, policies=("static:best",)))
    assert not db.exists()
    db.write_bytes(setup["db"].read_bytes())
    before = db.read_bytes()
    with pytest.raises(ValueError, match="no prompts"):
        run_eval(_config(setup, db=db, prompts=empty, resume=True))
    assert db.read_bytes() == before
