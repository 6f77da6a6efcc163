"""Fit a whole calibration campaign read from the store (DESIGN A.9): the acceptance model,
C_tgt, s, η, the routing tables and ρ. Returns plain numbers and arrays; the CLI turns them into
the frozen artifact.

Only finished runs are fitted. Rounds cut short by EOS or the output limit are excluded from every
acceptance fit; the held-out rounds are those of every fifth calibration prompt (split by prompt,
deterministic; `capture_rounds`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..workbench.runinfo import file_digest, software_versions
from ..workbench.store import Store, run_id_for
from .acceptance import AcceptanceFitter, held_out_report
from .capture_rounds import CaptureRounds, read_capture_rounds, run_label, unfinished_run
from .cost import QuadraticCost, Slope
from .rate import dinkelbach
from .routing import RoutingTables


@dataclass
class CampaignFit:
    draft_len: int
    lengths: tuple[int, ...]
    acceptance: AcceptanceFitter
    cost: QuadraticCost
    stage0: Slope
    moe: Slope
    routing: RoutingTables
    rho: float
    iterations: list[dict]
    model_id: str
    drafter_id: str
    device: str
    store_digest: str
    metrics: dict
    warnings: list[str] = field(default_factory=list)
    converged: bool = True  # Dinkelbach reached its fixed point
    convergence_note: str = ""  # what to do when it did not
    versions: dict = field(default_factory=software_versions)  # of the fitting process
    checks: list = field(default_factory=list)  # checks.Check, set by export.fit_artifact

    def diagnostics(self) -> dict:
        return {"acceptance": self.metrics,
                "acceptance_model": {"isotonic": self.acceptance.isotonic_used_,
                                     "cv_log_loss": self.acceptance.cv_log_loss_,
                                     "single_class": self.acceptance.single_class_},
                "dinkelbach": self.iterations, "warnings": self.warnings,
                "dinkelbach_converged": self.converged, "dinkelbach_note": self.convergence_note,
                "versions": self.versions,
                "cost": {"coef": self.cost.coef_.tolist(), "conf_int": self.cost.conf_int_.tolist(),
                         "r2": self.cost.r2_,
                         "constrained": self.cost.constrained_, "statistic": "median per length",
                         "cells": self.cost.cells_},
                "s": {"slope": self.stage0.slope_, "conf_int": self.stage0.conf_int_, "r2": self.stage0.r2_,
                      "cells": self.stage0.cells_},
                "eta": {"slope": self.moe.slope_, "conf_int": self.moe.conf_int_, "r2": self.moe.r2_,
                        "correlation": self.moe.correlation_, "cells": self.moe.cells_},
                "routing_cell_counts": self.routing.cell_counts_.tolist(),
                "routing_fitted_cells": self.routing.fitted_cells_.tolist()}


class FitError(ValueError):
    """A store that lacks what the fit needs; the message names the run and table."""


def campaign_run(store: Store, name: str, pass_name: str) -> dict:
    """The `runs` row of campaign `name`'s `pass_name` run (FitError when it is absent or unfinished)."""
    row = store.run_row(run_id_for(name, pass_name))
    if row is None:
        raise FitError(f"campaign {name!r} has no {pass_name} run in {store.path}")
    unfinished = unfinished_run(store, row)
    if unfinished is not None:
        raise FitError(f"{unfinished}; only finished runs are fitted")
    return row


TIMED_PASSES = ("fixed", "stage0", "moe")  # their latencies form one cost model


def _check_one_setting(name: str, runs: dict[str, dict]) -> None:
    """The campaign's runs measure one model (one drafter where one is used), and its timed passes
    one device setting: a cost model joined from a CPU pass and a GPU pass, or from two GPUs, fits
    neither (FitError naming both runs and what differs)."""
    def differ(passes, fields, what):
        first = runs[passes[0]]
        for other in passes[1:]:
            bad = [f for f in fields if runs[other].get(f) != first.get(f)]
            if bad:
                values = lambda run: ", ".join(f"{f} {run.get(f)}" for f in bad)  # noqa: E731
                raise FitError(f"campaign {name!r}: the {passes[0]} run ({values(first)}) and the {other} run "
                               f"({values(runs[other])}) {what}; re-run one with --overwrite, or capture them under "
                               "different --name")

    differ(list(runs), ("model_id",), "measured different models")
    differ([p for p in ("capture", "fixed", "routing") if p in runs], ("drafter_id",), "used different drafters")
    differ(list(TIMED_PASSES), ("device", "dtype", "backend", "host_gpu"),
           "were timed on different settings and cannot share one cost model")


def usable_capture_rounds(store: Store, run: dict) -> CaptureRounds:
    """The kept rounds of capture run `run` (a `runs` row), each with every draft position 1 … D
    (FitError naming the run and the table that lacks them)."""
    rounds = read_capture_rounds(store, run["run_id"])
    n = len(rounds.accepted_full)
    if n == 0:
        raise FitError(f"{run_label(store, run)} has no complete (untruncated, fully verified) rounds in table rounds")
    if rounds.draft_len == 0:
        raise FitError(f"{run_label(store, run)} has {n} complete rounds but no rows in table draft_positions")
    if rounds.incomplete():
        raise FitError(f"{run_label(store, run)}: {rounds.incomplete()} of {n} complete rounds lack some of draft "
                       f"positions 1…{rounds.draft_len} in table draft_positions")
    return rounds


