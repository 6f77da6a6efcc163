"""`hybridspec export`: every table of a store (or of one campaign's runs) as Parquet or CSV files,
written by DuckDB's own `COPY … TO`. Columns, types and meanings are those of docs/store.md.

The files are written into a temporary directory beside `--out` and moved into it only once every
table is written, so a failed export leaves `--out` as it was."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from .schema import KEYS, SCHEMA_VERSION
from .store import Store, StoreError, require_store

FORMATS = {"parquet": "(FORMAT parquet)", "csv": "(FORMAT csv, HEADER true)"}


def export_store(db: Path, out: Path, *, fmt: str = "parquet", campaign: str | None = None) -> dict[str, int]:
    """Write `out/<table>.<fmt>` for `schema_version` and every table of the schema; rows per table.

    `campaign`: only the rows of the runs of that name (every pass, eval included)."""
    if fmt not in FORMATS:
        raise StoreError(f"--format {fmt!r}: parquet or csv")
    db, out = Path(db), Path(out)
    require_store(db)
    if out.exists() and not out.is_dir():
        raise StoreError(f"--out {out}: exists and is not a directory")
    with Store(db, read_only=True) as store:
        if store.version != SCHEMA_VERSION:
            raise StoreError(f"export: {db} has schema version {store.version}; open it once with this hybridspec "
                             f"(schema {SCHEMA_VERSION}) to migrate it")
        store.verify()
        where, args = "", []
        if campaign is not None:
            run_ids = [r for (r,) in store.query("SELECT run_id FROM runs WHERE name = ?", [campaign])]
            if not run_ids:
                known = ", ".join(repr(n) for (n,) in store.query("SELECT DISTINCT name FROM runs ORDER BY 1"))
                raise StoreError(f"{db}: no run named {campaign!r} (runs: {known or 'none'})")
            where, args = "WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [run_ids]
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            staging = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            staging.mkdir()
        except OSError as exc:
            raise StoreError(f"--out {out}: cannot create the directory ({exc.strerror})") from None
        try:
            counts = {}
            for table in ("schema_version", *KEYS):
                target = str(staging / f"{table}.{fmt}").replace("'", "''")
                filter_ = where if table != "schema_version" else ""
                store.con.execute(f"COPY (SELECT * FROM {table} {filter_}) TO '{target}' {FORMATS[fmt]}",
                                  args if filter_ else [])
                counts[table] = store.query(f"SELECT count(*) FROM {table} {filter_}", args if filter_ else [])[0][0]
            _publish(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return counts


def _publish(staging: Path, out: Path) -> None:
    """The written files into `out`: the directory renamed when `out` does not exist, else each file
    moved in (replacing a file of the same name, leaving the directory's other files)."""
    if not out.exists():
        staging.rename(out)
        return
    for path in sorted(staging.iterdir()):
        os.replace(path, out / path.name)
