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