# pass → (table, columns, which rows are usable): the timings and routing rows each fit reads
FIT_ROWS = {
    "fixed": ("fixed_length_timings", "executed_w, latency_us", "NOT truncated AND w >= 2"),  # w = 1: ar steps
    "stage0": ("stage0_timings", "u, latency_us", "true"),
    "moe": ("moe_bench", "n_distinct_experts, latency_us", "true"),
    "routing": ("routing_positions", "position, new_l0_experts, new_later_pairs", "true"),
}


def _fit_rows(store: Store, run: dict) -> np.ndarray:
    """[rows, columns] of FIT_ROWS for `run` (FitError naming the run and the table when there are none)."""
    table, columns, usable = FIT_ROWS[run["pass"]]
    rows = np.array(store.query(f"SELECT {columns} FROM {table} WHERE run_id = ? AND {usable}", [run["run_id"]]),
                    dtype=float)
    if len(rows) == 0:
        which = "" if usable == "true" else f" ({usable})"
        raise FitError(f"{run_label(store, run)} has no usable rows in table {table}{which}")
    return rows


def store_digest(path: Path) -> str:
    return "sha256:" + file_digest(path)


def fit_campaign(db: Path, name: str) -> CampaignFit:
    """Every fit of DESIGN A.9 over the runs of campaign `name` in the store at `db` (StoreError for
    a damaged store, FitError for missing or unusable runs)."""
    with Store(db, read_only=True) as store:
        store.verify()
        runs = {p: campaign_run(store, name, p) for p in ("capture", *TIMED_PASSES, "routing")}
        _check_one_setting(name, runs)
        capture = runs["capture"]
        rounds = usable_capture_rounds(store, capture)
        fixed, stage0, moe, routing = (_fit_rows(store, runs[p]) for p in ("fixed", "stage0", "moe", "routing"))
    D, conf, ent, a_d = rounds.draft_len, rounds.confidence, rounds.entropy, rounds.accepted_full
    prompt = np.unique(rounds.prompt_id, return_inverse=True)[1]  # [N] index of the round's prompt
    recorded = rounds.new_l0_experts >= 0  # [N, D]
    n0_pos, n0 = np.nonzero(recorded)[1] + 1, rounds.new_l0_experts[recorded]  # capture rows per draft position
    top_k = int(max(n0.max(initial=0), routing[:, 1].max()))
    held_out = rounds.held_out()
    train = ~held_out
    try:
        acceptance = AcceptanceFitter(isotonic="auto").fit(conf[train], ent[train], a_d[train], groups=prompt[train])
        cost = QuadraticCost().fit(fixed[:, 0], fixed[:, 1] * 1e-6, max_length=D + 1)
        s = Slope(name="s (Stage-0 latency per token)").fit(stage0[:, 0], stage0[:, 1] * 1e-6)
        eta = Slope(name="eta (MoE latency per distinct expert)").fit(moe[:, 0], moe[:, 1] * 1e-6)
    except ValueError as exc:  # too few distinct lengths, one class only, …
        raise FitError(f"campaign {name!r}: {exc}") from None
    held = held_out if held_out.any() else train
    metrics = held_out_report(acceptance, conf[held], ent[held], a_d[held])
    tables = RoutingTables().fit(n0_pos, n0, routing[:, 0].astype(int), routing[:, 1].astype(int), routing[:, 2],
                                 D, top_k)
    lengths = tuple(range(2, D + 2))
    cost_table = cost.table(D + 1)
    prefix = acceptance.predict_prefix(conf, ent)
    rho, iterations = dinkelbach(prefix, cost_table, cost.fixed_cost_, lengths, strict=False)
    converged = iterations[-1]["converged"]
    note = ""
    if not converged:  # a cost curve too noisy to rank lengths (e.g. stalled CPU timings)
        table = ", ".join(f"{w}: {cost_table[w] * 1e3:.2f}" for w in lengths)
        note = (f" (last ρ {rho:.4g}); the fitted C_tgt(w) in ms is {table}, fixed {cost.fixed_cost_ * 1e3:.2f} ms: "
                "re-run the fixed pass on a quiet machine with --threads 1 and --overwrite")
    return CampaignFit(draft_len=D, lengths=lengths, acceptance=acceptance, cost=cost, stage0=s, moe=eta,
                       routing=tables, rho=rho, iterations=iterations, model_id=capture["model_id"],
                       drafter_id=capture["drafter_id"], device=capture["device"], store_digest=store_digest(db),
                       metrics=metrics, warnings=cost.warnings_ + s.warnings_ + eta.warnings_, converged=converged,
                       convergence_note=note)
