"""`fit_campaign` on a synthetic store written from known parameters: every fitted quantity
comes back, and ρ is Dinkelbach's fixed point over the stored capture rounds."""

from __future__ import annotations

import numpy as np
import pytest

from hybridspec.fitters.campaign import FitError, fit_campaign
from hybridspec.fitters.rate import dinkelbach
from hybridspec.workbench.store import RunSpec, Store
from tests.fitters.synthetic import rounds

D, K = 15, 2
COST = (6e-3, 5e-4, 2e-5)  # a + b w + c w², seconds
S, ETA = 3e-5, 4e-6


def _spec(pass_name):
    return RunSpec(name="synth", pass_name=pass_name, model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                   dtype="float32", backend="torch")


def write_synthetic_store(path, n_rounds=2500, seed=0, noise=False, finished=True):
    """A campaign `synth` drawn from known parameters; `noise`: every timing pure noise instead
    (latencies that do not depend on w, u or the expert count); `finished`: every run finished (else
    every run still 'running', as a capture stopped before its last unit leaves it)."""
    rng = np.random.default_rng(seed)

    def timed(mean: float) -> float:  # µs
        return 1e6 * (rng.uniform(0.5, 1.5) * 5e-3 if noise else mean)

    conf, ent, _, a_d = rounds(n_rounds, seed=seed)
    with Store(path) as store:
        run = store.start_run(_spec("capture"))
        for p in range(n_rounds // 100):  # prompts of 100 rounds each
            sl = range(p * 100, (p + 1) * 100)
            rows = {"prompts": [dict(run_id=run, prompt_id=f"p{p}", category="c", split="calib", prompt_tokens=9)],
                    "rounds": [], "draft_positions": []}
            for r_i, r in enumerate(sl):
                rows["rounds"].append(dict(run_id=run, prompt_id=f"p{p}", round_idx=r_i, w0=16, u=16, w=16,
                                           accepted=int(a_d[r]), accepted_full=int(a_d[r]), emitted=int(a_d[r]) + 1,
                                           truncated=False, latency_us=1.0))
                for i in range(1, D + 1):
                    rows["draft_positions"].append(dict(
                        run_id=run, prompt_id=f"p{p}", round_idx=r_i, position=i, token_id=1,
                        confidence=float(conf[r, i - 1]), entropy=float(ent[r, i - 1]), accepted=bool(a_d[r] >= i),
                        new_l0_experts=int(rng.integers(0, K + 1))))
            store.commit_unit(run, f"p{p}", rows)
        run = store.start_run(_spec("fixed"))
        rows = [dict(run_id=run, w=w, prompt_id="p0", round_idx=j, executed_w=w, accepted=0, emitted=1, truncated=False,
                     latency_us=timed(COST[0] + COST[1] * w + COST[2] * w * w + rng.normal(0, 1e-4)))
                for w in range(2, 17) for j in range(20)]
        # ar steps (w = 1) far off the quadratic: the cost fit must leave them out
        rows += [dict(run_id=run, w=1, prompt_id="p0", round_idx=j, executed_w=1, accepted=0, emitted=1,
                      truncated=False, latency_us=1e6 * 10 * COST[0]) for j in range(20)]
        store.commit_unit(run, "fixed", {"fixed_length_timings": rows})
        run = store.start_run(_spec("stage0"))
        rows = [dict(run_id=run, u=u, sample_idx=j, context_tokens=50, latency_us=timed(2e-4 + S * u + rng.normal(0, 1e-6)))
                for u in range(1, 17) for j in range(10)]
        store.commit_unit(run, "stage0", {"stage0_timings": rows})
        run = store.start_run(_spec("moe"))
        rows = [dict(run_id=run, layer=0, n_rows=16, n_assignments=32, n_distinct_experts=n, sample_idx=j,
                     latency_us=timed(1e-4 + ETA * n + rng.normal(0, 2e-6))) for n in range(2, 33, 2) for j in range(10)]
        store.commit_unit(run, "moe", {"moe_bench": rows})
        run = store.start_run(_spec("routing"))
        rows = []
        for r_i in range(400):
            for i in range(1, D + 1):
                n0 = int(rng.choice(K + 1, p=[0.5, 0.35, 0.15]))
                rows.append(dict(run_id=run, prompt_id="p0", round_idx=r_i, position=i, new_l0_experts=n0,
                                 new_later_pairs=int(round(1 + 9 * n0 + rng.normal(0, 1)))))
        store.commit_unit(run, "routing", {"routing_positions": rows})
        for (run,) in store.query("SELECT run_id FROM runs") if finished else ():
            store.finish_shard(run, 0)
    return conf, ent, a_d


def test_synthetic_campaign_comes_back(tmp_path):
    db = tmp_path / "synth.duckdb"
    conf, ent, a_d = write_synthetic_store(db)
    fit = fit_campaign(db, "synth")
    assert fit.draft_len == D and fit.model_id == "sha256:m" and fit.drafter_id == "sha256:d"
    assert fit.cost.coef_ == pytest.approx(COST, rel=0.1, abs=3e-5)
    assert fit.cost.fixed_cost_ == pytest.approx(COST[0], rel=0.05)
    assert fit.stage0.slope_ == pytest.approx(S, rel=0.05) and fit.moe.slope_ == pytest.approx(ETA, rel=0.05)
    assert fit.routing.nbar_cond_[5, 1] == pytest.approx(1 + 1 + 9, abs=0.5)
    assert fit.metrics["full"]["log_loss"] < fit.metrics["raw"]["log_loss"]
    rho, _ = dinkelbach(fit.acceptance.predict_prefix(conf, ent), fit.cost.table(D + 1), fit.cost.fixed_cost_,
                        range(2, D + 2))
    assert fit.rho == pytest.approx(rho, rel=1e-9)
    assert not fit.warnings


def test_missing_pass_is_named(tmp_path):
    db = tmp_path / "partial.duckdb"
    with Store(db) as store:
        store.finish_shard(store.start_run(_spec("capture")), 0)
    with pytest.raises(FitError, match="'synth' has no fixed run"):
        fit_campaign(db, "synth")


def test_a_dinkelbach_iteration_that_does_not_converge_is_recorded(tmp_path, monkeypatch):
    import hybridspec.fitters.campaign as campaign

    db = tmp_path / "synth.duckdb"
    write_synthetic_store(db, n_rounds=500)
    one_step = lambda *args, **kwargs: dinkelbach(*args, **{**kwargs, "max_iter": 1})  # noqa: E731
    monkeypatch.setattr(campaign, "dinkelbach", one_step)
    fit = fit_campaign(db, "synth")
    assert not fit.converged and len(fit.iterations) == 1
    assert "C_tgt(w) in ms is 2: " in fit.convergence_note and "--threads 1" in fit.convergence_note
    assert fit.diagnostics()["dinkelbach_converged"] is False


def test_timings_are_fitted_on_medians_with_the_spread_kept(tmp_path):
    db = tmp_path / "synth.duckdb"
    write_synthetic_store(db, n_rounds=500)
    with Store(db) as store:  # stalls: a third of the w = 9 rounds take 50 ms more
        store.con.execute("UPDATE fixed_length_timings SET latency_us = latency_us + 5e4 WHERE w = 9 AND round_idx % 3 = 0")
    fit = fit_campaign(db, "synth")
    assert fit.cost.coef_ == pytest.approx(COST, rel=0.1, abs=3e-5)  # the median ignores the stalls
    cell = next(c for c in fit.cost.cells_ if c["w"] == 9)
    assert cell["n"] == 20 and cell["q75"] > cell["median"] + 0.04  # the spread is kept
    assert fit.diagnostics()["cost"]["cells"] == fit.cost.cells_


@pytest.mark.parametrize("pass_name, update, message", [
    ("stage0", "device = 'cuda', dtype = 'bfloat16', host_gpu = 'NVIDIA H200'",
     r"the fixed run \(device cpu, dtype float32, host_gpu None\) and the stage0 run \(device cuda, dtype bfloat16, "
     r"host_gpu NVIDIA H200\) were timed on different settings"),
    ("routing", "model_id = 'sha256:other'",
     r"the capture run \(model_id sha256:m\) and the routing run \(model_id sha256:other\) measured different models"),
    ("fixed", "drafter_id = 'sha256:e'", r"\(drafter_id sha256:d\) and the fixed run \(drafter_id sha256:e\)"),
])
def test_runs_of_different_settings_are_not_fitted_together(tmp_path, pass_name, update, message):
    db = tmp_path / "mixed.duckdb"
    write_synthetic_store(db, n_rounds=300)
    with Store(db) as store:
        store.con.execute(f"UPDATE runs SET {update} WHERE pass = ?", [pass_name])
    with pytest.raises(FitError, match=message):
        fit_campaign(db, "synth")


def test_an_unfinished_run_is_not_fitted(tmp_path):
    """A capture stopped before its last unit leaves its runs 'running': fit names the run and the
    command that completes it, for the first unfinished pass."""
    db = tmp_path / "stopped.duckdb"
    write_synthetic_store(db, n_rounds=300, finished=False)
    with pytest.raises(FitError, match=r"the capture run of campaign 'synth' \(run \w+\) in \S+stopped.duckdb is "
                                       r"unfinished \(status 'running'\): .*`hybridspec capture --db \S+stopped.duckdb "
                                       r"--name synth --passes capture --resume`"):
        fit_campaign(db, "synth")
    with Store(db) as store:  # every pass but the last finished
        for (run,) in store.query("SELECT run_id FROM runs WHERE pass <> 'routing'"):
            store.finish_shard(run, 0)
    with pytest.raises(FitError, match=r"the routing run .* is unfinished .*--passes routing --resume`"):
        fit_campaign(db, "synth")


def test_one_shard_of_a_sharded_capture_is_not_fitted(tmp_path):
    """The store of `capture --shard 0/2` alone holds half of every run: fit names the shards finished
    and both ways to complete the run (merge the shard stores, or capture the missing shard)."""
    db = tmp_path / "shard0.duckdb"
    write_synthetic_store(db, n_rounds=300, finished=False)
    with Store(db) as store:
        store.con.execute("UPDATE runs SET shard_count = 2")
        store.con.execute("UPDATE run_shards SET shard_count = 2")
        for (run,) in store.query("SELECT run_id FROM runs"):
            store.finish_shard(run, 0)
        assert store.query("SELECT DISTINCT status FROM runs") == [("running",)]
    with pytest.raises(FitError, match=r"the capture run of campaign 'synth' .* is unfinished \(status 'running'\): "
                                       r"1 of 2 shards finished in this store; .*`hybridspec merge OUT "
                                       r"\S+shard0.duckdb SHARD_STORE\.\.\.`.*`hybridspec capture --db "
                                       r"\S+shard0.duckdb --name synth --passes capture --shard 1/2 --resume`"):
        fit_campaign(db, "synth")


@pytest.mark.parametrize("delete, message", [
    ("draft_positions", r"the capture run of campaign 'synth' .* has 300 complete rounds but no rows in table "
                        r"draft_positions"),
    ("draft_positions WHERE prompt_id = 'p1' AND round_idx = 4 AND position = 7",
     r"the capture run .*: 1 of 300 complete rounds lack some of draft positions 1…15 in table draft_positions"),
    ("rounds", r"the capture run .* has no complete \(untruncated, fully verified\) rounds in table rounds"),
    ("fixed_length_timings WHERE w >= 2", r"the fixed run of campaign 'synth' \(run \w+\) in \S+ has no usable rows "
                                          r"in table fixed_length_timings \(NOT truncated AND w >= 2\)"),
    ("stage0_timings", r"the stage0 run .* has no usable rows in table stage0_timings$"),
    ("moe_bench", r"the moe run .* has no usable rows in table moe_bench$"),
    ("routing_positions", r"the routing run .* has no usable rows in table routing_positions$"),
])
def test_an_empty_table_is_named_with_its_run(tmp_path, delete, message):
    db = tmp_path / "empty.duckdb"
    write_synthetic_store(db, n_rounds=300)
    with Store(db) as store:
        store.con.execute(f"DELETE FROM {delete}")
    with pytest.raises(FitError, match=message):
        fit_campaign(db, "synth")
