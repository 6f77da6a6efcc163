"""The calibration store: one DuckDB file per campaign (DESIGN B.7; tables in `schema.py`).

Nothing lost, nothing doubled:
- a unit's rows (a prompt's rounds `prompt:…`, a measurement block of timings `block=b` or
  `block=b:prompt:…`, a policy's request `policy=…:prompt:…`) and its "unit done" marker are
  written in ONE transaction (`commit_unit`), so a killed process leaves either the whole unit or
  nothing, and `--resume` skips exactly the units whose marker exists;
- every table has a PRIMARY KEY on its natural key, so a duplicate cannot be written at all;
- a run's id is a hash of (campaign name, pass), so shards written by separate processes or hosts
  carry the same run id and `merge_stores` is a union of rows; two captures of one run (or of one
  shard) share that id too, and a merge refuses them rather than keep one and drop the other;
- a run resumed or merged must match its identity (`identity_keys`): model, drafter, device, dtype,
  backend, parameters, shards and, for the passes whose latencies are fitted or reported
  (`TIMED_PASSES`), the thread count and GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np

from .schema import DATA_TABLES, KEYS, MIGRATIONS, SCHEMA_VERSION


class StoreError(ValueError):
    """A store that cannot be used as asked (path, schema version, run-name conflict)."""


class NotAStore(StoreError):
    """A DuckDB file without hybridspec's tables, opened to be read; `empty`: it has no tables at all
    (a writer may make it a store; one holding other tables is another program's database)."""

    def __init__(self, message: str, *, empty: bool):
        super().__init__(message)
        self.empty = empty


def run_id_for(name: str, pass_name: str) -> str:
    """Deterministic run identity: the same (campaign name, pass) in every shard and every process."""
    return hashlib.sha256(f"{name}\0{pass_name}".encode()).hexdigest()[:16]


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # stored as UTC TIMESTAMP


def require_store(db: Path, option: str = "--db") -> None:
    """StoreError naming the option and the path unless `db` is a file: a store to read must exist
    (opening a missing path would create an empty one)."""
    if not Path(db).is_file():
        raise StoreError(f"{option} {db}: no such store")


def check_writable(path: Path) -> None:
    """Fail early (before any model is loaded) when `path` cannot be created or written."""
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"--db {path}: is a directory, expected a DuckDB file path")
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise StoreError(f"--db {path}: the file is not readable and writable")
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise StoreError(f"--db {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"--db {path}: directory {parent} is not writable")


@dataclass(frozen=True)
class RunSpec:
    """What identifies a run besides its name: a resumed run must match it exactly."""

    name: str
    pass_name: str
    model_id: str
    drafter_id: str | None
    device: str
    dtype: str
    backend: str
    params: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    model: str | None = None
    drafter: str | None = None
    shard_count: int = 1
    threads: int | None = None  # torch CPU threads of the process (part of a timed pass's identity)
    host_cpu: str | None = None
    host_gpu: str | None = None

    @property
    def run_id(self) -> str:
        return run_id_for(self.name, self.pass_name)


_IDENTITY = ("model_id", "drafter_id", "device", "dtype", "backend", "params", "shard_count")
TIMED_PASSES = ("fixed", "stage0", "moe", "eval")  # their latencies are fitted or reported
_TIMING_IDENTITY = ("threads", "host_gpu")  # latencies of another thread count or GPU are another run


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def identity_keys(pass_name: str) -> tuple[str, ...]:
    """The `runs` columns a resumed or merged run must match (`params` compared key by key)."""
    return _IDENTITY + (_TIMING_IDENTITY if pass_name in TIMED_PASSES else ())


def identity_conflict(have: dict, want: dict, pass_name: str) -> tuple[str, object, object] | None:
    """The first identity field where two runs differ, as (name, have's value, want's value), or None.
    A parameter is named `params.<key>` (`absent` where one run has no such key); rows may hold
    `params` as JSON text (a `runs` row) or as a dict (`asdict(RunSpec)`)."""
    for key in identity_keys(pass_name):
        a, b = have.get(key), want.get(key)
        if key == "params":
            a, b = (json.loads(v) if isinstance(v, str) else v for v in (a, b))
            for name in sorted(a.keys() | b.keys()):
                if a.get(name, _ABSENT) != b.get(name, _ABSENT):
                    return f"params.{name}", a.get(name, _ABSENT), b.get(name, _ABSENT)
        elif a != b:
            return key, a, b
    return None


class Store:
    """An open store file. Use as a context manager; `Store(path)` creates and migrates it. Every read
    fetches its whole result (`fetchall`): DuckDB refuses to register a unit's rows (`commit_unit`)
    while a result of the connection is partly read."""

    def __init__(self, path: Path | str, *, read_only: bool = False):
        self.path = Path(path)
        _check_duckdb_file(self.path)
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            raise StoreError(f"{self.path}: cannot open the store ({_one_line(exc)})") from None
        try:
            self.version = self._migrate(read_only)
        except duckdb.Error as exc:  # a damaged catalog or schema_version table
            self.con.close()
            raise StoreError(f"{self.path}: damaged store: {_one_line(exc)}") from None
        except BaseException:
            self.con.close()
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    # ---------------------------------------------------------------- schema
    def _migrate(self, read_only: bool) -> int:
        """Apply every migration above the file's version; refuse a file newer than this code."""
        has_table = self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'").fetchall()[0][0]
        current = self.con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] if has_table else 0
        current = current or 0
        if current == 0 and read_only:  # a DuckDB file hybridspec never wrote: no `runs` to read
            tables = self.con.execute("SELECT count(*) FROM duckdb_tables()").fetchall()[0][0]
            raise NotAStore(f"{self.path}: not a hybridspec store (a DuckDB file without hybridspec's tables"
                            + (f", holding {tables} other table(s)" if tables else "")
                            + "; `hybridspec capture` writes one)", empty=not tables)
        if current > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: store schema version {current} is newer than this hybridspec's "
                             f"schema version {SCHEMA_VERSION}; upgrade hybridspec to read it")
        if current == SCHEMA_VERSION or read_only:
            return current
        with self._transaction():
            if not has_table:
                self.con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMP)")
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    self.con.execute(statement)
                self.con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, _now()])
        return SCHEMA_VERSION

    def _transaction(self):
        store = self

        class _Tx:
            def __enter__(self):
                store.con.execute("BEGIN TRANSACTION")

            def __exit__(self, kind, value, tb):
                store.con.execute("COMMIT" if kind is None else "ROLLBACK")

        return _Tx()

    def verify(self) -> "Store":
        """Read every row of every table once, so that a file damaged in its data blocks (truncated,
        overwritten) is refused here, naming the file and DuckDB's message, before anything is
        fitted or written. DuckDB checks each block's checksum as it reads it."""
        tables = [t for (t,) in self.con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal "
                                                 "ORDER BY table_name").fetchall()]
        for table in tables:
            try:
                self.con.execute(f"SELECT count(*), max(hash(t)) FROM {table} AS t").fetchall()
            except duckdb.Error as exc:
                raise StoreError(f"{self.path}: damaged store (table {table}): {_one_line(exc)}") from None
        return self

    def campaigns(self) -> list[str]:
        """Names of the calibration campaigns (runs of any pass but eval), sorted."""
        return [n for (n,) in self.con.execute("SELECT DISTINCT name FROM runs WHERE pass <> 'eval' "
                                               "ORDER BY name").fetchall()]

    # ---------------------------------------------------------------- runs
    def run_row(self, run_id: str) -> dict | None:
        cur = self.con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
        rows = cur.fetchall()
        return dict(zip([c[0] for c in cur.description], rows[0])) if rows else None

    def shard_status(self, run_id: str, shard_index: int) -> str | None:
        row = self.con.execute("SELECT status FROM run_shards WHERE run_id = ? AND shard_index = ?",
                               [run_id, shard_index]).fetchall()
        return row[0][0] if row else None

    def run_state(self, name: str, pass_name: str, shard_index: int) -> str | None:
        """The state of run (name, pass) as this shard left it: `finished`, `unfinished (N units
        committed)`, or None when the store has no such run."""
        run_id = run_id_for(name, pass_name)
        if self.run_row(run_id) is None:
            return None
        if self.shard_status(run_id, shard_index) == "finished":
            return "finished"
        units = self.con.execute("SELECT count(*) FROM units WHERE run_id = ?", [run_id]).fetchall()[0][0]
        return f"unfinished ({units} units committed)"

    def check_name_free(self, name: str, pass_name: str, shard_index: int, *, resume: bool, overwrite: bool) -> None:
        """Refuse to reuse a run's name without --resume or --overwrite (cheap: before any model loads)."""
        self.check_names_free(name, (pass_name,), shard_index, resume=resume, overwrite=overwrite)

    def check_names_free(self, name: str, passes: tuple[str, ...], shard_index: int, *, resume: bool,
                         overwrite: bool) -> None:
        """`check_name_free` for every pass of a campaign, in one error that gives each pass's state
        (a finished pass beside unfinished or missing ones is an interrupted campaign, not a finished one)."""
        if resume or overwrite:
            return
        states = {p: self.run_state(name, p, shard_index) for p in passes}
        taken = [p for p, state in states.items() if state is not None]
        if not taken:
            return
        if len(passes) == 1:
            raise StoreError(f"{self.path}: run {name!r} (pass {taken[0]}) already exists and is "
                             f"{states[taken[0]]}; pass --resume to continue it or --overwrite to replace it")
        listed = ", ".join(f"{p} {state or 'not started'}" for p, state in states.items())
        whole = "finished" if all(s == "finished" for s in states.values()) else "unfinished"
        raise StoreError(f"{self.path}: campaign {name!r} already exists and is {whole} ({listed}); run the same "
                         "command with --resume to continue it (committed units are kept and skipped) or with "
                         "--overwrite to replace its runs")

    def start_run(self, spec: RunSpec, shard_index: int = 0, *, resume: bool = False,
                  overwrite: bool = False) -> str:
        """Create (or, with `resume`, reopen; with `overwrite`, replace) the run of `spec`; its id."""
        run_id = spec.run_id
        self.check_name_free(spec.name, spec.pass_name, shard_index, resume=resume, overwrite=overwrite)
        existing = self.run_row(run_id)
        with self._transaction():
            if existing is not None and overwrite:
                self._delete_rows(run_id)
                existing = None
            if existing is None:
                self.con.execute(
                    "INSERT INTO runs (run_id, name, pass, status, model_id, drafter_id, model, drafter, device, dtype, "
                    "backend, versions, params, shard_count, started_at, threads, host_cpu, host_gpu) VALUES (?, ?, ?, "
                    "'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [run_id, spec.name, spec.pass_name, spec.model_id, spec.drafter_id, spec.model, spec.drafter,
                     spec.device, spec.dtype, spec.backend, json.dumps(spec.versions, sort_keys=True),
                     json.dumps(spec.params, sort_keys=True), spec.shard_count, _now(), spec.threads, spec.host_cpu,
                     spec.host_gpu])
            else:
                self._check_identity(existing, spec)
            if self.shard_status(run_id, shard_index) is None:
                self.con.execute("INSERT INTO run_shards VALUES (?, ?, ?, 'running', ?, ?, NULL)",
                                 [run_id, shard_index, spec.shard_count, socket.gethostname(), _now()])
        return run_id

    def delete_run(self, run_id: str) -> None:
        """Remove a run and all its rows (what `--overwrite` replaces); nothing when there is none."""
        with self._transaction():
            self._delete_rows(run_id)

    def _delete_rows(self, run_id: str) -> None:
        for table in (*DATA_TABLES, "run_shards", "runs"):
            self.con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    def _check_identity(self, existing: dict, spec: RunSpec) -> None:
        conflict = identity_conflict(existing, asdict(spec), spec.pass_name)
        if conflict is not None:
            key, have, wanted = conflict
            raise StoreError(f"{self.path}: cannot resume run {spec.name!r} (pass {spec.pass_name}): its {key} "
                             f"is {have!r}, this invocation's is {wanted!r}; use another --name or --overwrite")

    def finish_shard(self, run_id: str, shard_index: int) -> None:
        """Mark this shard finished; the run is finished once every one of its shards is."""
        with self._transaction():
            self.con.execute("UPDATE run_shards SET status = 'finished', finished_at = ? "
                             "WHERE run_id = ? AND shard_index = ? AND status <> 'finished'",
                             [_now(), run_id, shard_index])
            self._refresh_run_status(run_id)

    def _refresh_run_status(self, run_id: str) -> None:
        n, done, first, last = self.con.execute(
            "SELECT max(r.shard_count), count(*) FILTER (WHERE s.status = 'finished'), min(s.started_at), "
            "max(s.finished_at) FROM runs r JOIN run_shards s USING (run_id) WHERE run_id = ?", [run_id]).fetchall()[0]
        finished = n is not None and done == n
        self.con.execute("UPDATE runs SET status = ?, started_at = least(started_at, ?), finished_at = ? "
                         "WHERE run_id = ?", ["finished" if finished else "running", first, last if finished else None,
                                              run_id])

    # ---------------------------------------------------------------- units
    def done_units(self, run_id: str) -> set[str]:
        return {u for (u,) in self.con.execute("SELECT unit FROM units WHERE run_id = ?", [run_id]).fetchall()}

    def commit_unit(self, run_id: str, unit: str, rows: dict[str, list[dict]], shard_index: int = 0) -> int:
        """Write a unit's rows {table: [row dict]} and its done marker in one transaction; rows written.
        A row whose key exists (`prompts` included: a prompt belongs to one unit of its run) is an
        error, and the unit writes nothing."""
        total = sum(len(r) for r in rows.values())
        bad = [t for t in rows if t not in DATA_TABLES or t == "units"]
        if bad:
            raise StoreError(f"commit_unit: {bad[0]!r} is not a data table")
        # DuckDB scans a dict of numpy arrays; register them outside the transaction so that a failed
        # insert leaves nothing to clean up inside an aborted transaction
        frames = {t: f"_unit_{t}" for t, r in rows.items() if r}
        for table, view in frames.items():
            self.con.register(view, {c: _column([r[c] for r in rows[table]]) for c in rows[table][0]})
        try:
            with self._transaction():
                for table, view in frames.items():
                    names = ", ".join(rows[table][0])
                    self.con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {view}")
                self.con.execute("INSERT INTO units VALUES (?, ?, ?, ?, ?)",
                                 [run_id, unit, shard_index, total, _now()])
        finally:
            for view in frames.values():
                self.con.unregister(view)
        return total

    # ---------------------------------------------------------------- reading
    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        return self.con.execute(sql, params or []).fetchall()

    def frame(self, sql: str, params: list | None = None):
        """A query's result as a polars DataFrame (analyses read through SQL / polars)."""
        import polars as pl

        cur = self.con.execute(sql, params or [])
        return pl.DataFrame(cur.fetchall(), schema=[c[0] for c in cur.description], orient="row")

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        """Rows per data table (of one run, or all)."""
        where, args = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
        return {t: self.con.execute(f"SELECT count(*) FROM {t} {where}", args).fetchall()[0][0]
                for t in ("runs", *DATA_TABLES)}


