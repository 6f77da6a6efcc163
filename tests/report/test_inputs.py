"""What a report reads when the store holds no calibration campaign: every note says so and every
suggested command line leaves `--name` for the user to fill in (never the Python value None)."""

from __future__ import annotations

import dataclasses

from hybridspec.report import build_report
from hybridspec.workbench.store import Store
from tests.fitters.test_campaign import _spec


def test_a_store_without_a_calibration_campaign_names_none_and_suggests_a_name(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        run_id = store.start_run(dataclasses.replace(_spec("eval"), name="other"))
        store.finish_shard(run_id, 0)
    result = build_report(db, tmp_path / "page")
    assert result.campaign is None
    notes = [s.note for s in result.sections]
    assert not any("None" in note for note in notes), notes
    capture = result.section("acceptance").note
    assert f"no capture run in {db}, which holds no calibration campaign" in capture
    assert f"`hybridspec capture --db {db} --name NAME --passes capture`" in capture
    assert "hybridspec fit" in result.section("dinkelbach").note and "--name NAME" in result.section("dinkelbach").note
    policies = result.section("policies").note
    assert "no eval run of a calibration campaign (the store holds none)" in policies and "'other'" in policies
    assert f"hybridspec eval --db {db} --name NAME --artifact A" in policies
