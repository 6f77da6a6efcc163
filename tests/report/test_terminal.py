"""The terminal summary's policy table: its title names the side(s) its numbers come from."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from hybridspec.evaluation.offline import ESTIMATE_COLUMNS, MEASURED_COLUMNS
from hybridspec.report.result import ReportResult, Section
from hybridspec.report.terminal import summary


def _printed(policies: pl.DataFrame) -> str:
    section = Section("policies", "10. Policies: measured against estimated", tables={"policies": policies})
    console = Console(record=True, width=200)
    console.print(summary(ReportResult(Path("index.html"), Path("s.duckdb"), "c", None, [section])))
    return console.export_text()


def _one_sided(columns: tuple[str, ...]) -> pl.DataFrame:
    row = {"policy": "full", "category": "all", "rounds": 10, "emitted": 25, "al": 2.5, "mean_w": 16.0,
           "est_seconds": 0.5, "decode_seconds": 0.5, "tps": 50.0, "sr": 1.25}
    return pl.DataFrame([{c: row[c] for c in columns}])


@pytest.mark.parametrize("columns, side", [(MEASURED_COLUMNS, "measured"), (ESTIMATE_COLUMNS, "estimated")])
def test_a_one_sided_policy_table_names_its_side(columns, side):
    text = _printed(_one_sided(columns))
    assert f"policies, all categories ({side})" in text and "measured / estimated" not in text
    assert "2.5" in text and "50" in text  # one number per cell


def test_both_sides_are_titled_measured_then_estimated():
    metrics = {"al": 2.5, "mean_w": 16.0, "tps": 50.0, "sr": 1.25}
    sides = ("measured", "estimated", "diff")
    both = pl.DataFrame([{"policy": "full", "category": "all",
                          **{f"{m}_{side}": v for m, v in metrics.items() for side in sides}}])
    text = _printed(both)
    assert "policies, all categories (measured / estimated)" in text and "2.5 / 2.5" in text