def open_verified(path: Path) -> Store:
    """Open a store to extend it; an existing file is first read whole (read-only, `Store.verify`), so a
    damaged one is refused before anything (a migration, a run row) is written into it."""
    if Path(path).is_file():
        try:
            with Store(path, read_only=True) as existing:
                existing.verify()
        except NotAStore as exc:  # a DuckDB file with no tables becomes a store; another program's is kept
            if not exc.empty:
                raise
    return Store(path)


DUCKDB_MAGIC = (8, b"DUCK")  # a DuckDB file's main header holds these bytes at this offset


def _check_duckdb_file(path: Path) -> None:
    """StoreError unless `path` is absent or a DuckDB file. DuckDB itself opens an existing file named
    `*.json`, `*.jsonl`, `*.csv`, … that is no database as an empty in-memory one (refused read-only
    with a message about in-memory databases), so a prompt file given as --db is named here."""
    if not path.is_file():
        return
    offset, magic = DUCKDB_MAGIC
    try:
        with path.open("rb") as f:
            head = f.read(offset + len(magic))
    except OSError as exc:
        raise StoreError(f"{path}: cannot open the store ({exc.strerror})") from None
    if head[offset:] != magic:
        raise StoreError(f"{path}: not a DuckDB file, so not a hybridspec store (`hybridspec capture` writes one)")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def resolve_campaign(db: Path, name: str | None, *, fallback: str | None = None) -> str:
    """`name`, or the store's only campaign when `name` is None. With several campaigns (or none)
    and no name: `fallback` when given, else a StoreError naming them."""
    if name is not None:
        return name
    names = []
    if Path(db).is_file():
        with Store(db, read_only=True) as store:
            try:
                names = store.campaigns()
            except duckdb.Error as exc:  # damaged in the blocks of `runs` (the whole file is verified later)
                raise StoreError(f"{db}: damaged store (table runs): {_one_line(exc)}") from None
    if len(names) == 1:
        return names[0]
    if fallback is not None:
        return fallback
    if not names:
        raise StoreError(f"{db}: holds no calibration campaign; record one first (`hybridspec capture --db {db}`)")
    raise StoreError(f"{db}: name the campaign with --name (campaigns in the store: "
                     f"{', '.join(repr(n) for n in names)})")


