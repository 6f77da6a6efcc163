"""`hybridspec estimate`: the offline estimate of each policy over a campaign's capture rounds
(`offline.py`), with the artifact's own costs or with another target's (`fitters/transfer.py`: one
pair's acceptance model with the costs of a target whose acceptance cannot be measured, ρ solved
again over the rounds). Nothing here loads a model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ..artifacts.artifact import check_identity, load_artifact
from ..artifacts.params import PolicyParameters
from ..fitters.transfer import transfer_from_store
from ..workbench.store import Store, require_store, resolve_campaign
from .offline import (OfflineError, ar_step_seconds, default_policies, estimate_from_store, find_capture_run,
                      in_policy_order, measured_ar_step, routing_samples)

OWN_COSTS = "offline estimate"
OTHER_COSTS = "estimate with another target's costs"


@dataclass(frozen=True)
class OtherCosts:
    """Another target's costs: its artifact and the store it was fitted on (`campaign` None: the
    store's only one)."""

    artifact: Path
    db: Path
    campaign: str | None = None


@dataclass(frozen=True)
class OfflineEstimate:
    kind: str  # OWN_COSTS or OTHER_COSTS
    policies: tuple[str, ...]  # in the order asked
    table: pl.DataFrame  # offline.ESTIMATE_COLUMNS, rows in `policies` order
    rho: float  # tokens/s of the parameters replayed (solved again with other costs)
    sources: dict[str, str]  # what each input came from, for the printed footnotes


def estimate_offline(db: Path, artifact: Path, *, campaign: str | None = None,
                     policies: Sequence[str] | None = None, costs: OtherCosts | None = None,
                     force: bool = False) -> OfflineEstimate:
    """Each policy replayed over the capture rounds of `campaign` (None: the store's only one) of
    `db` with `artifact`'s acceptance model and costs, or `costs`' (its C_tgt, fixed cost, s, η and
    n̄; its store's routing pass and measured ar step). `policies` default: `default_policies`.
    `force`: use an artifact fitted for another model or drafter than its capture run's.
    Raises ArtifactError, StoreError, OfflineError, FitError, PolicyError (all ValueError)."""
    if policies is not None and not policies:
        raise OfflineError("--policies is empty")
    require_store(db)
    if costs is not None:
        require_store(costs.db, "--costs-db")
    params, meta = load_artifact(artifact)
    campaign = resolve_campaign(db, campaign)
    sources = {"acceptance": f"{artifact} (campaign {campaign!r} of {db})", "rounds": f"{db}, campaign {campaign!r}"}
    ar_step = routing = None
    if costs is not None:
        params, ar_step, routing, cost_sources = _with_other_costs(db, campaign, params, costs, force)
        sources.update(cost_sources)
    names = tuple(policies or default_policies(params.draft_len))
    with Store(db, read_only=True) as store:
        store.verify()
        table = estimate_from_store(store, params, meta, campaign=campaign, policies=names, source=str(artifact),
                                    force=force, ar_step=ar_step, routing=routing)
    kind = OTHER_COSTS if costs is not None else OWN_COSTS
    return OfflineEstimate(kind, names, in_policy_order(table, names), params.rho, sources)


def _with_other_costs(db: Path, campaign: str, params: PolicyParameters, costs: OtherCosts, force: bool
                      ) -> tuple[PolicyParameters, float, list[np.ndarray], dict[str, str]]:
    """(`params`' acceptance with `costs`' costs and ρ solved again, the other target's ar step (s),
    its routing samples per position, the sources of each)."""
    cost_params, cost_meta = load_artifact(costs.artifact)
    cost_campaign = resolve_campaign(costs.db, costs.campaign)
    with Store(costs.db, read_only=True) as store:
        store.verify()
        run = find_capture_run(store, cost_campaign)
        check_identity(cost_meta, model_id=run["model_id"], drafter_id=run["drafter_id"] or "",
                       force=force, source=str(costs.artifact))
        routing = routing_samples(store, cost_campaign, params.draft_len)
        measured = measured_ar_step(store, run)
    combined, iterations = transfer_from_store(db, campaign, params, cost_params)
    ar_step = ar_step_seconds(combined, measured)
    sources = {"costs": f"{costs.artifact} (C_tgt, fixed cost, s, η, n̄_all)",
               "routing": f"{costs.db}, campaign {cost_campaign!r}: routing pass",
               "ar_step": (f"{costs.db}: fixed pass, w = 1" if measured is not None
                           else f"fixed cost + C_tgt(1) of {costs.artifact} (no fixed pass in {costs.db})"),
               "rho": f"solved again over the rounds ({len(iterations)} Dinkelbach steps)"}
    return combined, ar_step, routing, sources
