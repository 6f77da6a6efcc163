"""Sections 8–10: executed verification lengths (the paper's Figure 4), the policy table
(measured by `hybridspec eval` against estimated offline from the capture rounds) and the
metadata of every run and of the artifact."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ..evaluation.offline import compare_with_measured, estimate_policies, missing_categories, table_categories
from ..evaluation.tables import measured_table
from ..fitters.campaign import store_digest
from ..fitters.capture_rounds import unfinished_run
from . import plots
from .inputs import ReportInputs, describe_campaign, name_arg
from .result import Figure, Section

EVAL_HINT = ("run `hybridspec eval --db {db} --name {campaign} --artifact A` to measure the policies on the "
             "test prompts")


def _length_frame(inputs: ReportInputs) -> pl.DataFrame | None:
    """(series, w, rounds) of the executed lengths of the eval runs, one series per policy (per run
    and policy, `name / policy`, when the store holds an eval run of another campaign than the
    report's, so that it is never read as this campaign's); None without eval rounds. Only `eval`
    executes the policies' lengths: the capture pass always verifies W."""
    if not inputs.has_table("eval_rounds"):
        return None
    own_only = {r["name"] for r in inputs.eval_runs} == {inputs.campaign}
    label = "e.policy" if own_only else "r.name || ' / ' || e.policy"
    frame = inputs.frame(f"SELECT {label} AS series, e.w, count(*) AS rounds, min(e.rowid) AS first "
                         "FROM eval_rounds e JOIN runs r USING (run_id) GROUP BY ALL")
    if frame.is_empty():
        return None
    order = pl.col("first").min().over("series")  # policies in the order eval ran them (ar first), then w
    return frame.sort(order, "w").drop("first")


def lengths_section(inputs: ReportInputs) -> Section:
    section = Section("lengths", "8. Executed verification lengths")
    frame = _length_frame(inputs)
    if frame is None:
        hint = EVAL_HINT.format(db=inputs.db, campaign=name_arg(inputs.campaign))
        return section.missing(f"no eval rounds in the store, so no executed lengths per policy (the capture run "
                               f"always verifies W); {hint}")
    totals = frame.group_by("series", maintain_order=True).agg(
        rounds=pl.col("rounds").sum(), mean_w=(pl.col("w") * pl.col("rounds")).sum() / pl.col("rounds").sum())
    table = frame.join(totals.select("series", total=pl.col("rounds")), on="series")
    table = table.with_columns(fraction=pl.col("rounds") / pl.col("total")).drop("total")
    section.tables = {"histogram": table, "per_series": totals}
    max_w = int(max(frame["w"].max(), inputs.params.draft_len + 1 if inputs.params else 0))
    section.figures = [Figure("Fraction of rounds per executed length w (the paper's Figure 4)",
                              plots.lengths(table, totals, max_w))]
    section.headline = "; ".join(f"{s}: mean w over its rounds {m:.2f}"
                                 for s, m in totals.select("series", "mean_w").iter_rows())
    if chosen_eval_run(inputs.eval_runs, inputs.campaign) is None:
        others = ", ".join(sorted(repr(r["name"]) for r in inputs.eval_runs))
        section.partial(f"no eval run of {describe_campaign(inputs.campaign)}: the lengths of other campaigns' "
                        f"eval runs ({others}), labelled with their name")
    return section


def chosen_eval_run(eval_runs: list[dict], campaign: str | None) -> dict | None:
    """The campaign's own eval run (eval's --name is the campaign's), else None: another campaign's
    eval run measured other prompts or another artifact, so it is never shown in its place."""
    return next((r for r in eval_runs if r["name"] == campaign), None)