def _column(values: list) -> np.ndarray:
    """A column for DuckDB: typed when it has no nulls, an object array (None → NULL) otherwise."""
    if any(v is None for v in values):
        return np.array(values, dtype=object)
    return np.array(values)


def merge_stores(out: Path, inputs: list[Path], run_ids: list[str] | None = None) -> dict[str, int]:
    """Union of the rows of shard stores into `out` (created or extended); rows per table after.
    `run_ids`: only those runs' rows (every run when None).

    Runs present in several stores must agree on their identity (`identity_keys`); a run's status is
    recomputed from its shards. A shard present in several stores (`out` included) must be copies of
    one capture of it (the same host and start time in `run_shards`, the same rows under every key;
    one copy may be further along than another): it is kept once, finished if any copy is. Two
    captures of one run or shard (a run's id is a hash of its name and pass, so two whole captures of
    a campaign share it), or copies whose rows differ, are refused naming both stores, since a union
    would keep one capture's rows and silently drop the other's. Nothing is written unless all of it
    can be: every input (and an existing `out`) is opened, its schema checked and read whole
    (`Store.verify`), every run's identity and every shared shard compared before `out` is created or
    opened; then all inputs are merged in one transaction (an `out` of an older schema is migrated
    first), and a new `out` whose merge fails is removed."""
    out = Path(out)
    check_writable(out)
    if not inputs:
        raise StoreError("merge: no input stores")
    inputs = list(dict.fromkeys(Path(p) for p in inputs))
    runs: dict[str, tuple[str, dict]] = {}  # run id → (the store it was first seen in, its row)
    merged_label = f"{out} (the merged store)"
    if out.is_file():
        with Store(out, read_only=True) as target:
            _check_runs(target.verify(), merged_label, None, runs)
    for path in inputs:
        if not path.is_file():
            raise StoreError(f"merge: {path}: no such store")
        if path.resolve() == out.resolve():
            raise StoreError(f"merge: {path} is the output store")
        with Store(path, read_only=True) as source:  # a newer schema refused here
            if source.version != SCHEMA_VERSION:
                raise StoreError(f"merge: {path} has schema version {source.version}; open it once with this "
                                 f"hybridspec (schema {SCHEMA_VERSION}) to migrate it")
            _check_runs(source.verify(), str(path), run_ids, runs)
    stores = ([(merged_label, out)] if out.is_file() else []) + [(str(p), p) for p in inputs]
    _check_copies(stores, run_ids, runs)
    created = not out.exists()
    try:
        with Store(out) as target:
            _merge_all(target, inputs, run_ids)
            return target.counts()
    except BaseException:
        if created:  # nothing of a failed merge stays
            for leftover in (out, out.with_name(out.name + ".wal")):
                leftover.unlink(missing_ok=True)
        raise


