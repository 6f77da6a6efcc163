"""Offline policy evaluation (DESIGN A.2, A.9, A.10): every length policy replayed over the rounds of
a capture run, with the artifact's cost model in place of a clock. No model is loaded.

The capture run verifies all D draft tokens of every round, so each round's A_D, conf_i, h_i and
new Layer-0 experts per draft position are known. A policy that chooses w on the round (M = w − 1
draft tokens) accepts min(A_D, M) and emits min(A_D, M) + 1 tokens. The lengths come from the
runtime's own rules (`runtime.policies`), applied round by round; the estimated latency of a round is

    full, static:N, ratio, ratio4, nominal   C_tgt(w) + fixed
    hybridspec                               C_tgt(w0) + fixed + s         (Stage 0 also ran d_{w0}; w0 < W)
                                             + ΔL_c of Eq. 6 when the correction adds d_{w0}
                                             (= C_tgt(w0+1) + fixed + η (n̄_all(w0|n) − n̄_all(w0)))
    ar                                       the mean measured ar step of the campaign's fixed pass
                                             (its w = 1 rows), one token per round

A store whose fixed pass has no w = 1 rows falls back to
fixed + C_tgt(1), C_tgt(1) the quadratic through C_tgt(2…4) extrapolated (3 C(2) − 3 C(3) + C(4),
floored at 0). That estimate is slow: the fixed cost was fitted on speculative rounds and includes
the drafter's pass, which an ar step does not run, so every estimated SR is then biased upward.

Truncation: rounds cut short by EOS or the output limit (`rounds.truncated`) are left out, as in the
acceptance fit and ρ (A.9) — what they emit depends on where the cut fell, not on the length alone.
The estimates describe untruncated rounds; measured runs also contain each request's last, shortened
rounds, which weigh more the shorter the outputs. Every kept round counts once for every policy: the
estimate is the pooled ratio Σ emitted / Σ latency over the same round states (A.2), not a
simulation of the longer sequence of rounds a more cautious policy would run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from ..artifacts.artifact import check_identity, load_artifact
from ..artifacts.params import PolicyParameters
from ..fitters.capture_rounds import read_capture_rounds, unfinished_run
from ..runtime.policies import NEEDS_PARAMETERS, Policy, make_policy
from ..workbench.store import Store, run_id_for

ESTIMATE_COLUMNS = ("policy", "category", "rounds", "emitted", "al", "mean_w", "est_seconds", "tps", "sr")
# a measured table (`tables.measured_from_store`): the same, with the measured Σ decode seconds
MEASURED_COLUMNS = tuple("decode_seconds" if c == "est_seconds" else c for c in ESTIMATE_COLUMNS)
AVERAGE = "all"  # the category of each policy's average row
METRICS = ("al", "mean_w", "tps", "sr")


class OfflineError(ValueError):
    """A store or artifact the offline estimate cannot use; the message names the run."""


@dataclass(frozen=True)
class CapturedRounds:
    """The untruncated rounds of a capture run: N rounds, draft position i in column i − 1."""

    run_id: str
    category: np.ndarray  # [N] str
    accepted_full: np.ndarray  # [N] A_D
    confidence: np.ndarray  # [N, D]
    entropy: np.ndarray  # [N, D]
    new_l0_experts: np.ndarray  # [N, D] new Layer-0 experts of d_i (−1: not recorded)


def default_policies(draft_len: int) -> list[str]:
    """ar, full, static:2 … static:W, then the calibrated policies."""
    return ["ar", "full", *(f"static:{w}" for w in range(2, draft_len + 2)), *NEEDS_PARAMETERS]


def find_capture_run(store: Store, campaign: str | None) -> dict:
    """The `runs` row of campaign's capture run (None: the store's only capture run); OfflineError
    when there is none or it is unfinished."""
    names = [n for (n,) in store.query("SELECT name FROM runs WHERE pass = 'capture' ORDER BY name")]
    if campaign is None:
        if len(names) != 1:
            raise OfflineError(f"{store.path}: {len(names)} capture runs ({', '.join(names) or 'none'}); "
                               "name the campaign")
        campaign = names[0]
    row = store.run_row(run_id_for(campaign, "capture"))
    if row is None:
        raise OfflineError(f"{store.path}: campaign {campaign!r} has no capture run (campaigns with one: "
                           f"{', '.join(names) or 'none'})")
    unfinished = unfinished_run(store, row)
    if unfinished is not None:
        raise OfflineError(f"{unfinished}; only finished capture runs are replayed")
    return row


def load_capture_rounds(store: Store, run_id: str, draft_len: int) -> CapturedRounds:
    """Every untruncated, fully verified round of the run with its D = `draft_len` draft positions."""
    rounds = read_capture_rounds(store, run_id)
    if not len(rounds.accepted_full):
        raise OfflineError(f"capture run {run_id} has no untruncated, fully verified rounds in table rounds")
    if rounds.draft_len > draft_len:
        raise OfflineError(f"capture run {run_id}: draft position {rounds.draft_len} outside 1…{draft_len} "
                           "(the artifact's D) in table draft_positions")
    pad = ((0, 0), (0, draft_len - rounds.draft_len))  # positions the store lacks: NaN, refused below
    conf, ent = (np.pad(x, pad, constant_values=np.nan) for x in (rounds.confidence, rounds.entropy))
    if np.isnan(conf).any():
        raise OfflineError(f"capture run {run_id}: some rounds lack draft positions in table draft_positions "
                           f"(expected D = {draft_len})")
    fresh = np.pad(rounds.new_l0_experts, pad, constant_values=-1)
    return CapturedRounds(run_id, rounds.category, rounds.accepted_full, conf, ent, fresh)


def of_categories(rounds: CapturedRounds, categories: Sequence[str]) -> CapturedRounds:
    """The rounds of the prompts of `categories`; OfflineError when none of them has a round."""
    keep = np.isin(rounds.category, list(categories))
    if not keep.any():
        held = ", ".join(sorted(set(rounds.category.tolist())))
        raise OfflineError(f"capture run {rounds.run_id} has no untruncated rounds of categories "
                           f"{', '.join(categories)} (its categories: {held})")
    return dataclasses.replace(rounds, category=rounds.category[keep], accepted_full=rounds.accepted_full[keep],
                               confidence=rounds.confidence[keep], entropy=rounds.entropy[keep],
                               new_l0_experts=rounds.new_l0_experts[keep])


def measured_ar_step(store: Store, campaign_run: dict) -> float | None:
    """Mean latency (s) of the ar steps (w = 1) of the fixed pass of the capture run's campaign."""
    (mean,), = store.query("SELECT avg(t.latency_us) FROM fixed_length_timings t JOIN runs r ON t.run_id = r.run_id "
                           "WHERE r.name = ? AND r.pass = 'fixed' AND t.w = 1 AND NOT t.truncated",
                           [campaign_run["name"]])
    return None if mean is None else mean * 1e-6


