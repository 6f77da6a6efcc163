"""Estimates for a target whose acceptance cannot be measured: one pair's acceptance model with
another target's costs (`fitters.transfer`, `hybridspec estimate --costs`). ρ is Dinkelbach's fixed
point over the rounds with the new costs (scaling every cost by c divides it by c); static lengths
cost the other target's C_tgt + fixed; `ar` its measured step; the routing term draws each
position's new Layer-0 experts from the other target's routing pass."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hybridspec.artifacts.artifact import save_artifact
from hybridspec.cli import app
from hybridspec.evaluation.offline import CapturedRounds, with_routing
from hybridspec.fitters.campaign import FitError
from hybridspec.fitters.rate import dinkelbach
from hybridspec.fitters.transfer import transfer_costs, transfer_from_store
from hybridspec.runtime.acceptance import AcceptanceEstimator
from hybridspec.workbench.store import Store
from tests.evaluation.test_offline import CATEGORIES, D, PARAMS, _spec, _write_capture
from tests.runtime.helpers import policy_parameters

runner = CliRunner()
COSTS = dataclasses.replace(PARAMS, cost=tuple(10 * c for c in PARAMS.cost), fixed_cost=10 * PARAMS.fixed_cost,
                            eta=3e-3, s=1e-3, rho=1.0)
STEPS_US = (2000.0, 2400.0)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    path = tmp_path_factory.mktemp("transfer")
    with Store(path / "a.duckdb") as store:
        truth = _write_capture(store, "synth", 200, seed=4)
    with Store(path / "b.duckdb") as store:  # the other target: a capture (its identity), routing and ar steps
        _write_capture(store, "big", 20, seed=5)
        run = store.start_run(dataclasses.replace(_spec("big"), pass_name="routing"))
        store.commit_unit(run, "routing", {"routing_positions": [
            dict(run_id=run, prompt_id="q", round_idx=r, position=k, new_l0_experts=(r + k) % 3 + 5, new_later_pairs=0)
            for r in range(4) for k in range(1, D + 1)]})
        run = store.start_run(dataclasses.replace(_spec("big"), pass_name="fixed"))
        store.commit_unit(run, "fixed", {"fixed_length_timings": [
            dict(run_id=run, w=1, prompt_id="q", round_idx=j, executed_w=1, accepted=0, emitted=1, truncated=False,
                 latency_us=us) for j, us in enumerate(STEPS_US)]})
    save_artifact(path / "a.safetensors", PARAMS, model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                  store_digest="x", diagnostics={})
    save_artifact(path / "b.safetensors", COSTS, model_id="sha256:m", drafter_id="sha256:d", device="cuda",
                  store_digest="y", diagnostics={})
    return path, truth


def test_rho_is_the_fixed_point_with_the_new_costs(stores):
    _, truth = stores
    estimator = AcceptanceEstimator(PARAMS.acceptance)  # the runtime's evaluation of the same model
    prefix = np.stack([estimator.prefix(torch.tensor(c, dtype=torch.float32), torch.tensor(h, dtype=torch.float32)).numpy()
                       for c, h in zip(truth["conf"], truth["ent"])])
    combined, _ = transfer_costs(PARAMS, COSTS, truth["conf"], truth["ent"])
    want, _ = dinkelbach(prefix, np.asarray(COSTS.cost), COSTS.fixed_cost, COSTS.lengths)
    assert combined.rho == pytest.approx(want, rel=1e-5)
    assert combined.acceptance == PARAMS.acceptance and combined.cost == COSTS.cost and combined.eta == COSTS.eta
    own, _ = transfer_costs(PARAMS, PARAMS, truth["conf"], truth["ent"])
    assert combined.rho == pytest.approx(own.rho / 10, rel=1e-9)  # every cost × 10 → ρ / 10


def test_draft_lengths_must_agree(stores):
    path, truth = stores
    with pytest.raises(FitError, match="D = 15 .* D = 7"):
        transfer_costs(PARAMS, policy_parameters(7), truth["conf"], truth["ent"])
    with pytest.raises(FitError, match="has no capture run"):
        transfer_from_store(path / "a.duckdb", "nope", PARAMS, COSTS)


def test_routing_draws_from_the_other_targets_positions():
    n, samples = 50, [np.array([k, 10 * k]) for k in range(1, D + 1)]
    rounds = CapturedRounds("r", np.array(["c"] * n), np.zeros(n, dtype=np.int64), np.zeros((n, D)),
                            np.zeros((n, D)), np.zeros((n, D), dtype=np.int64))
    drawn = with_routing(rounds, samples, seed=3)
    for k in range(D):
        assert set(drawn.new_l0_experts[:, k]) <= set(samples[k]) and len(set(drawn.new_l0_experts[:, k])) == 2
    assert np.array_equal(drawn.new_l0_experts, with_routing(rounds, samples, seed=3).new_l0_experts)


def test_cli_estimate_with_another_targets_costs(stores):
    path, truth = stores
    args = ["estimate", "--db", str(path / "a.duckdb"), "--artifact", str(path / "a.safetensors"),
            "--policies", "ar,static:4,hybridspec", "--json"]
    own = runner.invoke(app, args)
    assert own.exit_code == 0, own.output
    combined = runner.invoke(app, [*args, "--costs", str(path / "b.safetensors"), "--costs-db", str(path / "b.duckdb")])
    assert combined.exit_code == 0, combined.output
    out = json.loads(combined.stdout)
    assert out["kind"] == "estimate with another target's costs" and "routing pass" in out["sources"]["routing"]
    rows = {(r["policy"], r["category"]): r for r in out["rows"]}
    ar_tps = 1 / (np.mean(STEPS_US) * 1e-6)
    for category in CATEGORIES:
        rounds = int((truth["category"] == category).sum())
        static = rows["static:4", category]
        assert static["est_seconds"] == pytest.approx(rounds * (COSTS.cost[4] + COSTS.fixed_cost), rel=1e-12)
        assert rows["ar", category]["tps"] == pytest.approx(ar_tps, rel=1e-12)
        assert static["sr"] == pytest.approx(static["tps"] / ar_tps, rel=1e-12)
    own_rows = {(r["policy"], r["category"]): r for r in json.loads(own.stdout)["rows"]}
    assert own_rows["static:4", "all"]["tps"] == pytest.approx(10 * rows["static:4", "all"]["tps"], rel=1e-12)
    alone = runner.invoke(app, [*args, "--costs", str(path / "b.safetensors")])
    assert alone.exit_code == 2 and "--costs and --costs-db go together" in " ".join(alone.output.split())