def _check_runs(store: Store, where: str, run_ids: list[str] | None, runs: dict[str, tuple[str, dict]]) -> None:
    """Every run of `store` (of `run_ids`) against the run of the same id seen first in another store."""
    cur = store.con.execute("SELECT * FROM runs ORDER BY run_id")
    columns = [c[0] for c in cur.description]
    for row in (dict(zip(columns, values)) for values in cur.fetchall()):
        if run_ids is not None and row["run_id"] not in run_ids:
            continue
        first = runs.setdefault(row["run_id"], (where, row))
        conflict = identity_conflict(first[1], row, row["pass"])
        if conflict is not None:
            key, mine, theirs = conflict
            raise StoreError(f"merge: {where}: run {row['name']!r} (pass {row['pass']}) has {key} {theirs!r}, "
                             f"{first[0]} has {mine!r}")


def _check_copies(stores: list[tuple[str, Path]], run_ids: list[str] | None, runs: dict[str, tuple[str, dict]]
                  ) -> None:
    """The runs held by more than one of `stores` [(label, path)]: each shard one capture (`run_shards`:
    the same host, start and shard count in every store holding it), and every key of every data table
    one row. Read-only (the stores attached to an in-memory database)."""
    con = duckdb.connect()
    try:
        for index, (_, path) in enumerate(stores):
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS s{index} (READ_ONLY)")
        tables = {}  # table → the attached stores that have it (an `out` of an older schema lacks some)
        for table, database in con.execute("SELECT table_name, database_name FROM duckdb_tables() "
                                           "ORDER BY database_name").fetchall():
            tables.setdefault(table, []).append(database)
        selected, params = ("", {}) if run_ids is None else ("WHERE run_id IN (SELECT unnest($ids))", {"ids": run_ids})
        union = " UNION ALL ".join(f"SELECT run_id, '{s}' AS src FROM {s}.runs {selected}" for s in tables["runs"])
        shared = [r for (r,) in con.execute(f"SELECT run_id FROM ({union}) GROUP BY run_id HAVING count(*) > 1 "
                                            "ORDER BY run_id", params).fetchall()]
        if not shared:
            return
        labels = {f"s{index}": label for index, (label, _) in enumerate(stores)}
        _check_shard_copies(con, _rows_of(tables["run_shards"], "run_shards"), shared, labels, runs)
        for table in DATA_TABLES:
            if table in tables:
                _check_row_copies(con, _rows_of(tables[table], table), table, shared, labels, runs)
    finally:
        con.close()


