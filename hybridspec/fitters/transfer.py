"""Policy parameters for a target whose acceptance cannot be measured on its own (random weights):
the acceptance model of one calibrated pair with the costs of another target (C_tgt, fixed cost,
s, η, n̄_all, n̄_all(·|n)), and ρ solved again by Dinkelbach over the first pair's capture rounds
(DESIGN A.9) — ρ is a throughput, so it belongs to the combination, not to either artifact.

This is an estimate of what the policy would do on the second target if its drafter were accepted
as often as the first pair's: it says nothing about the second target's real acceptance."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..artifacts.params import PolicyParameters
from ..workbench.store import Store
from .acceptance import AcceptanceFitter
from .campaign import FitError, campaign_run, usable_capture_rounds
from .rate import dinkelbach


def transfer_costs(acceptance: PolicyParameters, costs: PolicyParameters, confidence: np.ndarray,
                   entropy: np.ndarray) -> tuple[PolicyParameters, list[dict]]:
    """(`costs` with `acceptance`'s acceptance model and ρ re-solved over the rounds' confidence and
    entropy [N, D], Dinkelbach's iterations). Both must have the same D."""
    if acceptance.draft_len != costs.draft_len:
        raise FitError(f"the acceptance model covers D = {acceptance.draft_len} draft tokens, the costs "
                       f"D = {costs.draft_len}: both artifacts need drafters of the same block size")
    prefix = AcceptanceFitter.from_model(acceptance.acceptance).predict_prefix(confidence, entropy)
    rho, iterations = dinkelbach(prefix, np.asarray(costs.cost), costs.fixed_cost, costs.lengths, strict=False)
    return dataclasses.replace(costs, acceptance=acceptance.acceptance, rho=float(rho)), iterations


def transfer_from_store(db: Path, name: str, acceptance: PolicyParameters, costs: PolicyParameters
                        ) -> tuple[PolicyParameters, list[dict]]:
    """`transfer_costs` over the capture run of campaign `name` in the store at `db`."""
    with Store(db, read_only=True) as store:
        store.verify()
        rounds = usable_capture_rounds(store, campaign_run(store, name, "capture"))
    if rounds.draft_len != acceptance.draft_len:
        raise FitError(f"campaign {name!r} in {db} captured D = {rounds.draft_len} draft tokens; the acceptance "
                       f"artifact has D = {acceptance.draft_len}")
    return transfer_costs(acceptance, costs, rounds.confidence, rounds.entropy)
