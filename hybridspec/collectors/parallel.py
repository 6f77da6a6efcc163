"""A campaign over several processes.

`--nproc N` (data parallel): N processes each run shard i/N of every pass (`--shard i/N`) into their
own store beside the campaign's (`shard_store`), one GPU each on CUDA; the rows of this campaign's
runs are then merged into the campaign's store (`merge_stores`: identical rows once), which
therefore holds the rows one process would have written (timings aside). The shard stores stay:
`--resume` continues them after a crash.

`--tp N` (tensor parallel): N ranks run the runtime together (`runtime/tensor_parallel.py`); every
rank runs the same passes on the same units, rank 0 alone opens the store (`LeaderStore`) and tells
the others what it answered (`FollowerStore`), so a resumed run skips the same units on every rank.
"""

from __future__ import annotations

import dataclasses
import pickle
import tempfile
from pathlib import Path

import torch

from ..runtime.session import check_tensor_parallel
from ..runtime.tensor_parallel import launch, rank, run_processes, share
from ..workbench.store import RunSpec, Store, StoreError, check_writable, merge_stores, open_verified, run_id_for
from .common import CaptureConfig


def shard_store(db: Path, index: int, count: int) -> Path:
    """Where shard `index` of `count` of a `--nproc` campaign writes: beside `db`."""
    db = Path(db)
    return db.with_name(f"{db.stem}.shard-{index}-of-{count}{db.suffix or '.duckdb'}")


class LeaderStore:
    """Rank 0's store under tensor parallelism: the store itself, whose answers that the other ranks
    need (the run's id, the units already committed) are shared with them."""

    def __init__(self, store: Store):
        self.store = store

    def start_run(self, spec: RunSpec, shard_index: int = 0, **options) -> str:
        return share(self.store.start_run(spec, shard_index, **options))

    def done_units(self, run_id: str) -> set[str]:
        return share(self.store.done_units(run_id))

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def __enter__(self) -> "LeaderStore":
        self.store.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.store.__exit__(*exc)


class FollowerStore:
    """The store as a rank other than 0 sees it: rank 0's answers, nothing written."""

    def check_names_free(self, *args, **options) -> None:
        pass

    def start_run(self, spec: RunSpec, shard_index: int = 0, **options) -> str:
        return share()

    def done_units(self, run_id: str) -> set[str]:
        return share()

    def commit_unit(self, run_id: str, unit: str, rows: dict[str, list[dict]], shard_index: int = 0) -> int:
        return sum(len(r) for r in rows.values())

    def finish_shard(self, run_id: str, shard_index: int) -> None:
        pass

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        return {}

    def run_row(self, run_id: str) -> dict:
        return {"status": "followed rank 0"}

    def __enter__(self) -> "FollowerStore":
        return self

    def __exit__(self, *exc) -> None:
        pass


def campaign_store(config: CaptureConfig):
    """The store of this process's campaign (a context manager): the store file, or under tensor
    parallelism rank 0's store shared (`LeaderStore`) and, on the other ranks, `FollowerStore`."""
    if rank() != 0:
        return FollowerStore()
    check_writable(config.db)
    store = open_verified(config.db)  # refuses a damaged store, or one of a newer schema
    return LeaderStore(store) if config.tp > 1 else store


def run_tensor_parallel(config: CaptureConfig) -> list:
    """The campaign on `config.tp` ranks (spawned, or this process one of torchrun's); rank 0's
    summaries (None on torchrun's other ranks)."""
    check_tensor_parallel(config.model, config.tp, config.expert_parallel)
    return launch(_campaign_rank, config.tp, config.device, config)


def _campaign_rank(config: CaptureConfig) -> list:
    from rich.console import Console

    from .campaign import NullReporter, run_campaign
    from .progress import RichReporter

    if rank() != 0:
        return run_campaign(config, NullReporter())
    with RichReporter(Console()) as reporter:
        return run_campaign(config, reporter)


def run_data_parallel(config: CaptureConfig) -> list:
    """`--nproc N`: shard i/N in process i (GPU i on CUDA) into `shard_store(db, i, N)`, then every shard
    store merged into `config.db`; one summary per pass (units and rows of the merged run)."""
    from .campaign import PassSummary

    count = config.nproc
    if config.device == "cuda" and torch.cuda.device_count() < count:
        raise StoreError(f"--nproc {count} on cuda needs {count} GPUs, this machine has {torch.cuda.device_count()}")
    if config.device.startswith("cuda:"):
        raise StoreError(f"--nproc {count} runs process i on GPU i: give --device cuda, not {config.device}")
    check_writable(config.db)
    run_ids = [run_id_for(config.name, name) for name in config.passes]
    if Path(config.db).is_file():
        _check_campaign_store(config, run_ids)
    shards = [dataclasses.replace(config, nproc=1, shard=(i, count), db=shard_store(config.db, i, count))
              for i in range(count)]
    with tempfile.TemporaryDirectory() as tmp:  # each shard's summaries, read once all have ended
        run_processes(_shard_main, count, (shards, Path(tmp)))
        missing = [i for i in range(count) if not (Path(tmp) / f"shard{i}.pkl").is_file()]
        if missing:  # a spawned process ends quietly, without a result, only on Ctrl-C (SIGINT)
            raise KeyboardInterrupt(f"--nproc {count}: shard(s) {missing} were interrupted")
        per_shard = [pickle.loads((Path(tmp) / f"shard{i}.pkl").read_bytes()) for i in range(count)]
    if config.overwrite and Path(config.db).is_file():
        with Store(config.db) as store:
            for run_id in run_ids:
                store.delete_run(run_id)
    merge_stores(config.db, [s.db for s in shards], run_ids)  # this campaign's runs only
    summaries = []
    with Store(config.db, read_only=True) as store:
        for p, name in enumerate(config.passes):
            parts = [s[p] for s in per_shard]
            run_id = parts[0].run_id
            counts = {t: n for t, n in store.counts(run_id).items() if n and t not in ("runs", "units")}
            summaries.append(PassSummary(name, run_id, store.run_row(run_id)["status"], sum(s.units for s in parts),
                                         sum(s.resumed for s in parts), sum(s.committed for s in parts), counts,
                                         max(s.seconds for s in parts)))
    return summaries


def _check_campaign_store(config: CaptureConfig, run_ids: list[str]) -> None:
    """The campaign's existing store, read-only (created or migrated only by the merge): intact, not
    newer than this code, the run names free, and a resumed run captured in as many shards."""
    count = config.nproc
    with Store(config.db, read_only=True) as store:
        store.verify()
        store.check_names_free(config.name, config.passes, 0, resume=config.resume, overwrite=config.overwrite)
        for name, run_id in zip(config.passes, run_ids):
            row = store.run_row(run_id)
            if row is not None and not config.overwrite and row["shard_count"] != count:
                raise StoreError(f"{config.db}: run {config.name!r} (pass {name}) was captured in {row['shard_count']} "
                                 f"shard(s); --nproc {count} would capture it in {count}: resume it with --nproc "
                                 f"{row['shard_count']}, or use --overwrite or another --name")


def _shard_main(index: int, shards: list[CaptureConfig], folder: Path) -> None:
    from rich.console import Console

    from .campaign import run_campaign
    from .progress import RichReporter

    config = shards[index]
    if config.device == "cuda":
        torch.cuda.set_device(index)  # `cuda` (the runs' device) is this process's GPU
    with RichReporter(Console(force_terminal=False)) as reporter:  # one plain line per unit
        summaries = run_campaign(config, reporter)
    (folder / f"shard{index}.pkl").write_bytes(pickle.dumps(summaries))
