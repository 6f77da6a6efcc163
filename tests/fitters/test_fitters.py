"""Fitters recover known parameters from synthetic data; a broken fitter fails the same checks."""

from __future__ import annotations

import numpy as np
import pytest

from hybridspec.fitters.acceptance import AcceptanceFitter, conditional_rows, held_out_report
from hybridspec.fitters.cost import QuadraticCost, Slope
from hybridspec.fitters.rate import dinkelbach, expected_tokens, pooled_throughput, select_lengths
from hybridspec.fitters.routing import RoutingTables
from tests.fitters.synthetic import rounds

TOL_C = 0.03  # mean |ĉ − c| over the rows at risk


def _conditional_error(fitter, confidence, entropy, truth, accepted_full):
    mask, _ = conditional_rows(accepted_full, confidence.shape[1])
    return float(np.abs(fitter.predict_conditional(confidence, entropy) - truth)[mask].mean())


def test_acceptance_model_recovers_the_conditionals_and_needs_entropy():
    conf, ent, _, a_d = rounds(6000, seed=1)
    test = rounds(3000, seed=2)
    fitter = AcceptanceFitter().fit(conf, ent, a_d)
    assert _conditional_error(fitter, *test) < TOL_C
    blind = AcceptanceFitter().fit(conf, np.ones_like(ent), a_d)  # a fitter that ignores entropy
    assert _conditional_error(blind, test[0], np.ones_like(test[1]), test[2], test[3]) > TOL_C
    report = held_out_report(fitter, test[0], test[1], test[3])
    assert report["full"]["log_loss"] < report["isotonic"]["log_loss"] < report["raw"]["log_loss"]
    assert all(np.all(np.diff(x) >= 0) for x in fitter.iso_x_)


def _test_log_loss(fitter, confidence, entropy, accepted_full) -> float:
    return held_out_report(fitter, confidence, entropy, accepted_full)["full"]["log_loss"]


