"""Fit a whole calibration campaign read from the store (DESIGN A.9): the acceptance model,
C_tgt, s, η, the routing tables and ρ. Returns plain numbers and arrays; the CLI turns them into
the frozen artifact.

Rounds cut short by EOS or the output limit are excluded from every acceptance fit; the held-out
rounds are those of every fifth calibration prompt (split by prompt, deterministic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..workbench.runinfo import file_digest, software_versions
from ..workbench.store import Store, run_id_for
from .acceptance import AcceptanceFitter, held_out_report
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
                "cost": {"coef": self.cost.coef_.tolist(), "conf_int": self.cost.conf_int_.tolist(), "r2": self.cost.r2_,
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


def _run(store: Store, name: str, pass_name: str) -> dict:
    row = store.run_row(run_id_for(name, pass_name))
    if row is None:
        raise FitError(f"campaign {name!r} has no {pass_name} run in {store.path}")
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


def _capture_arrays(store: Store, run_id: str) -> dict:
    rounds = store.query("SELECT prompt_id, round_idx, accepted_full FROM rounds WHERE run_id = ? AND NOT truncated "
                         "AND accepted_full IS NOT NULL ORDER BY prompt_id, round_idx", [run_id])
    if not rounds:
        raise FitError(f"capture run {run_id} has no complete (untruncated, fully verified) rounds")
    pos = store.query("SELECT d.prompt_id, d.round_idx, d.position, d.confidence, d.entropy, d.new_l0_experts "
                      "FROM draft_positions d JOIN rounds r USING (run_id, prompt_id, round_idx) "
                      "WHERE d.run_id = ? AND NOT r.truncated AND r.accepted_full IS NOT NULL "
                      "ORDER BY d.prompt_id, d.round_idx, d.position", [run_id])
    D = max(p[2] for p in pos)
    index = {(r[0], r[1]): k for k, r in enumerate(rounds)}
    conf, ent = np.zeros((len(rounds), D)), np.zeros((len(rounds), D))
    n0_pos, n0 = [], []
    for prompt, rnd, position, c, h, new in pos:
        k = index[(prompt, rnd)]
        conf[k, position - 1], ent[k, position - 1] = c, h
        n0_pos.append(position)
        n0.append(new)
    prompts = sorted({r[0] for r in rounds})
    order = {p: i for i, p in enumerate(prompts)}
    held = {p for i, p in enumerate(prompts) if i % 5 == 4}
    return {"conf": conf, "ent": ent, "a_d": np.array([r[2] for r in rounds]), "D": D,
            "prompt": np.array([order[r[0]] for r in rounds]),
            "held": np.array([r[0] in held for r in rounds]), "n0_pos": np.array(n0_pos), "n0": np.array(n0)}


def store_digest(path: Path) -> str:
    return "sha256:" + file_digest(path)


def fit_campaign(db: Path, name: str) -> CampaignFit:
    """Every fit of DESIGN A.9 over the runs of campaign `name` in the store at `db` (StoreError for
    a damaged store, FitError for missing or unusable runs)."""
    with Store(db, read_only=True) as store:
        store.verify()
        runs = {p: _run(store, name, p) for p in ("capture", *TIMED_PASSES, "routing")}
        _check_one_setting(name, runs)
        capture = runs["capture"]
        arrays = _capture_arrays(store, capture["run_id"])
        fixed = np.array(store.query("SELECT executed_w, latency_us FROM fixed_length_timings WHERE run_id = ? "
                                     "AND NOT truncated AND w >= 2",  # w = 1: ar steps, not C_tgt
                                     [runs["fixed"]["run_id"]]), dtype=float)
        stage0 = np.array(store.query("SELECT u, latency_us FROM stage0_timings WHERE run_id = ?",
                                      [runs["stage0"]["run_id"]]), dtype=float)
        moe = np.array(store.query("SELECT n_distinct_experts, latency_us FROM moe_bench WHERE run_id = ?",
                                   [runs["moe"]["run_id"]]), dtype=float)
        routing = np.array(store.query("SELECT position, new_l0_experts, new_later_pairs FROM routing_positions "
                                       "WHERE run_id = ?", [runs["routing"]["run_id"]]), dtype=float)
        top_k = int(max(arrays["n0"].max(), routing[:, 1].max()))
    for what, rows in (("fixed", fixed), ("stage0", stage0), ("moe", moe), ("routing", routing)):
        if len(rows) == 0:
            raise FitError(f"campaign {name!r}: the {what} run in {db} has no usable rows")
    D, train = arrays["D"], ~arrays["held"]
    try:
        acceptance = AcceptanceFitter(isotonic="auto").fit(arrays["conf"][train], arrays["ent"][train],
                                                           arrays["a_d"][train], groups=arrays["prompt"][train])
        cost = QuadraticCost().fit(fixed[:, 0], fixed[:, 1] * 1e-6, max_length=D + 1)
        s = Slope(name="s (Stage-0 latency per token)").fit(stage0[:, 0], stage0[:, 1] * 1e-6)
        eta = Slope(name="eta (MoE latency per distinct expert)").fit(moe[:, 0], moe[:, 1] * 1e-6)
    except ValueError as exc:  # too few distinct lengths, one class only, …
        raise FitError(f"campaign {name!r}: {exc}") from None
    held = arrays["held"] if arrays["held"].any() else train
    metrics = held_out_report(acceptance, arrays["conf"][held], arrays["ent"][held], arrays["a_d"][held])
    tables = RoutingTables().fit(arrays["n0_pos"], arrays["n0"], routing[:, 0].astype(int),
                                 routing[:, 1].astype(int), routing[:, 2], D, top_k)
    lengths = tuple(range(2, D + 2))
    cost_table = cost.table(D + 1)
    prefix = acceptance.predict_prefix(arrays["conf"], arrays["ent"])
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
