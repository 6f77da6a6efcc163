"""`export_store`: every table through DuckDB's COPY, the rows read back equal to the store's."""

import duckdb
import pytest

from hybridspec.workbench.export import export_store
from hybridspec.workbench.schema import KEYS
from hybridspec.workbench.store import RunSpec, Store, StoreError
from tests.workbench.test_store import write_version_1_store


def _store(path):
    with Store(path) as store:
        for name in ("a", "b"):
            run = store.start_run(RunSpec(name=name, pass_name="stage0", model_id="m", drafter_id=None, device="cpu",
                                          dtype="float32", backend="torch", threads=1, host_cpu="c"))
            store.commit_unit(run, "block=0", {"stage0_timings": [
                {"run_id": run, "u": u, "sample_idx": 0, "latency_us": 10.0 * u + (name == "b"),
                 "context_tokens": 8, "block": 0, "block_order": u - 1} for u in (1, 2, 3)]})
    return path


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_round_trips_the_rows(tmp_path, fmt):
    db = _store(tmp_path / "s.duckdb")
    counts = export_store(db, tmp_path / "out", fmt=fmt)
    assert set(counts) == {"schema_version", *KEYS} and counts["stage0_timings"] == 6 and counts["runs"] == 2
    reader = "read_parquet" if fmt == "parquet" else "read_csv_auto"
    with Store(db, read_only=True) as store:
        for table in ("runs", "stage0_timings", "units"):
            back = duckdb.sql(f"SELECT * FROM {reader}('{tmp_path / 'out' / f'{table}.{fmt}'}') ORDER BY ALL")
            mine = store.query(f"SELECT * FROM {table} ORDER BY ALL")
            assert [tuple(map(str, r)) for r in back.fetchall()] == [tuple(map(str, r)) for r in mine]


def test_export_of_one_campaign_and_errors(tmp_path):
    db = _store(tmp_path / "s.duckdb")
    counts = export_store(db, tmp_path / "b", campaign="b")
    assert counts["runs"] == 1 and counts["stage0_timings"] == 3
    rows = duckdb.sql(f"SELECT DISTINCT latency_us % 10 FROM '{tmp_path / 'b' / 'stage0_timings.parquet'}'").fetchall()
    assert rows == [(1.0,)]
    with pytest.raises(StoreError, match="no run named 'z'.*'a', 'b'"):
        export_store(db, tmp_path / "z", campaign="z")
    with pytest.raises(StoreError, match="parquet or csv"):
        export_store(db, tmp_path / "z", fmt="xlsx")


def test_an_older_store_is_refused_and_nothing_is_written(tmp_path):
    from hybridspec.workbench import schema

    db = tmp_path / "v1.duckdb"
    write_version_1_store(db)
    with pytest.raises(StoreError, match=rf"v1.duckdb has schema version 1; .*schema {schema.SCHEMA_VERSION}"):
        export_store(db, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1.duckdb"]


def test_a_failed_export_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    from hybridspec.workbench import export

    db = _store(tmp_path / "s.duckdb")
    monkeypatch.setattr(export, "KEYS", {**KEYS, "no_such_table": ()})  # COPY fails after every other table
    with pytest.raises(duckdb.Error, match="no_such_table"):
        export_store(db, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]  # no directory, no staging files
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "runs.parquet").write_text("earlier export")
    with pytest.raises(duckdb.Error, match="no_such_table"):
        export_store(db, tmp_path / "old")
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["runs.parquet"]
    assert (tmp_path / "old" / "runs.parquet").read_text() == "earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "s.duckdb"]
    monkeypatch.setattr(export, "KEYS", KEYS)
    export_store(db, tmp_path / "old")  # into an existing directory: every table's file replaced
    assert len(list((tmp_path / "old").iterdir())) == len(KEYS) + 1
