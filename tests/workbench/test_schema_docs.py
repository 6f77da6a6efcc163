"""docs/store.md is generated from the schema module: it must equal the generator's output, and
every column of a migrated store must be documented (and nothing else)."""

from pathlib import Path

from hybridspec.workbench.schema_docs import store_markdown, undocumented

DOCS = Path(__file__).resolve().parents[2] / "docs" / "store.md"


def test_every_column_is_documented_and_nothing_else():
    assert undocumented() == []


def test_docs_store_md_matches_the_schema():
    assert DOCS.read_text(encoding="utf-8") == store_markdown(), (
        "docs/store.md is out of date: python -m hybridspec.workbench.schema_docs > docs/store.md")