def ar_step_seconds(params: PolicyParameters, measured: float | None = None) -> float:
    """The measured ar step when there is one, else fixed + C_tgt(1) (module docstring)."""
    if measured is not None:
        return measured
    c = params.cost
    one = 3 * c[2] - 3 * c[3] + c[4] if len(c) > 4 else c[2]
    return params.fixed_cost + max(0.0, one)


def replay(policy: Policy, rounds: CapturedRounds, params: PolicyParameters,
           ar_step: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Executed length w [N] and estimated latency [N] (seconds) of `policy` on every captured round
    (`ar_step`: the measured ar step, see `ar_step_seconds`)."""
    n = len(rounds.accepted_full)
    if not policy.speculative:
        return np.ones(n, dtype=np.int64), np.full(n, ar_step_seconds(params, ar_step))
    cost, fixed, W = params.cost, params.fixed_cost, policy.max_length
    w, seconds = np.empty(n, dtype=np.int64), np.empty(n)
    for r in range(n):
        conf = torch.tensor(rounds.confidence[r], dtype=torch.float32)  # the drafter's dtype: stored exactly
        w0, p_hat = policy.select(conf, torch.tensor(rounds.entropy[r], dtype=torch.float32))
        w[r], seconds[r] = w0, cost[w0] + fixed
        if policy.corrects_routing and w0 < W:  # u = w0 + 1: no kept round is cut, so w_rem = W
            n_new = int(rounds.new_l0_experts[r, w0 - 1])  # n_new = U0(w0+1) − U0(w0): the experts d_{w0} adds
            seconds[r] += params.s
            if policy.expands(w0, p_hat, n_new):
                w[r], seconds[r] = w0 + 1, seconds[r] + policy.added_latency(w0, n_new)
    return w, seconds


def pooled_table(sums: pl.DataFrame, policies: Sequence[str], *, seconds_column: str = "est_seconds"
                 ) -> pl.DataFrame:
    """Per-(policy, category) sums → ESTIMATE_COLUMNS or MEASURED_COLUMNS (DESIGN A.10), each
    policy's AVERAGE row last.

    `sums`: policy, category, rounds, emitted, w_sum, seconds, ref_emitted, ref_seconds (`ar` on the
    same prompts or rounds). Pooled: TPS = Σ emitted / Σ seconds, SR = TPS / TPS of ar, AL = Σ emitted
    / Σ rounds, mean w = Σ w / Σ rounds; AVERAGE: `with_average`. `seconds_column` names Σ seconds:
    `est_seconds` for an estimate, `decode_seconds` for a measured table (MEASURED_COLUMNS)."""
    tps = pl.col("emitted") / pl.col("seconds")
    per = sums.select("policy", "category", pl.col("rounds").cast(pl.Int64), pl.col("emitted").cast(pl.Int64),
                      al=pl.col("emitted") / pl.col("rounds"), mean_w=pl.col("w_sum") / pl.col("rounds"),
                      **{seconds_column: pl.col("seconds").cast(pl.Float64)}, tps=tps,
                      sr=tps / (pl.col("ref_emitted") / pl.col("ref_seconds")))
    return with_average(per, policies)


def with_average(per: pl.DataFrame, policies: Sequence[str]) -> pl.DataFrame:
    """Per-category rows (no AVERAGE rows) and each policy's AVERAGE row over exactly those
    categories: arithmetic means over categories of METRICS (every category weighs the same), sums
    of every other column (rounds, emitted, seconds)."""
    summed = [c for c in per.columns if c not in ("policy", "category", *METRICS)]
    average = per.group_by("policy").agg(pl.lit(AVERAGE).alias("category"), pl.col(summed).sum(),
                                         pl.col(list(METRICS)).mean())
    return in_policy_order(pl.concat([per, average.select(per.columns)]), policies)


def restrict_categories(table: pl.DataFrame, categories: Sequence[str]) -> pl.DataFrame:
    """A pooled table (ESTIMATE_COLUMNS or MEASURED_COLUMNS) kept to `categories`, its AVERAGE rows
    computed again over the categories kept (`with_average`); policies in the table's order."""
    policies = table["policy"].unique(maintain_order=True).to_list()
    return with_average(table.filter(pl.col("category").is_in(list(categories)) & (pl.col("category") != AVERAGE)),
                        policies)


def table_categories(table: pl.DataFrame) -> list[str]:
    """The categories of a pooled table's per-category rows, in order of appearance (no AVERAGE)."""
    return [c for c in table["category"].unique(maintain_order=True).to_list() if c != AVERAGE]


def in_policy_order(frame: pl.DataFrame, policies: Sequence[str]) -> pl.DataFrame:
    """Rows by policy in the given order, categories sorted, each policy's AVERAGE row last."""
    rank = {name: i for i, name in enumerate(policies)}
    return (frame.with_columns(_p=pl.col("policy").replace_strict(rank, return_dtype=pl.Int64),
                               _a=pl.col("category") == AVERAGE)
            .sort("_p", "_a", "category").drop("_p", "_a"))


def routing_samples(store: Store, campaign: str, draft_len: int) -> list[np.ndarray]:
    """New Layer-0 experts per draft position 1 … D from the routing pass of `campaign` (one array
    per position: the values seen there)."""
    row = store.run_row(run_id_for(campaign, "routing"))
    if row is None:
        raise OfflineError(f"campaign {campaign!r} has no routing run in {store.path}")
    rows = store.query("SELECT position, new_l0_experts FROM routing_positions WHERE run_id = ?", [row["run_id"]])
    by_position = [np.array([n for p, n in rows if p == k], dtype=np.int64) for k in range(1, draft_len + 1)]
    empty = [k for k, values in enumerate(by_position, start=1) if not len(values)]
    if empty:
        raise OfflineError(f"the routing run of campaign {campaign!r} has no rows at draft positions {empty}")
    return by_position


def with_routing(rounds: CapturedRounds, samples: list[np.ndarray], seed: int = 0) -> CapturedRounds:
    """The rounds with each position's new Layer-0 experts drawn from another target's routing pass
    at the same draft position (seeded): the routing term of an estimate for that target."""
    rng = np.random.default_rng(seed)
    fresh = np.stack([rng.choice(samples[k], size=len(rounds.accepted_full)) for k in range(len(samples))], axis=1)
    return dataclasses.replace(rounds, new_l0_experts=fresh)


def estimate_from_store(store: Store, params: PolicyParameters, meta: dict, *, campaign: str | None = None,
                        policies: Sequence[str] | None = None, categories: Sequence[str] | None = None,
                        source: str = "artifact", force: bool = False, ar_step: float | None = None,
                        routing: list[np.ndarray] | None = None) -> pl.DataFrame:
    """`estimate_policies` on an open store (see there). `force`: use an artifact fitted for another
    model or drafter than the capture run's. `ar_step` (s) and `routing` (`routing_samples` of
    another store) replace the campaign's own, for an estimate whose costs come from another target
    (`fitters.transfer`)."""
    run = find_capture_run(store, campaign)
    check_identity(meta, model_id=run["model_id"], drafter_id=run["drafter_id"] or "", force=force, source=source)
    rounds = load_capture_rounds(store, run["run_id"], params.draft_len)
    if categories is not None:
        rounds = of_categories(rounds, categories)
    if routing is not None:
        rounds = with_routing(rounds, routing)
    names = list(dict.fromkeys(policies)) if policies is not None else default_policies(params.draft_len)
    measured = ar_step if ar_step is not None else measured_ar_step(store, run)
    step = ar_step_seconds(params, measured)
    frames = []
    for name in names:
        w, seconds = replay(make_policy(name, params.draft_len, params), rounds, params, measured)  # PolicyError
        emitted = np.minimum(rounds.accepted_full, w - 1) + 1  # R = min(A_D, M) + 1
        frames.append(pl.DataFrame({"category": rounds.category, "w": w, "seconds": seconds, "emitted": emitted})
                      .group_by("category").agg(pl.lit(name).alias("policy"), pl.len().alias("rounds"),
                                                pl.col("emitted").sum(), pl.col("w").sum().alias("w_sum"),
                                                pl.col("seconds").sum()))
    sums = pl.concat(frames).with_columns(ref_emitted=pl.col("rounds"), ref_seconds=pl.col("rounds") * step)
    return pooled_table(sums, names)


def best_static_length(store: Store, params: PolicyParameters, meta: dict, *, campaign: str | None = None,
                       source: str = "artifact", force: bool = False) -> tuple[int, pl.DataFrame]:
    """The static length with the highest estimated TPS (average over categories) on the campaign's
    capture run — the calibration prompts, never the evaluated ones — and the estimates of every
    static length 2 … D + 1 (ties: the shorter length)."""
    names = [f"static:{k}" for k in range(2, params.draft_len + 2)]
    table = estimate_from_store(store, params, meta, campaign=campaign, policies=names, source=source, force=force)
    average = table.filter(pl.col("category") == AVERAGE)
    best = max(average.iter_rows(named=True), key=lambda row: (row["tps"], -int(row["policy"].split(":")[1])))
    return int(best["policy"].split(":")[1]), table


def estimate_policies(db: Path, artifact_path: Path, *, campaign: str | None = None,
                      policies: Sequence[str] | None = None, categories: Sequence[str] | None = None,
                      force: bool = False) -> pl.DataFrame:
    """Offline estimates (module docstring) of each policy on the capture run of `campaign` (None: the
    store's only capture run) with the artifact's parameters. Columns ESTIMATE_COLUMNS: one row per
    (policy, category) and per policy a category "all" row (`with_average`: sums of rounds, emitted,
    est_seconds; arithmetic means over categories of al, mean_w, tps, sr). `policies` default:
    `default_policies`; `categories` (None: every category of the capture run): only the rounds of
    those categories, so that "all" averages over the same categories as a measured table of them.
    Raises OfflineError, ArtifactError (artifact invalid, or fitted for another model unless `force`),
    PolicyError."""
    params, meta = load_artifact(artifact_path)
    with Store(db, read_only=True) as store:
        return estimate_from_store(store, params, meta, campaign=campaign, policies=policies,
                                   categories=categories, source=str(artifact_path), force=force)


def compare_with_measured(estimates: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """For each (policy, category) of both tables, in the measured table's order, each policy's
    AVERAGE row after its categories: `{m}_measured`, `{m}_estimated` and `{m}_diff` (estimated −
    measured) for m in METRICS. The AVERAGE rows are computed here over the categories both tables
    hold (the mean of the policy's rows, as `with_average` weighs them), so their difference
    compares the same categories on both sides; a category only one table holds is left out
    (`missing_categories`)."""
    keys = ["policy", "category"]
    per_category = pl.col("category") != AVERAGE
    joined = (measured.filter(per_category).with_row_index("_order").select("_order", *keys, *METRICS)
              .join(estimates.filter(per_category).select(*keys, *METRICS), on=keys, suffix="_estimated")
              .select(pl.col("_order").cast(pl.Float64), *keys,
                      *(c for m in METRICS for c in (pl.col(m).alias(f"{m}_measured"), pl.col(f"{m}_estimated")))))
    sides = [f"{m}_{side}" for m in METRICS for side in ("measured", "estimated")]
    average = joined.group_by("policy").agg(pl.col("_order").max() + 0.5, pl.lit(AVERAGE).alias("category"),
                                            pl.col(sides).mean())
    both = pl.concat([joined, average.select(joined.columns)]).sort("_order")
    return both.select(*keys, *(c for m in METRICS for c in (
        pl.col(f"{m}_measured"), pl.col(f"{m}_estimated"),
        (pl.col(f"{m}_estimated") - pl.col(f"{m}_measured")).alias(f"{m}_diff"))))


def missing_categories(estimates: pl.DataFrame, measured: pl.DataFrame) -> list[str]:
    """The measured categories that the estimates lack (no captured rounds of them): left out of
    `compare_with_measured`, its AVERAGE rows included."""
    have = set(table_categories(estimates))
    return [c for c in table_categories(measured) if c not in have]
