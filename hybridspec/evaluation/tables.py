"""The measured Table 1 of an eval run (DESIGN A.10), read from its `eval_requests` rows, and the
column group (TPS, SR, AL, w) every policy table shows."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ..workbench.store import Store, StoreError, run_id_for
from .offline import pooled_table

EVAL_PASS = "eval"  # the pass name of `hybridspec eval` runs
COLUMNS = (("tps", "TPS", "{:.1f}"), ("sr", "SR", "{:.2f}×"), ("al", "AL", "{:.2f}"), ("mean_w", "w", "{:.2f}"))


def measured_from_store(store: Store, run_id: str, policies: list[str]) -> pl.DataFrame:
    """Table 1 of an eval run (offline.MEASURED_COLUMNS): pooled over each category's requests, SR
    against `ar` on the same prompts; `decode_seconds` is the requests' Σ measured decode seconds."""
    sums = store.frame(
        "SELECT e.policy, e.category, sum(e.rounds) AS rounds, sum(e.emitted_tokens) AS emitted, "
        "sum(e.mean_w * e.rounds) AS w_sum, sum(e.decode_seconds) AS seconds, "
        "sum(a.emitted_tokens) AS ref_emitted, sum(a.decode_seconds) AS ref_seconds "
        "FROM eval_requests e JOIN eval_requests a ON a.run_id = e.run_id AND a.prompt_id = e.prompt_id "
        "AND a.policy = 'ar' WHERE e.run_id = ? GROUP BY e.policy, e.category", [run_id])
    return pooled_table(sums, policies, seconds_column="decode_seconds")


def measured_table(db: Path, run_name: str) -> pl.DataFrame:
    """Table 1 (offline.MEASURED_COLUMNS) of the eval run `run_name` (eval's --name) in the store."""
    with Store(db, read_only=True) as store:
        run = store.run_row(run_id_for(run_name, EVAL_PASS))
        if run is None:
            raise StoreError(f"{db}: no eval run named {run_name!r}")
        return measured_from_store(store, run["run_id"], json.loads(run["params"])["policies"])
