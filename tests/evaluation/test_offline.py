"""Offline policy evaluation on a synthetic capture store with known A_D, confidences and routing:
static lengths against the closed form, `full` against the mean of A_D + 1, nominal and hybridspec
against an oracle loop that applies Eq. 5 and Eq. 6 round by round, written out here."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
import torch

from hybridspec.artifacts.artifact import ArtifactError, save_artifact
from hybridspec.evaluation.offline import (AVERAGE, ESTIMATE_COLUMNS, METRICS, OfflineError, compare_with_measured,
                                           estimate_policies, missing_categories, restrict_categories)
from hybridspec.runtime.policies import make_policy
from hybridspec.workbench.store import RunSpec, Store
from tests.fitters.synthetic import rounds as synthetic_rounds
from tests.runtime.helpers import policy_parameters

D, W = 15, 16
CATEGORIES = ("code", "prose", "tests")
PARAMS = dataclasses.replace(policy_parameters(D, rho=300.0), eta=4e-4, s=2e-4)


def _spec(name: str = "synth") -> RunSpec:
    return RunSpec(name=name, pass_name="capture", model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                   dtype="float32", backend="torch")


def _write_capture(store: Store, name: str, n_rounds: int, seed: int) -> dict:
    """A capture run of prompts of 20 rounds each (categories in turn); every 7th round truncated.
    Confidences are float32 values, as the drafter produces them. Returns the kept rounds' truth."""
    conf, ent, _, a_d = synthetic_rounds(n_rounds, draft_len=D, seed=seed)
    conf, ent = conf.astype(np.float32).astype(float), ent.astype(np.float32).astype(float)
    fresh = np.random.default_rng(seed).integers(0, 4, size=(n_rounds, D))
    run = store.start_run(_spec(name))
    kept = {"category": [], "a_d": [], "conf": [], "ent": [], "fresh": []}
    for p in range(n_rounds // 20):
        category = CATEGORIES[p % len(CATEGORIES)]
        rows = {"prompts": [dict(run_id=run, prompt_id=f"p{p}", category=category, split="calib", prompt_tokens=9)],
                "rounds": [], "draft_positions": []}
        for i, r in enumerate(range(20 * p, 20 * p + 20)):
            truncated = r % 7 == 3
            rows["rounds"].append(dict(run_id=run, prompt_id=f"p{p}", round_idx=i, w0=W, u=W, w=W,
                                       accepted=int(a_d[r]), accepted_full=int(a_d[r]),
                                       emitted=1 if truncated else int(a_d[r]) + 1, truncated=truncated,
                                       latency_us=1.0))
            rows["draft_positions"] += [dict(run_id=run, prompt_id=f"p{p}", round_idx=i, position=k, token_id=1,
                                             confidence=conf[r, k - 1], entropy=ent[r, k - 1],
                                             accepted=bool(a_d[r] >= k), new_l0_experts=int(fresh[r, k - 1]))
                                        for k in range(1, D + 1)]
            if not truncated:
                for key, value in zip(kept, (category, a_d[r], conf[r], ent[r], fresh[r])):
                    kept[key].append(value)
        store.commit_unit(run, f"prompt:p{p}", rows)
    store.finish_shard(run, 0)
    return {k: np.array(v) for k, v in kept.items()}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("offline")
    with Store(path / "s.duckdb") as store:
        truth = _write_capture(store, "synth", 600, seed=1)
    save_artifact(path / "a.safetensors", PARAMS, model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                  store_digest="x", diagnostics={})
    return path / "s.duckdb", path / "a.safetensors", truth


@pytest.fixture(scope="module")
def estimates(synthetic):
    db, artifact, _ = synthetic
    return estimate_policies(db, artifact)


def _row(frame: pl.DataFrame, policy: str, category: str) -> dict:
    (row,) = frame.filter((pl.col("policy") == policy) & (pl.col("category") == category)).iter_rows(named=True)
    return row


def _ar_seconds() -> float:
    c = PARAMS.cost
    return PARAMS.fixed_cost + max(0.0, 3 * c[2] - 3 * c[3] + c[4])


def _check(frame, policy: str, truth: dict, w: np.ndarray, seconds: np.ndarray) -> None:
    """The estimate's rows of `policy` equal the pooled quantities of per-round (w, seconds)."""
    emitted = np.minimum(truth["a_d"], w - 1) + 1
    for category in CATEGORIES:
        sel = truth["category"] == category
        row = _row(frame, policy, category)
        tps = emitted[sel].sum() / seconds[sel].sum()
        assert row["rounds"] == sel.sum() and row["emitted"] == emitted[sel].sum()
        assert row["al"] == pytest.approx(emitted[sel].mean(), rel=1e-12)
        assert row["mean_w"] == pytest.approx(w[sel].mean(), rel=1e-12)
        assert row["est_seconds"] == pytest.approx(seconds[sel].sum(), rel=1e-12)
        assert row["tps"] == pytest.approx(tps, rel=1e-12)
        assert row["sr"] == pytest.approx(tps * _ar_seconds(), rel=1e-12)


def test_columns_and_every_default_policy(estimates):
    assert tuple(estimates.columns) == ESTIMATE_COLUMNS
    policies = estimates["policy"].unique(maintain_order=True).to_list()
    assert policies == ["ar", "full", *(f"static:{n}" for n in range(2, W + 1)), "ratio", "ratio4", "nominal",
                        "hybridspec"]
    assert estimates.height == len(policies) * (len(CATEGORIES) + 1)


def test_static_lengths_equal_the_closed_form(estimates, synthetic):
    truth = synthetic[2]
    for n in range(2, W + 1):  # Σ (min(A_D, N−1) + 1) / Σ (C(N) + fixed), truncated rounds left out
        _check(estimates, f"static:{n}", truth, np.full(len(truth["a_d"]), n),
               np.full(len(truth["a_d"]), PARAMS.cost[n] + PARAMS.fixed_cost))


def test_full_al_is_the_mean_of_a_d_plus_one_and_ar_is_one(estimates, synthetic):
    truth = synthetic[2]
    for category in CATEGORIES:
        sel = truth["category"] == category
        assert _row(estimates, "full", category)["al"] == pytest.approx((truth["a_d"][sel] + 1).mean(), rel=1e-12)
        ar = _row(estimates, "ar", category)
        assert (ar["al"], ar["mean_w"], ar["sr"]) == (1.0, 1.0, 1.0)
        assert ar["tps"] == pytest.approx(1 / _ar_seconds(), rel=1e-12)


def test_average_rows_are_means_over_categories(estimates):
    for policy in ("ar", "static:5", "hybridspec"):
        per = estimates.filter((pl.col("policy") == policy) & (pl.col("category") != AVERAGE))
        avg = _row(estimates, policy, AVERAGE)
        for column in ("al", "mean_w", "tps", "sr"):
            assert avg[column] == pytest.approx(per[column].mean(), rel=1e-12)
        for column in ("rounds", "emitted", "est_seconds"):
            assert avg[column] == pytest.approx(per[column].sum(), rel=1e-12)


def _oracle(name: str, truth: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per round: Eq. 5 through the runtime's selector, then Eq. 6 and its latency written out."""
    policy, prm = make_policy(name, D, PARAMS), PARAMS
    w, seconds = [], []
    for conf, ent, fresh in zip(truth["conf"], truth["ent"], truth["fresh"]):
        w0, p_hat = policy.select(torch.tensor(conf, dtype=torch.float32), torch.tensor(ent, dtype=torch.float32))
        length, latency = w0, prm.cost[w0] + prm.fixed_cost
        if name == "hybridspec" and w0 < W:
            n_new = fresh[w0 - 1]  # the experts d_{w0} adds (draft position w0)
            row = prm.nbar_cond[w0]
            delta = prm.cost[w0 + 1] - prm.cost[w0] - prm.s + prm.eta * (row[min(n_new, len(row) - 1)]
                                                                          - prm.nbar_all[w0])
            latency += prm.s
            if float(p_hat[w0 - 1]) > prm.rho * delta:
                length, latency = w0 + 1, latency + delta
        w.append(length)
        seconds.append(latency)
    return np.array(w), np.array(seconds)


@pytest.mark.parametrize("name", ["nominal", "hybridspec", "ratio", "ratio4"])
def test_calibrated_policies_equal_the_round_by_round_oracle(estimates, synthetic, name):
    truth = synthetic[2]
    w, seconds = _oracle(name, truth)
    _check(estimates, name, truth, w, seconds)
    if name == "hybridspec":  # the correction both adds and declines tokens on these rounds
        nominal, _ = _oracle("nominal", truth)
        assert 0 < (w > nominal).sum() < (nominal < W).sum()


def test_campaign_choice_identity_and_policy_names(synthetic, tmp_path):
    db, artifact, _ = synthetic
    subset = estimate_policies(db, artifact, campaign="synth", policies=["static:4", "ar"])
    assert subset["policy"].unique(maintain_order=True).to_list() == ["static:4", "ar"]
    with pytest.raises(OfflineError, match=r"'nope' has no capture run \(campaigns with one: synth\)"):
        estimate_policies(db, artifact, campaign="nope")
    with pytest.raises(ValueError, match="unknown policy 'bogus'"):
        estimate_policies(db, artifact, policies=["bogus"])
    two = tmp_path / "two.duckdb"
    with Store(two) as store:
        _write_capture(store, "a", 40, seed=2)
        _write_capture(store, "b", 40, seed=3)
    with pytest.raises(OfflineError, match=r"2 capture runs \(a, b\)"):
        estimate_policies(two, artifact)
    other = tmp_path / "other.safetensors"
    save_artifact(other, PARAMS, model_id="sha256:other", drafter_id="sha256:d", device="cpu", store_digest="x",
                  diagnostics={})
    with pytest.raises(ArtifactError, match="sha256:other.*sha256:m"):
        estimate_policies(db, other)


def test_compare_with_measured_gives_both_and_the_difference(estimates):
    measured = (estimates.filter(pl.col("policy").is_in(["ar", "static:4"]))
                .with_columns(pl.col("tps") * 0.5, pl.col("al") + 0.25).reverse())
    table = compare_with_measured(estimates, measured)
    assert table.height == measured.height
    order = measured.filter(pl.col("category") != AVERAGE).select("policy", "category").rows()
    assert table.select("policy", "category").rows() == [*order[:3], ("static:4", AVERAGE), *order[3:],
                                                         ("ar", AVERAGE)]  # each policy's Average after its rows
    for row in table.iter_rows(named=True):
        assert row["tps_diff"] == pytest.approx(row["tps_measured"])  # estimate = 2 × measured
        assert row["al_diff"] == pytest.approx(-0.25) and row["sr_diff"] == 0.0
        assert row["mean_w_estimated"] == row["mean_w_measured"]


def test_the_average_difference_compares_the_same_categories(estimates):
    """Measured over 2 of the 3 captured categories: the comparison keeps those 2, and each Average
    row is the mean of the category rows above it on both sides (the Average's equal weights), so
    the Average of the difference is the mean of the categories' differences."""
    measured = restrict_categories(estimates.filter(pl.col("policy").is_in(["ar", "full", "static:4"]))
                                   .with_columns(pl.col("tps") * 0.5, pl.col("al") + 0.25), CATEGORIES[:2])
    table = compare_with_measured(estimates, measured)
    assert set(table["category"]) == {*CATEGORIES[:2], AVERAGE} and missing_categories(estimates, measured) == []
    for policy in ("ar", "full", "static:4"):
        rows = table.filter(pl.col("policy") == policy)
        per, (average,) = rows.filter(pl.col("category") != AVERAGE), rows.filter(pl.col("category") == AVERAGE).rows(
            named=True)
        for m in METRICS:
            assert average[f"{m}_diff"] == pytest.approx(per[f"{m}_diff"].mean(), rel=1e-12, abs=1e-12)
            assert average[f"{m}_measured"] == pytest.approx(_row(measured, policy, AVERAGE)[m], rel=1e-12)
            assert average[f"{m}_estimated"] == pytest.approx(per[f"{m}_estimated"].mean(), rel=1e-12)
    assert missing_categories(measured, estimates) == [CATEGORIES[2]]


def test_categories_keep_their_rounds_and_average_over_them(estimates, synthetic):
    db, artifact, _ = synthetic
    kept = estimate_policies(db, artifact, policies=["ar", "full", "hybridspec"], categories=CATEGORIES[1:])
    assert set(kept["category"]) == {*CATEGORIES[1:], AVERAGE}
    want = restrict_categories(estimates.filter(pl.col("policy").is_in(["ar", "full", "hybridspec"])), CATEGORIES[1:])
    assert kept.select("policy", "category").rows() == want.select("policy", "category").rows()
    for column in ESTIMATE_COLUMNS[2:]:  # the same rounds replayed: the same rows, Average over 2 categories
        assert kept[column].to_list() == pytest.approx(want[column].to_list(), rel=1e-12)
    with pytest.raises(OfflineError, match=r"no untruncated rounds of categories docs \(its categories: code, "
                                           r"prose, tests\)"):
        estimate_policies(db, artifact, categories=["docs"])


def test_ar_uses_the_measured_ar_steps_of_the_fixed_pass(tmp_path):
    """With w = 1 rows in the campaign's fixed pass, an ar step costs their mean (truncated rows
    left out), and every SR is relative to it."""
    with Store(tmp_path / "s.duckdb") as store:
        _write_capture(store, "synth", 120, seed=3)
        run = store.start_run(dataclasses.replace(_spec(), pass_name="fixed"))
        steps = [700.0, 900.0, 800.0]
        rows = [dict(run_id=run, w=1, prompt_id="p0", round_idx=j, executed_w=1, accepted=0, emitted=1,
                     truncated=False, latency_us=us) for j, us in enumerate(steps)]
        rows.append(dict(run_id=run, w=1, prompt_id="p0", round_idx=3, executed_w=1, accepted=0, emitted=1,
                         truncated=True, latency_us=1e9))
        store.commit_unit(run, "fixed", {"fixed_length_timings": rows})
    save_artifact(tmp_path / "a.safetensors", PARAMS, model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                  store_digest="x", diagnostics={})
    frame = estimate_policies(tmp_path / "s.duckdb", tmp_path / "a.safetensors", policies=["ar", "static:4"])
    ar_tps = 1 / (np.mean(steps) * 1e-6)
    for category in CATEGORIES:
        assert _row(frame, "ar", category)["tps"] == pytest.approx(ar_tps, rel=1e-12)
        static = _row(frame, "static:4", category)
        assert static["sr"] == pytest.approx(static["tps"] / ar_tps, rel=1e-12)