def _rows_of(databases: list[str], table: str) -> str:
    """SQL: the rows of `table` of the shared runs in each of the attached `databases`, with its name `src`."""
    return " UNION ALL BY NAME ".join(f"SELECT *, '{s}' AS src FROM {s}.{table} WHERE run_id IN (SELECT "
                                      "unnest($shared))" for s in databases)


def _check_shard_copies(con, rows: str, shared: list[str], labels: dict[str, str], runs: dict) -> None:
    """A shard of a shared run in two stores must be one capture: the same host, start and count."""
    first: dict[tuple, tuple] = {}
    for run_id, index, count, host, started, src in con.execute(
            f"SELECT run_id, shard_index, shard_count, host, started_at, src FROM ({rows}) "
            "ORDER BY run_id, shard_index, src", {"shared": shared}).fetchall():
        have = first.setdefault((run_id, index), (count, host, started, src))
        if have[:3] == (count, host, started):
            continue
        row = runs[run_id][1]
        what = (f"run {row['name']!r} (pass {row['pass']})" if count == 1 and have[0] == 1
                else f"shard {index} of run {row['name']!r} (pass {row['pass']})")
        raise StoreError(f"merge: {labels[have[3]]} and {labels[src]} both hold {what}, captured separately "
                         f"(started {have[2]} UTC on {have[1]}, and {started} UTC on {host}): a merge joins the "
                         "shards of one capture, and a union would keep one capture's rows and drop the other's; "
                         "merge one of them, or capture the other under another --name")


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN equals NaN, as in DuckDB's DISTINCT


