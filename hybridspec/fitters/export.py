"""A campaign's fits exported as the frozen artifact (DESIGN B.8): what `hybridspec fit` writes.

The fit-quality checks (`checks.py`) run before anything is written: with a failed check and
`allow_poor_fit=False` (what `hybridspec fit` passes unless `--allow-poor-fit`) nothing is written
and `PoorFitError` names every failed check. With `allow_poor_fit=True` (the library default, so
that a workflow such as the demo goes on and shows its checks through `print_fit`) the artifact is
written with the override recorded, and `inspect` and `report` show the failed checks. The
artifact's `diagnostics` carry the checks, their thresholds, the override (`allow_poor_fit`) and
the fitting process's software versions."""

from __future__ import annotations

import os
from pathlib import Path

from ..artifacts.artifact import save_artifact
from ..artifacts.params import AcceptanceModel, PolicyParameters
from ..workbench.paths import OutputPathError, check_output_file
from .campaign import CampaignFit, FitError, fit_campaign
from .checks import Check, Thresholds, check_rows, failed, quality_checks


class PoorFitError(FitError):
    """A fit with failed quality checks (nothing written); one line per failed check."""

    def __init__(self, result: CampaignFit, checks: list[Check]):
        self.result, self.checks = result, checks
        lines = "\n".join(f"  {c.line()}" for c in failed(checks))
        super().__init__(f"the fit failed {len(failed(checks))} quality check(s); nothing written "
                         f"(--allow-poor-fit writes it anyway, --threshold NAME=VALUE changes a limit):\n{lines}")


def fit_artifact(db: Path, name: str, out: Path, *, thresholds: Thresholds | None = None,
                 allow_poor_fit: bool) -> tuple[CampaignFit, dict]:
    """Fit the campaign `name` of the store `db`, check the fit and write the artifact to `out`;
    (fit, metadata). `out` is checked before fitting. `allow_poor_fit`: write it even when a check
    fails (PoorFitError otherwise); the caller says which, as `fit --allow-poor-fit` does."""
    check_output_file(out)
    if Path(out).exists() and Path(db).exists() and os.path.samefile(out, db):  # the artifact would replace its store
        raise OutputPathError(f"--out {out}: is the store being fitted (--db {db}); write the artifact to its own file")
    thresholds = thresholds or Thresholds()
    result = fit_campaign(db, name)
    try:
        params = policy_parameters(result)
    except ValueError as exc:  # e.g. ρ not positive
        raise FitError(f"campaign {name!r}: {exc}") from None
    diagnostics = {**result.diagnostics(), "thresholds": thresholds.as_dict()}
    result.checks = quality_checks(cost=params.cost, lengths=params.lengths, s=params.s, eta=params.eta,
                                   diagnostics=diagnostics, thresholds=thresholds)
    if failed(result.checks) and not allow_poor_fit:
        raise PoorFitError(result, result.checks)
    diagnostics.update(checks=check_rows(result.checks), allow_poor_fit=bool(failed(result.checks)))
    meta = save_artifact(out, params, model_id=result.model_id, drafter_id=result.drafter_id or "",
                         device=result.device, store_digest=result.store_digest, diagnostics=diagnostics)
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
