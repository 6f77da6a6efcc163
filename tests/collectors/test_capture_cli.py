"""`hybridspec capture` / `merge` end to end, with real subprocesses: a SIGKILL mid-pass then
`--resume` gives the rows of an uninterrupted run; two shards (`--nproc 2`) merged give the
single-process rows; bad input is refused before any model is loaded."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hybridspec.cli import app
from hybridspec.collectors import campaign
from hybridspec.collectors.common import ALL_PASSES, CaptureConfig
from hybridspec.workbench.schema import DATA_TABLES, EVAL_TABLES, KEYS, PROFILE_TABLES, SCHEMA_VERSION
from hybridspec.workbench.store import RunSpec, Store

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # the tests' single thread
runner = CliRunner()


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    gen = torch.Generator().manual_seed(5)
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = []
    for i in range(8):
        ids = torch.randint(0, 97, (4 + 3 * i,), generator=gen).tolist()
        lines.append(json.dumps({"id": f"q{i}", "category": "ab"[i % 2], "split": "calib", "prompt_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _args(model: Path, prompts: Path, db: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--drafter", "random", "--prompts", str(prompts), "--db", str(db),
            "--name", "t", *extra]


def _subprocess(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "hybridspec", "capture", *args]


def deterministic_rows(path: Path) -> dict[str, list[tuple]]:
    """Every table's rows without latencies, timestamps, hosts or shard numbers, in key order."""
    out = {}
    with Store(path, read_only=True) as store:
        for table in DATA_TABLES:
            columns = [c for (c,) in store.query("SELECT column_name FROM information_schema.columns WHERE "
                                                 "table_name = ? ORDER BY ordinal_position", [table])
                       if not c.endswith("_us") and c not in ("finished_at", "shard_index")]
            rows = store.query(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {', '.join(KEYS[table])}")
            out[table] = [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]
        out["runs"] = store.query("SELECT run_id, name, pass, status, model_id, drafter_id, params, shard_count "
                                  "FROM runs ORDER BY run_id")
    return out


def _reference(qwen35_dir, prompt_file, db: Path, **config) -> dict[str, list[tuple]]:
    campaign.run_campaign(CaptureConfig(model=str(qwen35_dir), drafter="random", prompts=prompt_file, db=db,
                                        name="t", **config))
    with Store(db, read_only=True) as store:  # every run row records threads, host and versions
        for threads, cpu, versions in store.query("SELECT threads, host_cpu, versions FROM runs"):
            assert threads == 1 and cpu and {"numpy", "scipy", "statsmodels", "polars"} <= set(json.loads(versions))
    return deterministic_rows(db)


def _kill_after_commits(cmd: list[str], commits: int, timeout: float = 120.0) -> list[str]:
    """Start `cmd`, SIGKILL it as soon as it reports `commits` committed units; its output lines."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, out = 0, []
    try:
        while seen < commits:
            line = lines.get(timeout=timeout)
            out.append(line)
            seen += " committed " in line
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, out
    return out


def test_sigkill_then_resume_equals_an_uninterrupted_run(qwen35_dir, prompt_file, tmp_path):
    args = _args(qwen35_dir, prompt_file, tmp_path / "killed.duckdb", "--passes", "capture", "--max-new-tokens", "24")
    _kill_after_commits(_subprocess(args), commits=2)
    with Store(tmp_path / "killed.duckdb", read_only=True) as store:  # what the kill left behind
        done = store.query("SELECT count(*) FROM units")[0][0]
        assert 2 <= done < 8
        assert store.query("SELECT count(DISTINCT prompt_id) FROM rounds")[0][0] == done  # whole prompts only
        assert store.query("SELECT status FROM runs") == [("running",)]
    refused = runner.invoke(app, ["capture", *args])
    assert refused.exit_code == 2 and "unfinished" in refused.output
    resumed = subprocess.run(_subprocess([*args, "--resume"]), capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{done} already committed" in resumed.stdout
    reference = _reference(qwen35_dir, prompt_file, tmp_path / "ref.duckdb", passes=("capture",), max_new_tokens=24)
    assert deterministic_rows(tmp_path / "killed.duckdb") == reference
    assert len(reference["draft_positions"]) == 15 * len(reference["rounds"]) > 0


def test_nproc_two_shards_merged_equal_one_process(qwen35_dir, prompt_file, tmp_path):
    """`--nproc 2`: two processes run shards 0/2 and 1/2 into their own stores beside --db (half of
    every run each), merged into --db: the rows of one process."""
    db = tmp_path / "all.duckdb"
    args = _args(qwen35_dir, prompt_file, db, "--passes", "all", "--quick", "--categories", "a", "--max-new-tokens",
                 "24", "--nproc", "2")  # 2 prompts: one per shard
    run = subprocess.run(_subprocess(args),
                         capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    shard0 = deterministic_rows(tmp_path / "all.shard-0-of-2.duckdb")
    assert {status for (_, _, _, status, *_) in shard0["runs"]} == {"running"}  # half of every run
    reference = _reference(qwen35_dir, prompt_file, tmp_path / "ref.duckdb", passes=ALL_PASSES, quick=True,
                           max_new_tokens=24, shard=(0, 1), categories=("a",))
    got = deterministic_rows(db)
    # the reference is one shard of one; the merged runs are 2 shards, otherwise identical
    assert [r[:7] for r in got["runs"]] == [r[:7] for r in reference["runs"]]
    assert {r[3] for r in got["runs"]} == {"finished"} and {r[7] for r in got["runs"]} == {2}
    for table in DATA_TABLES:
        assert got[table] == reference[table], table
        assert 0 < len(got[table]) or table in EVAL_TABLES + PROFILE_TABLES  # every table `all` writes is filled
    again = subprocess.run(_subprocess([*args, "--resume"]),
                           capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and "already committed" in again.stdout, again.stdout + again.stderr
    assert deterministic_rows(db) == got  # a finished campaign resumed: nothing run again, nothing doubled


# ---------------------------------------------------------------- bad input, refused before loading
@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(campaign, "open_session", refuse)


def _error(args: list[str]) -> str:
    result = runner.invoke(app, ["capture", *args])
    assert result.exit_code == 2, result.output
    return "".join(result.output.split())  # rich wraps long paths anywhere


def _has(output: str, text: str) -> bool:
    return "".join(text.split()) in output


def test_bad_input_is_named_before_any_model_loads(no_model_load, qwen35_dir, prompt_file, tmp_path):
    base = _args(qwen35_dir, prompt_file, tmp_path / "s.duckdb")
    assert _has(_error([*base[:-4], "--db", str(tmp_path / "no" / "s.duckdb"), "--name", "t"]), "does not exist")
    assert _has(_error([*base, "--shard", "2/2"]), "--shard '2/2'")
    assert _has(_error([*base, "--shard", "one"]), "--shard 'one'")
    assert _has(_error([*base, "--passes", "capture,bogus"]), "unknown pass 'bogus'")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(prompt_file.read_text().splitlines()[0] + "\n{not json\n")
    assert _has(_error(_args(qwen35_dir, bad, tmp_path / "s.duckdb")), f"{bad}:2: invalid JSON")
    bad.write_text(prompt_file.read_text().splitlines()[0] + "\n\n" + json.dumps(
        {"id": "far", "category": "a", "split": "calib", "prompt_ids": [1, 10**6]}) + "\n")
    assert _has(_error(_args(qwen35_dir, bad, tmp_path / "s.duckdb")),
                f"{bad}:3: prompt 'far' has ids [1000000] outside the vocabulary")


def test_a_model_or_drafter_directory_without_a_usable_config_is_one_line(no_model_load, qwen35_dir, prompt_file,
                                                                           tmp_path):
    """A directory given as --model or --drafter that holds no config.json (or one of the other kind) is
    named in one line, before it is hashed and before any store is created."""
    empty, db = tmp_path / "empty", tmp_path / "s.duckdb"
    empty.mkdir()
    rest = ["--prompts", str(prompt_file), "--db", str(db), "--name", "t"]
    for pair, message in ((["--model", str(qwen35_dir), "--drafter", str(empty)], f"{empty}: no config.json"),
                          (["--model", str(empty), "--drafter", "random"], f"{empty}: no config.json"),
                          (["--model", str(qwen35_dir), "--drafter", str(qwen35_dir)], "not a DFlash drafter")):
        assert _has(_error([*pair, *rest]), message)
        assert not db.exists()


def test_a_model_refused_while_loading_leaves_no_new_store_and_an_existing_one_as_it_was(monkeypatch, qwen35_dir,
                                                                                        prompt_file, tmp_path):
    """A pair refused only as it loads (a drafter tapping layers the target lacks, too little memory):
    the store this invocation created is removed again; an existing store keeps every byte."""
    from hybridspec.runtime.config import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("drafter: target_layer_ids [99] outside the target's 4 layers")

    monkeypatch.setattr(campaign, "open_session", refuse)
    db = tmp_path / "s.duckdb"
    assert _has(_error(_args(qwen35_dir, prompt_file, db)), "target_layer_ids [99]")
    assert not db.exists() and not (tmp_path / "s.duckdb.wal").exists()
    with Store(db) as store:
        spec = RunSpec(name="other", pass_name="capture", model_id="m", drafter_id="d", device="cpu",
                       dtype="float32", backend="torch")
        store.finish_shard(store.start_run(spec), 0)
    before = db.read_bytes()
    assert _has(_error(_args(qwen35_dir, prompt_file, db)), "target_layer_ids [99]")
    assert db.read_bytes() == before


def test_newer_schema_and_reused_names_are_refused(no_model_load, qwen35_dir, prompt_file, tmp_path):
    newer = tmp_path / "newer.duckdb"
    with Store(newer) as store:
        store.con.execute("INSERT INTO schema_version VALUES (7, now())")
    message = _error(_args(qwen35_dir, prompt_file, newer))
    assert _has(message, "schema version 7") and _has(message, f"schema version {SCHEMA_VERSION}")
    used = tmp_path / "used.duckdb"
    with Store(used) as store:
        spec = RunSpec(name="t", pass_name="moe", model_id="m", drafter_id="d", device="cpu", dtype="float32",
                       backend="torch")
        store.finish_shard(store.start_run(spec), 0)
    message = _error([*_args(qwen35_dir, prompt_file, used), "--passes", "moe"])
    assert _has(message, "run 't' (pass moe) already exists and is finished") and _has(message, "--overwrite")
    # a run captured in one process cannot be resumed by --nproc 2 (its shards would not merge)
    message = _error([*_args(qwen35_dir, prompt_file, used), "--passes", "moe", "--nproc", "2", "--resume"])
    assert _has(message, "was captured in 1 shard(s); --nproc 2 would capture it in 2")
    assert _has(_error([*_args(qwen35_dir, prompt_file, used), "--nproc", "2", "--tp", "2"]), "choose one")
    assert _has(_error([*_args(qwen35_dir, prompt_file, used), "--nproc", "2", "--shard", "0/2"]), "excludes --shard 0/2")
    assert _has(_error([*_args(qwen35_dir, prompt_file, used), "--expert-parallel"]), "it needs --tp 2 or more")


def test_the_cli_hands_its_options_to_run_campaign(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(campaign, "run_campaign", lambda config, reporter: seen.setdefault("config", config) and [])
    result = runner.invoke(app, ["capture", "--db", str(tmp_path / "x.duckdb"), "--name", "n", "--passes",
                                 "routing,capture", "--quick", "--resume", "--shard", "1/3", "--max-new-tokens", "9",
                                 "--split", "test", "--device", "cpu", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert seen["config"] == CaptureConfig(db=tmp_path / "x.duckdb", name="n", passes=("capture", "routing"),
                                           quick=True, resume=True, shard=(1, 3), max_new_tokens=9, split="test",
                                           dtype="bfloat16")


def test_resume_into_a_damaged_store_is_refused_and_writes_nothing(no_model_load, qwen35_dir, prompt_file, tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        spec = RunSpec(name="t", pass_name="stage0", model_id="m", drafter_id="d", device="cpu", dtype="float32",
                       backend="torch")
        run = store.start_run(spec)
        for b in range(40):
            store.commit_unit(run, f"block={b}", {"stage0_timings": [
                {"run_id": run, "u": u, "sample_idx": b * 100 + i, "latency_us": 1.0, "context_tokens": 8}
                for u in range(1, 17) for i in range(100)]})
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    message = _error([*_args(qwen35_dir, prompt_file, db), "--passes", "stage0", "--resume"])
    assert _has(message, f"{db}: damaged store")
    assert db.read_bytes() == data[: len(data) // 2]  # nothing written


def test_the_parallel_layout_reaches_the_config(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(campaign, "run_campaign",
                        lambda config, reporter=None: seen.setdefault("config", config) and [])
    result = runner.invoke(app, ["capture", "--db", str(tmp_path / "x.duckdb"), "--tp", "2", "--expert-parallel"])
    assert result.exit_code == 0, result.output
    assert (seen["config"].tp, seen["config"].expert_parallel) == (2, True)


def test_a_runs_parameters_name_its_parallel_layout():
    """One process: the pass's parameters alone; `--tp 2`: its world size; `--tp 2 --expert-parallel`:
    the layout too (costs measured on another layout are another run, refused on resume)."""
    from types import SimpleNamespace

    collector = SimpleNamespace(params=lambda ctx: {"a": 1})
    params = [campaign.run_params(collector, SimpleNamespace(config=CaptureConfig(tp=tp, expert_parallel=ep)))
              for tp, ep in ((1, False), (2, False), (2, True))]
    assert params == [{"a": 1}, {"a": 1, "tensor_parallel": 2}, {"a": 1, "tensor_parallel": 2, "expert_parallel": True}]


def test_threads_reach_the_config(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(campaign, "run_campaign", lambda config, reporter: seen.setdefault("config", config) and [])
    assert runner.invoke(app, ["capture", "--db", str(tmp_path / "x.duckdb"), "--threads", "2"]).exit_code == 0
    assert seen["config"].threads == 2
    assert runner.invoke(app, ["capture", "--threads", "0"]).exit_code == 2


def test_a_refused_prompt_file_leaves_no_store_and_an_existing_one_as_it_was(no_model_load, qwen35_dir,
                                                                             prompt_file, tmp_path):
    empty, bad, test_only = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl", tmp_path / "test.jsonl"
    empty.write_text("")
    bad.write_text(prompt_file.read_text().splitlines()[0] + "\n{not json\n")
    test_only.write_text(prompt_file.read_text().replace('"calib"', '"test"'))
    cases = [(empty, [], f"{empty}: no prompts"), (bad, [], f"{bad}:2: invalid JSON"),
             (test_only, [], f"{test_only}: no prompts of split 'calib'"),
             (prompt_file, ["--categories", "zz"], "'zz' not in split 'calib'")]
    db = tmp_path / "s.duckdb"
    for prompts, extra, message in cases:
        assert _has(_error([*_args(qwen35_dir, prompts, db), *extra]), message)
        assert not db.exists()
    with Store(db) as store:
        spec = RunSpec(name="t", pass_name="capture", model_id="m", drafter_id="d", device="cpu", dtype="float32",
                       backend="torch")
        store.start_run(spec)
    before = db.read_bytes()
    for prompts, extra, message in cases:
        assert _has(_error([*_args(qwen35_dir, prompts, db), "--resume", *extra]), message)
        assert db.read_bytes() == before


def test_a_timed_run_resumed_with_other_threads_or_graphs_is_refused(qwen35_dir, prompt_file, tmp_path, monkeypatch):
    """The stage0 run records `graphs` in its parameters and the thread count in its row; a resume that
    would time with another thread count or --graphs setting is refused, naming both values."""
    import torch

    from hybridspec.workbench.store import StoreError

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # set_threads writes it; restored after the test
    db, threads = tmp_path / "s.duckdb", torch.get_num_threads()
    config = CaptureConfig(model=str(qwen35_dir), drafter="random", prompts=prompt_file, db=db, name="t",
                           passes=("stage0",), quick=True, threads=1)
    try:
        campaign.run_campaign(config)
        with Store(db, read_only=True) as store:
            (params, recorded), = store.query("SELECT params, threads FROM runs")
        assert json.loads(params)["graphs"] is True and recorded == 1
        with pytest.raises(StoreError, match="its threads is 1, this invocation's is 2"):
            campaign.run_campaign(dataclasses.replace(config, resume=True, threads=2))
        with pytest.raises(StoreError, match="its params.graphs is True, this invocation's is False"):
            campaign.run_campaign(dataclasses.replace(config, resume=True, graphs=False))
        assert campaign.run_campaign(dataclasses.replace(config, resume=True))[0].committed == 0
    finally:
        torch.set_num_threads(threads)


def test_capture_config_checks_passes_and_shards_as_the_parsers_do():
    from hybridspec.collectors.common import CaptureConfigError, parse_passes, parse_shard

    with pytest.raises(CaptureConfigError, match="--passes capture,bogus: unknown pass 'bogus'"):
        CaptureConfig(passes=("capture", "bogus"))
    with pytest.raises(CaptureConfigError, match="--passes '': unknown pass '\\(none\\)'"):
        parse_passes("")
    with pytest.raises(CaptureConfigError, match="--shard 2/2: need n ≥ 1 and 0 ≤ i < n"):
        CaptureConfig(shard=(2, 2))
    with pytest.raises(CaptureConfigError, match="--shard '2/2': need n ≥ 1 and 0 ≤ i < n"):
        parse_shard("2/2")
    assert parse_passes("all,profile") == (*ALL_PASSES, "profile") and parse_shard("1/3") == (1, 3)


# ---------------------------------------------------------------- Ctrl-C, and a campaign name in use
def test_ctrl_c_keeps_the_committed_units_and_resume_finishes_the_campaign(qwen35_dir, prompt_file, tmp_path,
                                                                            monkeypatch):
    """Ctrl-C in the second unit of stage0: `CaptureInterrupted` naming the passes reached, the capture
    pass and stage0's first unit kept; the same command is refused with each pass's state (the campaign
    unfinished, not the capture pass "finished" alone), and with --resume it gives the rows of an
    uninterrupted campaign."""
    from hybridspec.collectors.stage0 import Stage0Pass
    from hybridspec.workbench.store import StoreError

    class Interrupted(Stage0Pass):
        def collect(self, ctx, block):
            if block == 1:
                raise KeyboardInterrupt
            return super().collect(ctx, block)

    db = tmp_path / "s.duckdb"
    config = CaptureConfig(model=str(qwen35_dir), drafter="random", prompts=prompt_file, db=db, name="t",
                           passes=("capture", "stage0", "moe"), quick=True, categories=("a",), max_new_tokens=24)
    with monkeypatch.context() as patch:
        patch.setitem(campaign.PASSES, "stage0", Interrupted)
        with pytest.raises(campaign.CaptureInterrupted) as caught:
            campaign.run_campaign(config)
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.reached == ("capture", "stage0")
    assert caught.value.message(["capture", "--db", str(db), "--name", "t"]) == (
        f"capture interrupted: the units committed so far are kept in {db}; continue with: "
        f"hybridspec capture --db {db} --name t --resume")
    with Store(db, read_only=True) as store:
        assert store.query("SELECT pass, status FROM runs ORDER BY pass") == [("capture", "finished"),
                                                                             ("stage0", "running")]
        assert store.query("SELECT unit FROM units WHERE unit LIKE 'block=%'") == [("block=0",)]
    with pytest.raises(StoreError, match=r"campaign 't' already exists and is unfinished \(capture finished, stage0 "
                                         r"unfinished \(1 units committed\), moe not started\); run the same command "
                                         "with --resume"):
        campaign.run_campaign(config)
    summaries = campaign.run_campaign(dataclasses.replace(config, resume=True))
    assert [(s.name, s.status, s.resumed) for s in summaries] == [("capture", "finished", 2),
                                                                  ("stage0", "finished", 1), ("moe", "finished", 0)]
    reference = _reference(qwen35_dir, prompt_file, tmp_path / "ref.duckdb", passes=config.passes, quick=True,
                           categories=("a",), max_new_tokens=24)
    assert deterministic_rows(db) == reference


def test_the_continuation_of_an_interrupted_capture():
    """--resume added once; with --overwrite, the passes reached continue with --resume and the others
    are replaced by a second command (--resume would keep their earlier runs)."""
    config = CaptureConfig(passes=("capture", "fixed", "stage0"), overwrite=True)

    def continuation(argv, reached, **changes):
        return campaign.CaptureInterrupted(dataclasses.replace(config, **changes), reached).continuation(argv)

    assert continuation(["capture", "--db", "my store.duckdb"], (), overwrite=False) == (
        "hybridspec capture --db 'my store.duckdb' --resume")
    assert continuation(["capture", "--resume"], ("capture",), overwrite=False) == "hybridspec capture --resume"
    argv = ["capture", "--passes", "all", "--overwrite", "--quick"]
    assert continuation(argv, ("capture", "fixed")) == (
        "hybridspec capture --quick --passes capture,fixed --resume, then "
        "hybridspec capture --overwrite --quick --passes stage0")
    assert continuation(["capture", "--passes=all", "--overwrite"], ("capture", "fixed", "stage0")) == (
        "hybridspec capture --passes=all --resume")
    assert continuation(["capture", "--overwrite"], ()) == (
        "hybridspec capture --overwrite --passes capture,fixed,stage0")
    several = campaign.CaptureInterrupted(dataclasses.replace(config, nproc=2), None)  # reached: not known
    assert several.message(["capture", "--overwrite", "--nproc", "2"]).endswith(
        "started again, not continued (they do not report the passes they reached): "
        "hybridspec capture --overwrite --nproc 2")


def test_ctrl_c_during_capture_exits_130_keeping_whole_units(qwen35_dir, prompt_file, tmp_path):
    """SIGINT to `hybridspec capture` after two commits: exit status 130, the unit in progress rolled
    back, and every unit committed before it kept."""
    args = _args(qwen35_dir, prompt_file, tmp_path / "s.duckdb", "--passes", "capture", "--max-new-tokens", "24")
    proc = subprocess.Popen(_subprocess(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=ROOT)
    seen = 0
    for line in proc.stdout:
        seen += " committed (" in line
        if seen == 2:
            proc.send_signal(signal.SIGINT)
            break
    proc.stdout.read()
    assert proc.wait(timeout=120) == 130, proc.stderr.read()
    assert "capture interrupted" in proc.stderr.read()  # and how to continue
    with Store(tmp_path / "s.duckdb", read_only=True) as store:
        done = store.query("SELECT count(*) FROM units")[0][0]
        assert 2 <= done < 8 and store.query("SELECT status FROM runs") == [("running",)]
        assert store.query("SELECT count(DISTINCT prompt_id) FROM rounds")[0][0] == done  # whole prompts only