def test_auto_keeps_the_isotonic_stage_only_where_cross_validation_says_it_helps():
    # the truth's calibration is the identity: on a small capture the isotonic steps only overfit
    conf, ent, _, a_d = rounds(150, seed=4)
    groups = np.arange(len(a_d)) // 5  # 30 "prompts" of 5 rounds
    test = rounds(4000, seed=5)
    auto = AcceptanceFitter(isotonic="auto").fit(conf, ent, a_d, groups=groups)
    forced = AcceptanceFitter(isotonic=True).fit(conf, ent, a_d)
    assert not auto.isotonic_used_ and auto.cv_log_loss_["identity"] < auto.cv_log_loss_["isotonic"]
    assert all(np.array_equal(x, [0.0, 1.0]) for x in auto.iso_x_)  # the identity, in the artifact's layout
    assert _test_log_loss(auto, test[0], test[1], test[3]) < _test_log_loss(forced, test[0], test[1], test[3])
    # a drafter whose confidence is a steep, non-logistic function of the truth: the isotonic stage is needed
    def steep(n, seed):
        c, h, _, _ = rounds(n, seed=seed)
        rng = np.random.default_rng(seed + 100)
        truth = np.where(c > 0.6, 0.95, 0.05)  # acceptance jumps at confidence 0.6
        return c, h, np.cumprod(rng.random(c.shape) < truth, axis=1).sum(axis=1)
    conf, ent, a_d = steep(3000, 6)
    c_test, h_test, a_test = steep(3000, 7)
    auto = AcceptanceFitter(isotonic="auto").fit(conf, ent, a_d, groups=np.arange(len(a_d)) // 20)
    identity = AcceptanceFitter(isotonic=False).fit(conf, ent, a_d)
    assert auto.isotonic_used_ and auto.cv_log_loss_["isotonic"] < auto.cv_log_loss_["identity"]
    assert _test_log_loss(auto, c_test, h_test, a_test) < _test_log_loss(identity, c_test, h_test, a_test)
    assert AcceptanceFitter(isotonic="auto").fit(conf, ent, a_d, groups=np.zeros(len(a_d))).cv_log_loss_ is None
    with pytest.raises(ValueError, match="isotonic"):
        AcceptanceFitter(isotonic="sometimes")


def test_held_out_report_gives_the_paired_difference_with_its_error():
    conf, ent, _, a_d = rounds(2000, seed=8)
    test = rounds(500, seed=9)
    fitter = AcceptanceFitter().fit(conf, ent, a_d)
    report = held_out_report(fitter, test[0], test[1], test[3])
    paired = report["full_vs_raw"]
    assert paired["mean"] == pytest.approx(report["full"]["log_loss"] - report["raw"]["log_loss"], abs=1e-9)
    assert paired["rows"] == report["raw"]["rows"] and 0 < paired["se"] < abs(paired["mean"])


def test_unfitted_use_is_guarded():
    with pytest.raises(RuntimeError, match="not fitted"):
        AcceptanceFitter().predict_conditional(np.zeros((1, 15)), np.zeros((1, 15)))


def test_quadratic_cost_and_slopes_come_back():
    rng = np.random.default_rng(3)
    w = np.repeat(np.arange(2, 17), 40)
    latency = 8e-3 + 4e-4 * w + 3e-5 * w**2 + rng.normal(0, 2e-4, w.size)
    cost = QuadraticCost().fit(w, latency)
    assert cost.coef_ == pytest.approx([8e-3, 4e-4, 3e-5], rel=0.1, abs=2e-5)
    assert cost.conf_int_[2][0] < 3e-5 < cost.conf_int_[2][1] and cost.r2_ > 0.9 and not cost.warnings_
    assert cost.fixed_cost_ == pytest.approx(8e-3, rel=0.05)
    assert cost.table(16)[16] == pytest.approx(4e-4 * 16 + 3e-5 * 256, rel=0.05) and cost.table(16)[1] == 0
    u = np.repeat(np.arange(1, 17), 30)
    s = Slope(name="s").fit(u, 5e-4 + 2e-5 * u + rng.normal(0, 1e-6, u.size))
    assert s.slope_ == pytest.approx(2e-5, rel=0.05) and s.conf_int_[0] < 2e-5 < s.conf_int_[1]
    n = np.repeat(np.arange(8, 129, 8), 20)
    eta = Slope(name="eta").fit(n, 1e-4 + 4.18e-6 * n + rng.normal(0, 5e-6, n.size))
    assert eta.slope_ == pytest.approx(4.18e-6, rel=0.05) and eta.correlation_ > 0.99


def test_flat_or_noisy_costs_warn():
    """A slope that is not positive warns; a noisy fit records its low R² without a warning (the
    fit-quality checks judge R² under the run's thresholds)."""
    rng = np.random.default_rng(4)
    w = np.repeat(np.arange(2, 17), 10)
    noisy = QuadraticCost().fit(w, 1e-2 + rng.normal(0, 1e-3, w.size))
    assert noisy.r2_ < 0.5 and not any("R²" in m for m in noisy.warnings_)
    falling = Slope(name="eta").fit(np.arange(10), 1.0 - 0.1 * np.arange(10))
    assert any("not positive" in m for m in falling.warnings_)


def _monotone_optimum(w, latency) -> float:
    """The least squared error over quadratics with L'(0) ≥ 0, L'(16) ≥ 0 when the plain fit breaks
    one: the optimum then lies on L'(0) = 0, L'(16) = 0 or both (a constant), each an
    equality-constrained least squares solved by substitution b = −2c·x."""
    candidates = [np.array([latency.mean(), 0.0, 0.0])]
    for x in (0.0, 16.0):
        (a, c), *_ = np.linalg.lstsq(np.column_stack((np.ones_like(w), w * w - 2 * x * w)), latency, rcond=None)
        candidates.append(np.array([a, -2 * x * c, c]))
    feasible = [z for z in candidates if z[1] >= -1e-12 and z[1] + 32 * z[2] >= -1e-12]
    return min(_sse(z, w, latency) for z in feasible)


def _sse(coef, w, y):
    return float(np.sum((y - (coef[0] + coef[1] * w + coef[2] * w * w)) ** 2))


def _medians(w, y):
    lengths = np.unique(w)
    return lengths, np.array([np.median(y[w == x]) for x in lengths])


def test_stalled_timings_refit_as_non_decreasing_and_rho_converges():
    """A busy machine's quick fixed pass: rising latency, but stalled rounds at w = 6-8 and fast ones
    at the long end bend the least-squares quadratic down (the shape that once stopped `fit`)."""
    rng = np.random.default_rng(6)
    w = np.repeat(np.array([2, 4, 6, 8, 10, 12, 14, 16.0]), 6)
    latency = 11e-3 + 6e-4 * w + rng.normal(0, 2e-4, w.size)
    latency[(w >= 6) & (w <= 8)] += 9e-3  # stalls
    latency[w >= 14] -= 8e-3
    w, latency = _medians(w, latency)  # the fit is over per-length medians
    unconstrained = np.polyfit(w, latency, 2)[::-1]
    assert unconstrained[1] + 2 * unconstrained[2] * 16 < 0  # the plain fit does fall
    cost = QuadraticCost().fit(w, latency)
    assert cost.constrained_ and any("non-decreasing" in m for m in cost.warnings_)
    grid = np.linspace(2, 16, 141)
    assert np.all(np.diff(cost.fixed_cost_ + cost.cost(grid)) >= -1e-12)
    # the plain fit is infeasible, so the optimum has L'(0) = 0, L'(16) = 0 or both (a constant)
    assert _sse(cost.coef_, w, latency) == pytest.approx(_monotone_optimum(w, latency), rel=1e-9)
    # ρ converges on the refitted curve, and to a throughput between the shortest and longest length's
    prefix = np.clip(rng.uniform(0.2, 1.0, (300, 15)).cumprod(axis=1), 0, 1)
    rho, _ = dinkelbach(prefix, cost.table(16), cost.fixed_cost_, range(2, 17))
    gain = expected_tokens(prefix)
    assert rho >= max(gain[:, w0].sum() / (cost.table(16)[w0] + cost.fixed_cost_) / len(gain) for w0 in (2, 16)) - 1e-9


def test_rising_costs_keep_the_least_squares_fit():
    rng = np.random.default_rng(7)
    w = np.repeat(np.arange(2, 17.0), 20)
    latency = 8e-3 + 1e-4 * w - 2e-6 * w**2 + rng.normal(0, 1e-4, w.size)  # concave but rising on [2, 16]
    cost = QuadraticCost().fit(w, latency)
    assert not cost.constrained_ and cost.coef_ == pytest.approx(np.polyfit(*_medians(w, latency), 2)[::-1], rel=1e-6)


def test_the_curve_holds_up_to_the_longest_selectable_length_not_the_longest_measured():
    # a short capture truncates long verifications: only w ≤ 8 is measured, the selector chooses up to 16
    rng = np.random.default_rng(11)
    w = np.repeat(np.arange(2, 9.0), 20)
    latency = 8e-3 + 2e-3 * w - 1.2e-4 * w**2 + rng.normal(0, 1e-5, w.size)  # rising on [2, 8], falls past 8.3
    plain = QuadraticCost().fit(w, latency)
    assert not plain.constrained_  # on the measured range alone nothing is wrong …
    assert plain.fixed_cost_ + plain.cost(np.array([16.0]))[0] < plain.fixed_cost_ + plain.cost(np.array([8.0]))[0]
    cost = QuadraticCost().fit(w, latency, max_length=16)  # … but the curve is used up to 16
    assert cost.constrained_
    grid = np.linspace(2, 16, 141)
    assert np.all(np.diff(cost.fixed_cost_ + cost.cost(grid)) >= -1e-12) and cost.fixed_cost_ + cost.cost(grid).min() > 0
    prefix = np.clip(rng.uniform(0.2, 1.0, (300, 15)).cumprod(axis=1), 0, 1)
    rho, _ = dinkelbach(prefix, cost.table(16), cost.fixed_cost_, range(2, 17))
    assert rho > 0


def test_the_refitted_cost_of_every_length_is_non_negative():
    """Per-length medians of a quick CPU fixed pass (ms): the plain fit falls on [2, 9]; a refit that
    only keeps L non-decreasing on [2, 16] may fall on [0, 2], leaving C_tgt(w) = L(w) − L(0) < 0."""
    w = np.arange(2, 17, 2.0)
    latency = 1e-3 * np.array([39.936, 22.312, 18.403, 44.567, 24.803, 20.546, 48.451, 22.652])
    cost = QuadraticCost().fit(w, latency, max_length=16)
    assert cost.constrained_ and any("non-decreasing" in m for m in cost.warnings_)
    table = cost.table(16)
    assert np.all(table[2:] >= 0) and np.all(np.diff(table[2:]) >= -1e-15)
    grid = np.linspace(0, 16, 161)
    assert np.all(cost.cost(grid) >= -1e-15) and np.all(np.diff(cost.fixed_cost_ + cost.cost(grid)) >= -1e-15)
    assert _sse(cost.coef_, w, latency) == pytest.approx(_monotone_optimum(w, latency), rel=1e-9)


def test_a_plain_fit_below_its_value_at_zero_is_refitted():
    """Rising on [2, 16] and positive at 2, but with b + 2c < 0: C_tgt(2) = 2b + 4c < 0."""
    w = np.arange(2, 17.0)
    latency = 1e-2 - 2e-3 * w + 6e-4 * w * w  # L'(2) = 4e-4 > 0, C_tgt(2) = -1.6e-3
    cost = QuadraticCost().fit(w, latency, max_length=16)
    assert cost.constrained_ and any("C_tgt(2) < 0" in m for m in cost.warnings_)
    assert np.all(cost.table(16)[2:] >= 0) and cost.coef_[1] >= 0


def test_routing_tables_follow_the_definition():
    rng = np.random.default_rng(5)
    D, k = 15, 2
    cap_pos = np.repeat(np.arange(1, D + 1), 200)
    cap_n0 = rng.integers(0, k + 1, cap_pos.size)
    pos = np.repeat(np.arange(1, D + 1), 300)
    n0 = rng.choice(k + 1, pos.size, p=[0.6, 0.3, 0.1])
    later = 2.0 + 9.0 * n0 + rng.normal(0, 0.5, pos.size)  # ~9 later pairs per new Layer-0 expert
    tables = RoutingTables().fit(cap_pos, cap_n0, pos, n0, later, D, k)
    for i in (1, 7, 15):
        assert tables.nbar_all_[i] == pytest.approx(cap_n0[cap_pos == i].mean() + later[pos == i].mean())
        for n in range(k + 1):
            assert tables.nbar_cond_[i, n] == pytest.approx(n + 2.0 + 9.0 * n, abs=0.4)
            assert tables.cell_counts_[i, n] == int(((pos == i) & (n0 == n)).sum())
    thin = RoutingTables(min_cell=10_000).fit(cap_pos, cap_n0, pos, n0, later, D, k)
    assert thin.fitted_cells_[1:D + 1].all()
    assert thin.nbar_cond_[3, 2] == pytest.approx(2 + 2.0 + 18.0, abs=0.4)


def test_dinkelbach_equals_brute_force_over_rho():
    conf, ent, truth, _ = rounds(800, seed=6)
    prefix = np.cumprod(truth, axis=1)
    cost = np.array([0, 0] + [4e-4 * w + 3e-5 * w * w for w in range(2, 17)])
    lengths, fixed = np.arange(2, 17), 8e-3
    rho, iterations = dinkelbach(prefix, cost, fixed, lengths)
    gain = expected_tokens(prefix)
    grid = np.linspace(rho * 0.2, rho * 3, 4000)
    best = max(pooled_throughput(gain, cost, fixed, select_lengths(gain, cost, lengths, r)) for r in grid)
    assert rho == pytest.approx(best, rel=1e-6)
    assert len(iterations) >= 2 and iterations[-1]["next_rho"] == pytest.approx(rho)
    fixed_16 = pooled_throughput(gain, cost, fixed, np.full(len(gain), 16))
    assert rho > fixed_16  # adapting the length beats always verifying W


def test_as_many_cells_as_coefficients_is_a_warning_not_a_numpy_error():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from numpy would fail the test
        cost = QuadraticCost().fit(np.repeat([2.0, 4.0, 8.0], 5), np.repeat([1e-3, 2e-3, 4e-3], 5))
        slope = Slope(name="s").fit(np.array([1.0, 1.0, 4.0, 4.0]), np.array([1.0, 1.2, 2.0, 2.1]))
    assert any("no residual degree of freedom" in m for m in cost.warnings_)
    assert any("no residual degree of freedom" in m for m in slope.warnings_)
    assert cost.coef_ == pytest.approx([0.0, 5e-4, 0.0], abs=1e-12)  # three points: the exact quadratic
