"""Sections 8 and 10 on a synthetic store (no model): the policy table measures the report's own
campaign's eval run only (another campaign's is named, never shown in its place), and the executed
lengths come from eval rounds only (the capture pass always verifies W)."""

from __future__ import annotations

import dataclasses

import pytest

from hybridspec.fitters.export import fit_artifact
from hybridspec.report import build_report
from hybridspec.report.runs import chosen_eval_run
from hybridspec.workbench.store import Store
from tests.fitters.test_campaign import _spec, write_synthetic_store


def test_the_eval_run_is_the_campaigns_own_or_none():
    runs = [{"name": "a"}, {"name": "t"}, {"name": "b"}]
    assert chosen_eval_run(runs, "t") is runs[1]
    assert chosen_eval_run(runs, "z") is None and chosen_eval_run([], "t") is None
    assert chosen_eval_run(runs, None) is None  # a store without calibration runs has no campaign


@pytest.fixture(scope="module")
def foreign_eval(tmp_path_factory):
    """The report of campaign `synth`, whose store also holds an eval run of campaign `other`."""
    root = tmp_path_factory.mktemp("foreign_eval")
    db, artifact = root / "s.duckdb", root / "a.safetensors"
    write_synthetic_store(db, n_rounds=300)
    with Store(db) as store:
        store.start_run(dataclasses.replace(_spec("eval"), name="other"))
        for (run_id,) in store.query("SELECT run_id FROM runs"):  # fit reads finished runs only
            store.finish_shard(run_id, 0)
    fit_artifact(db, "synth", artifact, allow_poor_fit=True)
    return build_report(db, root / "page", artifact=artifact)


def test_another_campaigns_eval_run_is_named_not_measured(foreign_eval):
    section = foreign_eval.section("policies")
    assert foreign_eval.campaign == "synth" and section.status == "partial"
    assert "no eval run of campaign 'synth' (eval runs of other campaigns: 'other')" in section.note
    assert "hybridspec eval --db" in section.note and "--name synth" in section.note
    columns = section.tables["policies"].columns
    assert "tps" in columns and not any(c.endswith("_measured") for c in columns)  # estimated only
    assert section.headline.endswith("estimated only")


def test_without_eval_rounds_the_lengths_section_says_so(foreign_eval):
    section = foreign_eval.section("lengths")
    assert section.status == "missing" and not section.tables
    assert "no eval rounds in the store" in section.note and "capture run always verifies W" in section.note
    assert "hybridspec eval --db" in section.note


def test_an_unfinished_calibration_run_is_named_in_the_runs_section(tmp_path):
    db = tmp_path / "s.duckdb"
    write_synthetic_store(db, n_rounds=300, finished=False)
    section = build_report(db, tmp_path / "page").section("metadata")
    assert section.status == "partial"
    assert "is unfinished (status 'running')" in section.note and "--resume" in section.note


def test_force_estimates_with_an_artifact_of_another_model(tmp_path):
    """An artifact fitted for another model: the policy section names both ids and says to pass
    --force; with force it holds the estimates."""
    from hybridspec.artifacts.artifact import load_artifact, save_artifact

    db, artifact, foreign = tmp_path / "s.duckdb", tmp_path / "a.safetensors", tmp_path / "f.safetensors"
    write_synthetic_store(db, n_rounds=300)
    fit_artifact(db, "synth", artifact, allow_poor_fit=True)
    params, meta = load_artifact(artifact)
    save_artifact(foreign, params, model_id="sha256:another", drafter_id=meta["drafter_id"], device="cpu",
                  store_digest=meta["store_digest"], diagnostics=meta["diagnostics"])
    refused = build_report(db, tmp_path / "page", artifact=foreign).section("policies")
    assert refused.status == "missing" and "sha256:another" in refused.note and "--force" in refused.note
    forced = build_report(db, tmp_path / "forced", artifact=foreign, force=True).section("policies")
    own = build_report(db, tmp_path / "own", artifact=artifact).section("policies")
    assert forced.tables["policies"].equals(own.tables["policies"])


def test_another_campaigns_eval_lengths_are_labelled_with_its_name(tmp_path):
    """Section 8 of campaign `synth` when the store holds only campaign `other`'s eval rounds: each
    series carries the run's name, and the section says they are not this campaign's."""
    db = tmp_path / "s.duckdb"
    write_synthetic_store(db, n_rounds=300)
    with Store(db) as store:
        run_id = store.start_run(dataclasses.replace(_spec("eval"), name="other"))
        for policy, ws in (("ar", (1, 1, 1)), ("full", (16, 16, 4))):
            for i, w in enumerate(ws):
                store.con.execute("INSERT INTO eval_rounds VALUES (?, ?, 'p0', ?, NULL, ?, ?, 0, 1, false, 10.0)",
                                  [run_id, policy, i, w, w])
        store.finish_shard(run_id, 0)
    section = build_report(db, tmp_path / "page").section("lengths")
    assert sorted(set(section.tables["per_series"]["series"])) == ["other / ar", "other / full"]
    assert section.headline == ("other / ar: mean w over its rounds 1.00; "
                                "other / full: mean w over its rounds 12.00")
    assert section.status == "partial" and "'other'" in section.note
    assert "no eval run of campaign 'synth'" in section.note
