"""A small real campaign on the embedded default pair: every pass of `hybridspec capture --quick`
(6 calibration prompts of 3 categories, 12 new tokens) and the cost profile, `hybridspec fit`, then `eval --quick` of
three policies (and ar) on 6 test prompts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from typer.testing import CliRunner

from hybridspec.cli import app
from hybridspec.collectors.campaign import run_campaign
from hybridspec.collectors.common import ALL_PASSES, CaptureConfig
from hybridspec.collectors.evaluate import EvalConfig, run_eval
from hybridspec.runtime.session import EMBEDDED
from hybridspec.workbench.store import Store, run_id_for

CAMPAIGN = "t"
CATEGORIES = ("code", "comment", "test")  # --quick keeps 2 prompts of each: the fit holds out the fifth
POLICIES = ("full", "static:4", "hybridspec")


def _prompt_file(path: Path) -> Path:
    rows = []
    for line in (EMBEDDED / "prompts.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["category"] in CATEGORIES:
            rows.append(line)
    path.write_text("\n".join(rows) + "\n")
    return path


def _calibrate(root: Path) -> None:
    """The campaign, its artifact and its eval run, written into `root`."""
    db, artifact, prompts = root / "store.duckdb", root / "policy.safetensors", _prompt_file(root / "prompts.jsonl")
    run_campaign(CaptureConfig(prompts=prompts, db=db, name=CAMPAIGN, quick=True, max_new_tokens=12,
                               passes=(*ALL_PASSES, "profile")))
    # a campaign this small may fail fit-quality checks: the report shows them, so write it anyway
    fitted = CliRunner().invoke(app, ["fit", "--db", str(db), "--name", CAMPAIGN, "--out", str(artifact),
                                      "--allow-poor-fit"])
    assert fitted.exit_code == 0, fitted.output
    run_eval(EvalConfig(prompts=prompts, split="test", db=db, name=CAMPAIGN, artifact=artifact, policies=POLICIES,
                        quick=True, max_new_tokens=12))


@pytest.fixture(scope="session")
def calibrated(tmp_path_factory) -> tuple[Path, Path]:
    """(store, artifact) of a quick campaign named `t`, with its eval run. Under pytest-xdist the
    first worker to ask builds it once for the whole test run (the others wait on a file lock in
    the run's shared temporary folder), and each worker gets a copy of its own (DuckDB lets one
    process at a time open a file for writing)."""
    root = tmp_path_factory.mktemp("calibrated")
    if "PYTEST_XDIST_WORKER" not in os.environ:  # no xdist: the folder above basetemp outlives this run
        _calibrate(root)
    else:
        shared = tmp_path_factory.getbasetemp().parent / "calibrated-campaign"
        with FileLock(f"{shared}.lock"):
            if not (shared / "built").is_file():
                shutil.rmtree(shared, ignore_errors=True)  # what a failed first build left: each worker retries
                shared.mkdir()
                _calibrate(shared)
                (shared / "built").touch()
        shutil.copytree(shared, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("built"))
    return root / "store.duckdb", root / "policy.safetensors"


@pytest.fixture(scope="session")
def report(calibrated, tmp_path_factory):
    """`build_report` of the calibrated store with its artifact."""
    from hybridspec.report import build_report

    db, artifact = calibrated
    return build_report(db, tmp_path_factory.mktemp("report"), artifact=artifact)


@pytest.fixture(scope="session")
def capture_only(calibrated, tmp_path_factory) -> Path:
    """A copy of the calibrated store with nothing but its capture run."""
    db = tmp_path_factory.mktemp("capture_only") / "store.duckdb"
    shutil.copy(calibrated[0], db)
    keep = run_id_for(CAMPAIGN, "capture")
    with Store(db) as store:
        tables = [t for (t,) in store.query("SELECT table_name FROM information_schema.columns "
                                            "WHERE column_name = 'run_id' GROUP BY table_name")]
        for table in tables:
            store.con.execute(f"DELETE FROM {table} WHERE run_id <> ?", [keep])
    return db