def _check_row_copies(con, rows: str, table: str, shared: list[str], labels: dict[str, str], runs: dict) -> None:
    """Every key of `table` in the shared runs holds one row, whichever stores hold it."""
    key = ", ".join(KEYS[table])
    found = con.execute(f"SELECT {key} FROM (SELECT DISTINCT * EXCLUDE (src) FROM ({rows})) GROUP BY {key} "
                        f"HAVING count(*) > 1 ORDER BY {key} LIMIT 1", {"shared": shared}).fetchall()
    if not found:
        return
    match = " AND ".join(f"{k} = ${k}" for k in KEYS[table])
    cur = con.execute(f"SELECT * FROM ({rows}) WHERE {match} ORDER BY src",
                      {"shared": shared, **dict(zip(KEYS[table], found[0]))})
    columns = [c[0] for c in cur.description if c[0] != "src"]
    copies = [dict(zip([c[0] for c in cur.description], values)) for values in cur.fetchall()]
    a = copies[0]
    first_difference = next(((c, k) for c in copies[1:] for k in columns if not _same(a[k], c[k])), None)
    if first_difference is None:  # apart to DISTINCT only (0.0 and -0.0): one copy is kept, nothing lost
        return
    b, differs = first_difference
    row = runs[found[0][0]][1]
    where = ", ".join(f"{k}={v!r}" for k, v in zip(KEYS[table][1:], found[0][1:]))
    raise StoreError(f"merge: {labels[a['src']]} and {labels[b['src']]} hold different copies of one row of run "
                     f"{row['name']!r} (pass {row['pass']}): {table} ({where}) has {differs} {a[differs]!r} in the "
                     f"first and {b[differs]!r} in the second; a union would keep one and drop the other")