def policy_section(db: Path, artifact: Path | None, campaign: str | None, eval_runs: list[dict],
                   force: bool = False) -> Section:
    """Measured vs estimated per policy, for the report's campaign (`force`: with an artifact fitted
    for another model or drafter). Reads the store itself (through evaluation.offline), so it runs
    after the report's own connection is closed."""
    section = Section("policies", "10. Policies: measured against estimated")
    hint = EVAL_HINT.format(db=db, campaign=name_arg(campaign))
    run = chosen_eval_run(eval_runs, campaign)
    measured = estimates = None
    if run is None:
        others = sorted({r["name"] for r in eval_runs})
        elsewhere = f" (eval runs of other campaigns: {', '.join(map(repr, others))})" if others else ""
        section.partial(f"no eval run of {describe_campaign(campaign)}{elsewhere}: measured columns missing; {hint}")
    else:
        try:
            measured = measured_table(db, run["name"])
        except ValueError as exc:  # OfflineError: an eval run without usable requests
            section.partial(f"eval run {run['name']!r} unusable: {exc}")
    if artifact is None:
        section.partial("no artifact: the offline estimates need --artifact")
    else:
        policies = measured["policy"].unique(maintain_order=True).to_list() if measured is not None else None
        categories = table_categories(measured) if measured is not None else None  # "all" means the same on both
        try:
            estimates = estimate_policies(db, artifact, campaign=campaign, policies=policies, categories=categories,
                                          force=force)
        except ValueError as exc:  # OfflineError, ArtifactError, PolicyError: named in the message
            section.partial(f"offline estimates failed: {exc}")
    if measured is None and estimates is None:
        return section.missing(section.note)
    sides = {name: frame for name, frame in (("measured", measured), ("estimated", estimates)) if frame is not None}
    table = compare_with_measured(estimates, measured) if len(sides) == 2 else next(iter(sides.values()))
    if len(sides) == 2 and (missing := missing_categories(estimates, measured)):
        section.partial(f"the capture run has no rounds of {', '.join(missing)}: measured against estimated over "
                        f"{', '.join(table_categories(table))} only")
    overall = table.filter(pl.col("category") == "all")
    section.tables = {"all_categories": overall, "policies": table}
    if len(sides) == 2:
        section.tables.update(estimated=estimates, measured=measured)
    section.figures = [Figure(f"Per policy, over all categories: AL, TPS and SR ({' and '.join(sides)})",
                              plots.policies(overall, _plot_columns(table, list(sides))))]
    source = f"measured in eval run {run['name']!r}" if measured is not None else "estimated only"
    section.headline = f"{overall.height} policies, {source}"
    return section


def _plot_columns(table: pl.DataFrame, sides: list[str]) -> list[tuple[str, dict[str, str]]]:
    """(label, {side: column}) for AL, TPS and SR: a one-sided table has plain columns (`al`), the
    comparison has one per side."""
    out = []
    for metric, label in (("al", "AL (tokens / round)"), ("tps", "TPS (tokens / s)"), ("sr", "SR (× ar)")):
        if len(sides) == 1:
            out.append((label, {sides[0]: metric}))
            continue
        columns = {side: next(c for c in (f"{metric}_{side}", f"{side}_{metric}") if c in table.columns)
                   for side in sides}
        out.append((label, columns))
    return out


def metadata_section(inputs: ReportInputs) -> Section:
    section = Section("metadata", "11. Runs and artifact")
    runs = inputs.frame(
        "SELECT name, pass, status, device, dtype, backend, shard_count AS shards, started_at, finished_at, "
        "epoch(finished_at) - epoch(started_at) AS seconds, model, drafter, model_id, drafter_id, versions, params "
        "FROM runs ORDER BY started_at")
    runs = runs.with_columns(pl.col("versions", "params").map_elements(_compact, return_dtype=pl.String))
    section.tables = {"runs": runs.select("name", "pass", "status", "device", "dtype", "backend", "shards",
                                          "started_at", "finished_at", "seconds"),
                      "identity": runs.select("name", "pass", "model", "model_id", "drafter", "drafter_id"),
                      "params": runs.select("name", "pass", "versions", "params")}
    section.values = {"campaign": inputs.campaign, "campaign_note": inputs.campaign_note, "store": str(inputs.db)}
    if inputs.artifact_meta is not None:  # shown whichever model it was fitted for: its ids say which
        meta = {k: v for k, v in inputs.artifact_meta.items() if k != "diagnostics"}
        meta["warnings"] = "; ".join(inputs.artifact_meta.get("diagnostics", {}).get("warnings", [])) or "none"
        section.tables["artifact"] = pl.DataFrame({"field": list(meta), "value": [_compact(v) for v in meta.values()]})
        section.values.update(rho_tokens_per_s=meta["rho"], s_us_per_token=meta["s"] * 1e6,
                              eta_us_per_expert=meta["eta"] * 1e6, fixed_cost_ms=meta["fixed_cost"] * 1e3,
                              content_sha256=meta["content_sha256"])
        _check_identity(section, inputs)
    else:
        section.partial(inputs.missing_artifact("the artifact's metadata"))
    for row in inputs.runs.values():
        if (unfinished := unfinished_run(inputs.store, row)) is not None:
            section.partial(f"{unfinished}; the sections built on it show what it wrote so far")
    if runs.is_empty():
        return section.missing(f"{inputs.db} holds no runs")
    section.figures = [Figure("Wall-clock duration of each run", plots.runs(section.tables["runs"]))]
    section.headline = f"{runs.height} runs; {inputs.campaign_note}"
    return section


def _check_identity(section: Section, inputs: ReportInputs) -> None:
    if inputs.other_model:
        section.partial(inputs.other_model)
    digest = store_digest(inputs.db)
    section.values["store_digest_matches"] = digest == inputs.artifact_meta["store_digest"]
    if digest != inputs.artifact_meta["store_digest"]:
        section.note = (f"{section.note}; " if section.note else "") + (
            "the store changed since the fit (its digest is not the artifact's store_digest; e.g. eval runs "
            "were added)")


def _compact(value) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
