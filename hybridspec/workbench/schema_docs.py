"""`docs/store.md`, generated from the schema module: the tables and columns of a freshly migrated
store (names, types, nullability and keys as DuckDB reports them) beside `TABLE_DOCS` and
`COLUMN_DOCS`. A test compares the file with `store_markdown()`, so the two cannot drift.

    python -m hybridspec.workbench.schema_docs > docs/store.md
"""

from __future__ import annotations

from .schema import COLUMN_DOCS, KEYS, SCHEMA_VERSION, TABLE_DOCS
from .store import Store

HEADER = f"""# The calibration store (schema version {SCHEMA_VERSION})

One DuckDB file per calibration campaign (DESIGN B.7), written by `hybridspec capture` and
`hybridspec eval`, read by `fit`, `report` and `export`. Generated from
`hybridspec/workbench/schema.py` by `python -m hybridspec.workbench.schema_docs > docs/store.md`;
`tests/workbench/test_schema_docs.py` fails when this file and the schema differ.

Lengths `w`, `u` count the anchor; `position` is the draft position i = 1…D; latencies are
microseconds; timestamps are UTC. Every table but `schema_version` has a PRIMARY KEY on its natural
key (marked key), so a row cannot be written twice. `hybridspec export --db STORE --format
parquet|csv --out DIR` writes each table as one file.
"""


def migrated_columns() -> dict[str, list[tuple[str, str, bool]]]:
    """table → [(column, DuckDB type, nullable)] of a store migrated to the current version."""
    with Store(":memory:") as store:
        rows = store.query("SELECT table_name, column_name, data_type, is_nullable FROM duckdb_columns() "
                           "WHERE schema_name = 'main' AND NOT internal ORDER BY table_name, column_index")
    out: dict[str, list[tuple[str, str, bool]]] = {}
    for table, column, dtype, nullable in rows:
        out.setdefault(table, []).append((column, dtype, bool(nullable)))
    return out


def store_markdown() -> str:
    """The whole of docs/store.md."""
    columns = migrated_columns()
    parts = [HEADER]
    for table in ("schema_version", *KEYS):
        docs, key = COLUMN_DOCS[table], KEYS.get(table, ())
        parts.append(f"\n## `{table}`\n\n{TABLE_DOCS[table]}\n\n| column | type | | meaning |\n|---|---|---|---|\n")
        for column, dtype, nullable in columns[table]:
            flags = "key" if column in key else ("" if nullable else "not null")
            parts.append(f"| `{column}` | {dtype} | {flags} | {docs[column]} |\n")
    return "".join(parts)


def undocumented() -> list[str]:
    """`table.column` of the migrated schema without documentation, and documentation of no column."""
    columns = {t: {c for c, _, _ in cols} for t, cols in migrated_columns().items()}
    documented = {t: set(cols) for t, cols in COLUMN_DOCS.items()}
    return sorted({f"{t}.{c}" for t, cs in columns.items() for c in cs - documented.get(t, set())}
                  | {f"{t}.{c}" for t, cs in documented.items() for c in cs - columns.get(t, set())}
                  | {t for t in columns.keys() ^ TABLE_DOCS.keys()})


if __name__ == "__main__":  # pragma: no cover
    print(store_markdown(), end="")
