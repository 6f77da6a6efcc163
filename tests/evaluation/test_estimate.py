"""`estimate_offline` (the library side of `hybridspec estimate`) at its edges: a store path that is
no file is refused as "no such store" naming the option and path, before any campaign is looked
up; an artifact fitted for another model is refused naming both ids unless `force`, and a forced
estimate equals the one with the matching artifact (the identity changes nothing replayed)."""

from __future__ import annotations

import pytest
from polars.testing import assert_frame_equal

from hybridspec.artifacts.artifact import ArtifactError, save_artifact
from hybridspec.evaluation.estimate import OtherCosts, estimate_offline
from hybridspec.workbench.store import Store, StoreError
from tests.evaluation.test_offline import PARAMS, _write_capture

POLICIES = ("ar", "static:4", "hybridspec")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    path = tmp_path_factory.mktemp("estimate")
    with Store(path / "s.duckdb") as store:
        _write_capture(store, "synth", 60, seed=6)
    for name, model_id in (("own", "sha256:m"), ("other", "sha256:other")):
        save_artifact(path / f"{name}.safetensors", PARAMS, model_id=model_id, drafter_id="sha256:d", device="cpu",
                      store_digest="x", diagnostics={})
    return path


def test_a_missing_store_is_named(campaign, tmp_path):
    missing = tmp_path / "missing.duckdb"
    with pytest.raises(StoreError, match=f"^--db {missing}: no such store$"):
        estimate_offline(missing, campaign / "own.safetensors")
    with pytest.raises(StoreError, match=f"^--db {missing}: no such store$"):
        estimate_offline(missing, campaign / "own.safetensors", campaign="synth")
    costs = OtherCosts(campaign / "own.safetensors", missing)
    with pytest.raises(StoreError, match=f"^--costs-db {missing}: no such store$"):
        estimate_offline(campaign / "s.duckdb", campaign / "own.safetensors", costs=costs)
    assert not missing.exists()


def test_force_uses_an_artifact_of_another_model(campaign):
    db = campaign / "s.duckdb"
    with pytest.raises(ArtifactError, match="sha256:other.*sha256:m"):
        estimate_offline(db, campaign / "other.safetensors", policies=POLICIES)
    forced = estimate_offline(db, campaign / "other.safetensors", policies=POLICIES, force=True)
    own = estimate_offline(db, campaign / "own.safetensors", policies=POLICIES)
    assert_frame_equal(forced.table, own.table, rel_tol=1e-12)  # polars' group sums: order of addition varies


def test_the_command_takes_force(campaign):
    from typer.testing import CliRunner

    from hybridspec.cli import app

    args = ["estimate", "--db", str(campaign / "s.duckdb"), "--artifact", str(campaign / "other.safetensors"),
            "--policies", ",".join(POLICIES), "--json"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "sha256:other" in refused.stderr
    assert CliRunner().invoke(app, [*args, "--force"]).exit_code == 0
