"""A campaign's fits exported as the frozen artifact (DESIGN B.8): what `hybridspec fit` writes."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.artifact import save_artifact
from ..artifacts.params import AcceptanceModel, PolicyParameters
from .campaign import CampaignFit, fit_campaign


def fit_artifact(db: Path, name: str, out: Path) -> tuple[CampaignFit, dict]:
    """Fit the campaign `name` of the store `db` and write the artifact to `out`; (fit, metadata)."""
    result = fit_campaign(db, name)
    meta = save_artifact(out, policy_parameters(result), model_id=result.model_id,
                         drafter_id=result.drafter_id or "", device=result.device,
                         store_digest=result.store_digest, diagnostics=result.diagnostics())
    return result, meta


def policy_parameters(result: CampaignFit) -> PolicyParameters:
    """A campaign fit as the runtime's policy parameters (plain tuples of floats)."""
    acc = result.acceptance
    model = AcceptanceModel(iso_x=tuple(tuple(map(float, x)) for x in acc.iso_x_),
                            iso_y=tuple(tuple(map(float, y)) for y in acc.iso_y_), coef=tuple(map(float, acc.coef_)))
    return PolicyParameters(
        draft_len=result.draft_len, lengths=result.lengths,
        cost=tuple(map(float, result.cost.table(result.draft_len + 1))),
        fixed_cost=result.cost.fixed_cost_, rho=result.rho, s=result.stage0.slope_, eta=result.moe.slope_,
        nbar_all=tuple(map(float, result.routing.nbar_all_)),
        nbar_cond=tuple(tuple(map(float, row)) for row in result.routing.nbar_cond_), acceptance=model)
