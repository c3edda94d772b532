"""Estimators of a point's result (sgdsweep.sim.results) that are not plain replica means."""

from __future__ import annotations

import numpy as np

from sgdsweep.sim.results import JACKKNIFE_GROUPS, jackknife_se


def test_jackknife_of_a_mean_is_its_standard_error():
    """With at most JACKKNIFE_GROUPS replicas every group is one replica (delete-one jackknife),
    and for a linear statistic that is exactly the usual SD/√R."""
    x = np.random.default_rng(1).normal(size=(20, 3))
    se = jackknife_se(lambda m: float(m @ [1.0, -2.0, 0.5]), (x,))
    assert np.isclose(se, np.std(x @ [1.0, -2.0, 0.5], ddof=1) / np.sqrt(20), rtol=1e-12)
    assert np.isnan(jackknife_se(lambda m: float(m[0]), (x[:1],)))


def test_grouped_jackknife_matches_the_spread_of_a_nonlinear_statistic():
    """A norm of a difference of two replica means (the shape of the FDR residual), 1000 replicas
    in 32 groups: over 300 independent ensembles the mean jackknife SE is the statistic's actual
    standard deviation (measured 1.04; the relative error of that SD is ≈ 4 %; the jackknife
    without its (G−1) factor gives 0.19)."""
    rng = np.random.default_rng(7)
    a0, b0 = np.array([[1.0, 0.3], [0.3, 2.0]]), np.array([[0.5, 0.0], [0.0, 1.5]])

    def stat(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    values, ses = [], []
    for _ in range(300):
        a = a0 + rng.normal(scale=2.0, size=(1000, 2, 2))
        b = b0 + rng.normal(scale=1.0, size=(1000, 2, 2))
        values.append(stat(a.mean(axis=0), b.mean(axis=0)))
        ses.append(jackknife_se(stat, (a, b)))
    assert JACKKNIFE_GROUPS == 32
    assert abs(np.mean(ses) / np.std(values, ddof=1) - 1) < 0.15, (np.mean(ses), np.std(values, ddof=1))


def test_the_burn_in_of_the_sde_is_counted_in_the_relaxation_times_of_its_own_step():
    """``burn_in_relaxations`` of ``method: sde`` counts the relaxation of its Euler step dt =
    dt_over_lr·λ (1/dt_over_lr integrator steps per SGD step), not of the SGD map: the same for
    λk ≤ 1 (τ = 1/(λk) steps either way), shorter above, and finite beyond λk = 2 where the SGD
    map is unstable but the SDE is not. Curvatures 1 and 0.5, burn-in 10 steps."""
    import pytest

    from sgdsweep.models import get_model
    from sgdsweep.sim.results import burn_in_relaxations

    problem = get_model("quadratic").make_problem({"model": "quadratic", "curvatures": [1.0, 0.5],
                                                   "noise_cov": [1.0, 1.0]})
    sgd = {"momentum": 0.0, "method": "sgd", "dt_over_lr": 1.0}
    sde = {**sgd, "method": "sde", "dt_over_lr": 0.1}
    assert burn_in_relaxations(problem, {**sgd, "lr": 0.5}, 10) == pytest.approx(10 * 0.25)  # τ = 1/(λ k_min) = 4
    assert burn_in_relaxations(problem, {**sde, "lr": 0.5}, 10) == pytest.approx(10 * 0.25)
    assert burn_in_relaxations(problem, {**sgd, "lr": 1.5}, 10) == pytest.approx(10 * 0.5)  # ρ = |1 − 1.5| = 0.5
    assert burn_in_relaxations(problem, {**sde, "lr": 1.5}, 10) == pytest.approx(10 * 0.75)  # τ = 1/(1.5 · 0.5)
    assert burn_in_relaxations(problem, {**sgd, "lr": 2.5}, 10) is None
    assert burn_in_relaxations(problem, {**sde, "lr": 2.5}, 10) == pytest.approx(10 * 1.25)
    assert burn_in_relaxations(problem, {**sde, "lr": 25.0}, 10) is None  # dt·k = 2.5: the Euler step is unstable


def test_four_relaxation_times_leave_e_minus_4_of_the_offset_and_up_to_five_times_that_with_momentum():
    """docs/physics.md §8: after a burn-in of SHORT_BURN_IN (4) relaxation times 1/(1 − ρ) the
    noise-free update has kept at most e⁻⁴ of a start's offset without momentum (ρᴮ ≤ e^(−B(1−ρ)));
    at critical damping, λk = (1 − √μ)², the double root leaves (1 + B(1 − ρ))ρᴮ, up to 5e⁻⁴
    as μ → 1 (a start at rest: w₋₁ = w₀)."""
    from sgdsweep.models.base import relaxation_from_curvatures

    def kept(k: float, lr: float, mu: float) -> float:
        tau = relaxation_from_curvatures(np.array([k]), lr, mu)
        step = np.array([[1 + mu - lr * k, -mu], [1.0, 0.0]])
        return abs((np.linalg.matrix_power(step, int(np.ceil(4 * tau))) @ [1.0, 1.0])[0])

    for lr in (0.1, 0.5, 1.0, 1.5):
        assert kept(1.0, lr, 0.0) <= np.exp(-4)
    critical = {mu: kept(1.0, (1 - np.sqrt(mu)) ** 2, mu) / np.exp(-4) for mu in (0.5, 0.9, 0.99)}
    assert 2 < critical[0.5] < critical[0.9] < critical[0.99] < 5, critical
    assert critical[0.99] > 4.9, critical