def _merge_all(target: Store, inputs: list[Path], run_ids: list[str] | None) -> None:
    """Every input's rows (of `run_ids`) into `target` in one transaction. A key already written is
    skipped: `_check_copies` made its copies equal, except a `runs` row (its identity checked, its
    status recomputed here) and a shard's status, finished if any copy's is."""
    con = target.con
    selected = "run_id IN (SELECT unnest(?))"
    where, also, params = (f"WHERE {selected}", f"AND s.{selected}", [run_ids]) if run_ids is not None else ("", "", [])
    sources = []
    try:
        for index, path in enumerate(inputs):
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS src{index} (READ_ONLY)")
            sources.append(f"src{index}")
        with target._transaction():
            merged = set()
            for source in sources:
                for table in KEYS:
                    con.execute(f"INSERT OR IGNORE INTO {table} BY NAME SELECT * FROM {source}.{table} {where}", params)
                con.execute(f"UPDATE run_shards AS t SET status = 'finished', finished_at = s.finished_at FROM "
                            f"{source}.run_shards AS s WHERE t.run_id = s.run_id AND t.shard_index = s.shard_index "
                            f"AND s.status = 'finished' AND t.status <> 'finished' {also}",
                            params)
                merged |= {r for (r,) in con.execute(f"SELECT run_id FROM {source}.runs {where}", params).fetchall()}
            for run_id in sorted(merged):
                target._refresh_run_status(run_id)
    finally:
        for source in sources:
            con.execute(f"DETACH {source}")
