"""The store: schema versions, one-transaction units, run-name rules, merge, content identities."""

from __future__ import annotations

import pytest

from hybridspec.workbench import schema
from hybridspec.runtime.session import model_identity
from hybridspec.workbench.runinfo import software_versions
from hybridspec.workbench.store import RunSpec, Store, StoreError, check_writable, merge_stores, run_id_for


def _spec(name="c", pass_name="stage0", shard_count=1, **kw) -> RunSpec:
    kw = {"params": {"samples": 3, "lengths": [1, 2]}, **kw}
    return RunSpec(name=name, pass_name=pass_name, model_id="m" * 64, drafter_id="d" * 64, device="cpu",
                   dtype="float32", backend="torch", versions=software_versions(), shard_count=shard_count, **kw)


def _timings(run_id: str, u: int, n: int = 3) -> dict:
    return {"stage0_timings": [{"run_id": run_id, "u": u, "sample_idx": i, "latency_us": 1.0 + i,
                                "context_tokens": 8} for i in range(n)]}


def test_new_store_has_every_table_and_the_current_version(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        assert store.version == schema.SCHEMA_VERSION
        tables = {t for (t,) in store.query("SELECT table_name FROM information_schema.tables")}
        assert set(schema.KEYS) | {"schema_version"} <= tables
        cols = {c for (c,) in store.query("SELECT column_name FROM information_schema.columns WHERE table_name='runs'")}
        assert {"run_id", "name", "pass", "status", "model_id", "drafter_id", "device", "dtype", "backend", "versions",
                "params", "started_at", "finished_at"} <= cols
    with Store(tmp_path / "s.duckdb") as again:  # reopening migrates nothing
        assert again.query("SELECT count(*) FROM schema_version") == [(schema.SCHEMA_VERSION,)]


def write_version_1_store(path, *statements: str) -> None:
    """A store as hybridspec with schema version 1 wrote it, then `statements` run in it."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
    for statement in (*schema.MIGRATIONS[1], "INSERT INTO schema_version VALUES (1, now())", *statements):
        con.execute(statement)
    con.close()


def test_a_version_1_store_is_upgraded_in_place(tmp_path):
    path = tmp_path / "v1.duckdb"
    write_version_1_store(path, "INSERT INTO stage0_timings VALUES ('r', 3, 0, 12.5, 8)")
    with Store(path, read_only=True) as old:  # reading does not migrate
        assert old.version == 1
    with Store(path) as store:
        assert store.version == 4 == schema.SCHEMA_VERSION
        assert [v for (v,) in store.query("SELECT version FROM schema_version ORDER BY 1")] == [1, 2, 3, 4]
        tables = {t for (t,) in store.query("SELECT table_name FROM information_schema.tables")}
        assert {"eval_requests", "eval_rounds", "offline_estimates", "cost_profile", "profile_calls"} <= tables
        assert set(schema.KEYS) <= tables
        assert store.query("SELECT * FROM stage0_timings") == [("r", 3, 0, 12.5, 8, None, None)]  # block unknown
        assert store.counts()["eval_requests"] == 0


def test_a_newer_schema_is_refused_naming_both_versions(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.con.execute("INSERT INTO schema_version VALUES (99, now())")
    with pytest.raises(StoreError, match=rf"schema version 99 .*schema version {schema.SCHEMA_VERSION}"):
        Store(path)


def test_a_duckdb_file_without_hybridspec_tables_is_refused_for_reading(tmp_path):
    import duckdb

    path = tmp_path / "blank.duckdb"
    duckdb.connect(str(path)).close()  # a valid DuckDB file with no tables
    with pytest.raises(StoreError, match="blank.duckdb: not a hybridspec store"):
        Store(path, read_only=True)
    with duckdb.connect(str(path), read_only=True) as con:  # refused without writing into it
        assert con.execute("SELECT count(*) FROM duckdb_tables()").fetchall() == [(0,)]


def test_a_unit_is_all_or_nothing_and_never_doubled(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run = store.start_run(_spec())
        assert store.commit_unit(run, "u=1", _timings(run, 1)) == 3
        bad = _timings(run, 2)
        bad["stage0_timings"].append(dict(bad["stage0_timings"][0]))  # a duplicate key inside the unit
        with pytest.raises(Exception, match="(?i)duplicate|constraint"):
            store.commit_unit(run, "u=2", bad)
        assert store.done_units(run) == {"u=1"}  # no marker, no rows of the failed unit
        assert store.query("SELECT count(*) FROM stage0_timings WHERE u = 2") == [(0,)]
        with pytest.raises(Exception, match="(?i)duplicate|constraint"):  # the same unit twice
            store.commit_unit(run, "u=1", _timings(run, 1))
        assert store.counts(run)["stage0_timings"] == 3


def test_run_names_resume_and_overwrite(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run = store.start_run(_spec())
        assert run == run_id_for("c", "stage0") == _spec().run_id
        store.commit_unit(run, "u=1", _timings(run, 1))
        with pytest.raises(StoreError, match=r"unfinished \(1 units committed\).*--resume.*--overwrite"):
            store.start_run(_spec())
        store.finish_shard(run, 0)
        assert store.run_row(run)["status"] == "finished" and store.run_row(run)["finished_at"] is not None
        with pytest.raises(StoreError, match="already exists and is finished"):
            store.check_name_free("c", "stage0", 0, resume=False, overwrite=False)
        assert store.start_run(_spec(), resume=True) == run and store.done_units(run) == {"u=1"}
        changed = RunSpec(**{**_spec().__dict__, "params": {"samples": 4, "lengths": [1, 2]}})
        with pytest.raises(StoreError, match="its params.samples is 3, this invocation's is 4"):
            store.start_run(changed, resume=True)
        store.start_run(changed, overwrite=True)
        assert store.done_units(run) == set() and store.counts(run)["stage0_timings"] == 0
        assert store.run_row(run)["status"] == "running"


def test_check_writable_names_the_problem(tmp_path):
    check_writable(tmp_path / "new.duckdb")
    with pytest.raises(StoreError, match="does not exist"):
        check_writable(tmp_path / "missing" / "x.duckdb")
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="does not exist"):
        check_writable(tmp_path / "file" / "x.duckdb")
    with pytest.raises(StoreError, match="is a directory"):
        check_writable(tmp_path)


def test_merge_is_the_union_and_finishes_a_run_when_every_shard_has(tmp_path):
    shards = []
    for index in range(2):
        path = tmp_path / f"shard{index}.duckdb"
        with Store(path) as store:
            run = store.start_run(_spec(shard_count=2), index)
            for u in (1, 2, 3, 4)[index::2]:
                store.commit_unit(run, f"u={u}", _timings(run, u), index)
            store.finish_shard(run, index)
            assert store.run_row(run)["status"] == "running"  # the other shard is not here
        shards.append(path)
    counts = merge_stores(tmp_path / "all.duckdb", shards[:1])
    assert counts["stage0_timings"] == 6
    counts = merge_stores(tmp_path / "all.duckdb", shards)  # merging shard 0 again adds nothing
    assert counts["stage0_timings"] == 12 and counts["units"] == 4 and counts["runs"] == 1
    with Store(tmp_path / "all.duckdb") as merged:
        assert merged.run_row(run_id_for("c", "stage0"))["status"] == "finished"
        assert merged.frame("SELECT u, count(*) AS n FROM stage0_timings GROUP BY u ORDER BY u")["n"].to_list() == [3] * 4
    with Store(tmp_path / "other.duckdb") as other:
        other.start_run(RunSpec(**{**_spec(shard_count=2).__dict__, "model_id": "x" * 64}))
    with pytest.raises(StoreError, match="has model_id"):
        merge_stores(tmp_path / "all.duckdb", [tmp_path / "other.duckdb"])
    with Store(shards[0]) as store:  # a run of another name beside the campaign's in a shard store
        other_run = store.start_run(_spec(name="older", shard_count=2), 0)
        store.commit_unit(other_run, "u=1", _timings(other_run, 1), 0)
    counts = merge_stores(tmp_path / "only.duckdb", shards, [run])  # the named runs only
    assert counts["runs"] == 1 and counts["stage0_timings"] == 12
    assert merge_stores(tmp_path / "only.duckdb", shards)["runs"] == 2


def test_content_identities(tmp_path, qwen35_dir):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(qwen35_dir, copy)
    assert model_identity(str(copy), None)[0] == model_identity(str(qwen35_dir), None)[0]
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_identity(str(copy), None)[0] != model_identity(str(qwen35_dir), None)[0]
    assert model_identity("random-tiny", None, seed=0) == model_identity("random-tiny", None, seed=0)
    assert model_identity("random-tiny", None, seed=0) != model_identity("random-tiny", None, seed=1)
    assert {"python", "torch", "transformers", "hybridspec", "duckdb", "numpy", "scipy", "scikit-learn",
            "statsmodels", "polars"} <= set(software_versions())


def test_run_rows_record_threads_and_host(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run = store.start_run(_spec(threads=1, host_cpu="cpu model", host_gpu=None))
        row = store.run_row(run)
        assert (row["threads"], row["host_cpu"], row["host_gpu"]) == (1, "cpu model", None)


def _damage(path, how: str) -> None:
    import os

    size = os.path.getsize(path)
    if how == "truncated":
        os.truncate(path, size // 2)
    else:  # the second half overwritten, the size kept
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(range(256)) * ((size - size // 2) // 256))


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_a_store_damaged_in_its_data_blocks_is_refused_naming_the_file(tmp_path, how):
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        run = store.start_run(_spec())
        for u in range(1, 60):
            store.commit_unit(run, f"u={u}", _timings(run, u, n=500))
    with Store(path, read_only=True) as store:
        store.verify()  # intact
    _damage(path, how)
    with pytest.raises(StoreError, match=rf"{path}: (damaged store|cannot open)"):
        with Store(path, read_only=True) as store:
            store.verify()


def test_resolve_campaign_takes_the_only_one(tmp_path):
    from hybridspec.workbench.store import resolve_campaign

    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.start_run(_spec(name="calib", pass_name="capture"))
        store.start_run(_spec(name="calib", pass_name="fixed"))
        store.start_run(_spec(name="ev", pass_name="eval"))  # eval runs are not campaigns
    assert resolve_campaign(path, None) == "calib" and resolve_campaign(path, "x") == "x"
    with Store(path) as store:
        store.start_run(_spec(name="other", pass_name="capture"))
    with pytest.raises(StoreError, match="--name .*'calib', 'other'"):
        resolve_campaign(path, None)
    assert resolve_campaign(path, None, fallback="default") == "default"


def test_resolve_campaign_in_a_store_without_one_says_to_capture(tmp_path):
    from hybridspec.workbench.store import resolve_campaign

    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.start_run(_spec(name="ev", pass_name="eval"))  # an eval run alone: no campaign
    with pytest.raises(StoreError, match="holds no calibration campaign; record one first .*hybridspec capture"):
        resolve_campaign(path, None)


def _shard(path, index: int, count: int = 2, **kw) -> str:
    """A store holding shard `index` of run c/stage0 (one unit per shard), finished."""
    with Store(path) as store:
        run = store.start_run(_spec(shard_count=count, **kw), index)
        store.commit_unit(run, f"u={index + 1}", _timings(run, index + 1), index)
        store.finish_shard(run, index)
    return run


def test_a_refused_merge_writes_nothing(tmp_path):
    good = tmp_path / "good.duckdb"
    _shard(good, 0)
    (tmp_path / "garbage.duckdb").write_bytes(b"garbage!")
    out = tmp_path / "out.duckdb"
    with pytest.raises(StoreError, match="nope.duckdb: no such store"):
        merge_stores(out, [tmp_path / "nope.duckdb"])
    assert not out.exists()
    with pytest.raises(StoreError, match="garbage.duckdb"):  # the first input is fine, the second is not
        merge_stores(out, [good, tmp_path / "garbage.duckdb"])
    assert not out.exists()
    conflicting = tmp_path / "conflicting.duckdb"
    _shard(conflicting, 1, threads=2)
    with pytest.raises(StoreError, match="has threads 2, .*good.duckdb has None"):  # two inputs disagree
        merge_stores(out, [good, conflicting])
    assert not out.exists()
    merge_stores(out, [good])
    before = out.read_bytes()
    for inputs in ([conflicting], [tmp_path / "nope.duckdb"], [good, tmp_path / "garbage.duckdb"]):
        with pytest.raises(StoreError):
            merge_stores(out, inputs)
        assert out.read_bytes() == before  # an existing output is left as it was


def test_merge_refuses_an_older_or_damaged_input_before_writing(tmp_path):
    old = tmp_path / "v1.duckdb"
    write_version_1_store(old)
    good, out = tmp_path / "good.duckdb", tmp_path / "out.duckdb"
    _shard(good, 0)
    with pytest.raises(StoreError, match="v1.duckdb has schema version 1"):
        merge_stores(out, [good, old])
    assert not out.exists()
    damaged = tmp_path / "damaged.duckdb"
    with Store(damaged) as store:
        run = store.start_run(_spec(shard_count=2), 1)
        for u in range(1, 60):
            store.commit_unit(run, f"u={u}", _timings(run, u, n=500), 1)
    _damage(damaged, "overwritten")
    with pytest.raises(StoreError, match=rf"{damaged}: (damaged store|cannot open)"):
        merge_stores(out, [good, damaged])
    assert not out.exists()


def test_timed_runs_are_identified_by_threads_gpu_and_graphs(tmp_path):
    """A timed pass (fixed, stage0, moe, eval) resumed or merged with another thread count, GPU or
    --graphs setting is refused naming both values; other passes record threads but are not bound by it."""
    with Store(tmp_path / "s.duckdb") as store:
        timed = store.start_run(_spec(threads=1, host_gpu="H100", params={"graphs": True}))
        for change, message in (({"threads": 2}, "its threads is 1, this invocation's is 2"),
                                ({"host_gpu": "H200"}, "its host_gpu is 'H100', this invocation's is 'H200'"),
                                ({"params": {"graphs": False}}, "its params.graphs is True, this invocation's is "
                                                                "False"),
                                ({"params": {}}, "its params.graphs is True, this invocation's is absent")):
            spec = _spec(**{"threads": 1, "host_gpu": "H100", "params": {"graphs": True}, **change})
            with pytest.raises(StoreError, match=f"cannot resume run 'c' \\(pass stage0\\): {message}"):
                store.start_run(spec, resume=True)
        assert store.start_run(_spec(threads=1, host_gpu="H100", params={"graphs": True}), resume=True) == timed
        capture = store.start_run(_spec(pass_name="capture", threads=1))
        assert store.start_run(_spec(pass_name="capture", threads=4), resume=True) == capture
    for index, threads in enumerate((1, 2)):
        _shard(tmp_path / f"shard{index}.duckdb", index, threads=threads)
    with pytest.raises(StoreError, match="run 'c' \\(pass stage0\\) has threads 2, .*shard0.duckdb has 1"):
        merge_stores(tmp_path / "all.duckdb", [tmp_path / "shard0.duckdb", tmp_path / "shard1.duckdb"])
    assert not (tmp_path / "all.duckdb").exists()


def test_a_prompt_is_written_once_per_run(tmp_path):
    row = {"run_id": "r", "prompt_id": "p", "category": "c", "split": "calib", "prompt_tokens": 3}
    with Store(tmp_path / "s.duckdb") as store:
        store.commit_unit("r", "prompt:p", {"prompts": [row]})
        with pytest.raises(Exception, match="(?i)duplicate|constraint"):  # a second unit with the same prompt
            store.commit_unit("r", "block=0:prompt:p", {"prompts": [row]})
        assert store.done_units("r") == {"prompt:p"}


def _whole_run(path, latency: float) -> str:
    """A store holding one whole, finished run c/stage0 (one process, one unit) timed at `latency`."""
    with Store(path) as store:
        run = store.start_run(_spec())
        rows = _timings(run, 1)
        for row in rows["stage0_timings"]:
            row["latency_us"] = latency + row["sample_idx"]
        store.commit_unit(run, "u=1", rows)
        store.finish_shard(run, 0)
    return run


def test_two_captures_of_one_run_are_refused_by_merge_and_nothing_is_written(tmp_path):
    """Two whole captures of one campaign share its run ids; a union would keep one capture's rows and
    drop the other's, so the merge is refused naming both stores and the run."""
    full, other, out = tmp_path / "full.duckdb", tmp_path / "r.duckdb", tmp_path / "m.duckdb"
    _whole_run(full, 1.0)
    _whole_run(other, 100.0)
    with pytest.raises(StoreError, match=rf"merge: {full} and {other} both hold run 'c' \(pass stage0\), "
                                         "captured separately"):
        merge_stores(out, [full, other])
    assert not out.exists() and not out.with_name(out.name + ".wal").exists()
    merge_stores(out, [full])
    before = out.read_bytes()
    with pytest.raises(StoreError, match=rf"{out} \(the merged store\) and {other} both hold run 'c'"):
        merge_stores(out, [other])
    assert out.read_bytes() == before
    assert merge_stores(out, [full])["stage0_timings"] == 3  # the same capture again: nothing doubled
    for index in range(2):  # shards of two captures of one sharded run are refused too
        _shard(tmp_path / f"a{index}.duckdb", index)
        _shard(tmp_path / f"b{index}.duckdb", index)
    with pytest.raises(StoreError, match=rf"a1.duckdb and {tmp_path / 'b1.duckdb'} both hold shard 1 of run 'c'"):
        merge_stores(tmp_path / "ab.duckdb", [tmp_path / "a0.duckdb", tmp_path / "a1.duckdb", tmp_path / "b1.duckdb"])
    assert not (tmp_path / "ab.duckdb").exists()


def test_copies_of_one_shard_merge_once_unless_their_rows_differ(tmp_path):
    """A shard copied while it ran and then finished merges with its copy (finished, nothing doubled);
    copies of one shard continued separately (the same unit measured twice) are refused."""
    import shutil

    shard0, early, shard1 = tmp_path / "shard0.duckdb", tmp_path / "early.duckdb", tmp_path / "shard1.duckdb"
    with Store(shard0) as store:
        run = store.start_run(_spec(shard_count=2), 0)
        store.commit_unit(run, "u=1", _timings(run, 1), 0)
    shutil.copy(shard0, early)  # shard 0 while it runs
    with Store(shard0) as store:
        store.commit_unit(run, "u=3", _timings(run, 3), 0)
        store.finish_shard(run, 0)
    _shard(shard1, 1)
    counts = merge_stores(tmp_path / "all.duckdb", [early, shard0, shard1])
    assert counts["stage0_timings"] == 9 and counts["units"] == 3
    with Store(tmp_path / "all.duckdb", read_only=True) as merged:
        assert merged.run_row(run)["status"] == "finished"
        assert merged.query("SELECT status FROM run_shards ORDER BY shard_index") == [("finished",), ("finished",)]
    forked = tmp_path / "forked.duckdb"
    shutil.copy(early, forked)
    with Store(forked) as store:  # the copy continued on its own: u=3 measured again
        rows = _timings(run, 3)
        rows["stage0_timings"][0]["latency_us"] = 50.0
        store.commit_unit(run, "u=3", rows, 0)
    with pytest.raises(StoreError, match=rf"{shard0} and {forked} hold different copies of one row of run 'c' "
                                         r"\(pass stage0\): units \(unit='u=3'\) has finished_at"):
        merge_stores(tmp_path / "fork.duckdb", [shard0, forked, shard1])
    assert not (tmp_path / "fork.duckdb").exists()


def test_shards_merge_into_the_rows_of_one_process(tmp_path):
    """Shards 0/3, 1/3, 2/3 of a run (every third unit each), merged: the data rows one process writes."""
    units = [1, 2, 3, 4, 5]
    with Store(tmp_path / "one.duckdb") as store:
        run = store.start_run(_spec())
        for u in units:
            store.commit_unit(run, f"u={u}", _timings(run, u))
        store.finish_shard(run, 0)
    shards = []
    for index in range(3):
        path = tmp_path / f"shard{index}.duckdb"
        with Store(path) as store:
            store.start_run(_spec(shard_count=3), index)
            for u in units[index::3]:
                store.commit_unit(run, f"u={u}", _timings(run, u), index)
            store.finish_shard(run, index)
        shards.append(path)
    merge_stores(tmp_path / "all.duckdb", shards)

    def rows(path):
        with Store(path, read_only=True) as store:
            return (store.query("SELECT * FROM stage0_timings ORDER BY u, sample_idx"),
                    store.query("SELECT unit, row_count FROM units ORDER BY unit"),
                    store.query("SELECT name, pass, status, params FROM runs"))

    assert rows(tmp_path / "all.duckdb") == rows(tmp_path / "one.duckdb")


def test_a_campaign_name_in_use_is_refused_with_each_pass_state(tmp_path):
    """An interrupted campaign (one pass finished, one unfinished, one not started) is not called
    finished: the refusal gives every pass's state and the options that continue or replace it."""
    with Store(tmp_path / "s.duckdb") as store:
        done = store.start_run(_spec(pass_name="capture"))
        store.finish_shard(done, 0)
        partial = store.start_run(_spec(pass_name="fixed"))
        store.commit_unit(partial, "u=1", {})
        passes = ("capture", "fixed", "stage0")
        with pytest.raises(StoreError, match=r"campaign 'c' already exists and is unfinished \(capture finished, "
                                             r"fixed unfinished \(1 units committed\), stage0 not started\); run the "
                                             r"same command with --resume .* or with --overwrite"):
            store.check_names_free("c", passes, 0, resume=False, overwrite=False)
        store.check_names_free("c", passes, 0, resume=True, overwrite=False)
        store.check_names_free("c", passes, 0, resume=False, overwrite=True)
        store.check_names_free("c", ("moe", "routing"), 0, resume=False, overwrite=False)  # none of them exists
        store.finish_shard(partial, 0)
        with pytest.raises(StoreError, match=r"already exists and is finished \(capture finished, fixed finished\)"):
            store.check_names_free("c", ("capture", "fixed"), 0, resume=False, overwrite=False)


def test_a_blank_duckdb_file_becomes_a_store_but_another_programs_database_is_kept(tmp_path):
    import duckdb

    from hybridspec.workbench.store import open_verified

    blank, other = tmp_path / "blank.duckdb", tmp_path / "other.duckdb"
    duckdb.connect(str(blank)).close()
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE orders (id INTEGER)")
    with open_verified(blank) as store:
        assert store.campaigns() == []
    with Store(blank, read_only=True) as store:  # now a store
        assert store.campaigns() == []
    with pytest.raises(StoreError, match="other.duckdb: not a hybridspec store .*1 other table"):
        open_verified(other)
    with duckdb.connect(str(other), read_only=True) as con:
        assert [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["orders"]


@pytest.mark.parametrize("name", ["prompts.jsonl", "rows.csv", "s.duckdb"])
def test_a_file_that_is_no_duckdb_database_is_refused_as_such_and_kept(tmp_path, name):
    """DuckDB opens an existing `*.jsonl` or `*.csv` that is no database as an in-memory one; the store
    names the file as no DuckDB file instead, for reading and for writing, and leaves it as it was."""
    from hybridspec.workbench.store import open_verified

    path = tmp_path / name
    path.write_text('{"id": "a", "category": "c", "split": "calib", "prompt": "x"}\n')
    before = path.read_bytes()
    for open_store in (lambda: Store(path, read_only=True), lambda: Store(path), lambda: open_verified(path)):
        with pytest.raises(StoreError, match=f"{name}: not a DuckDB file"):
            open_store()
    with pytest.raises(StoreError, match=f"{name}: not a DuckDB file"):
        merge_stores(tmp_path / "out.duckdb", [path])
    assert path.read_bytes() == before and not (tmp_path / "out.duckdb").exists()


def test_resolve_campaign_in_a_truncated_store_raises_only_store_error(tmp_path):
    """`fit`, `eval` and `estimate` name the campaign from the store before reading it whole: a store cut
    short anywhere, its `runs` blocks included, is a StoreError naming the file, or still names the
    campaign (the damage is then found by `Store.verify`)."""
    import os
    import shutil

    from hybridspec.workbench.store import resolve_campaign

    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        run = store.start_run(_spec(name="calib"))
        for u in range(1, 30):
            store.commit_unit(run, f"u={u}", _timings(run, u, n=500))
        store.finish_shard(run, 0)  # `runs` written again, after the data
    size, errors = os.path.getsize(path), 0
    for cut in range(1, 10):
        damaged = tmp_path / f"cut{cut}.duckdb"
        shutil.copy(path, damaged)
        os.truncate(damaged, size * cut // 10)
        try:
            assert resolve_campaign(damaged, None) == "calib"
        except StoreError as exc:
            assert str(damaged) in str(exc)
            errors += 1
    assert errors  # some cut reaches the blocks `runs` is read from
