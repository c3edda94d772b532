"""The random-matrix theory of a degenerate eigenvalue pair against independent numerics.

Nothing here checks the module against itself. The density, its moments and the surmise are
integrated by ``scipy.integrate.quad``; the density is compared with the one-eigenvalue marginal
of the 2-eigenvalue Coulomb gas ``|x1 − x2| exp(−(x1² + x2²)/(2σ²))``, integrated numerically.
The Monte Carlo ensemble is the 2×2 GOE: real symmetric matrices with diagonal entries
N(0, σ²) and off-diagonal entry N(0, σ²/2), whose density ∝ exp(−Tr H²/(2σ²)) gives exactly
that Coulomb gas with the same σ; eigenvalues come from ``numpy.linalg.eigvalsh``. Tolerances are
a few standard errors, which are computed per replica (the two eigenvalues of one replica are
correlated) or by a bootstrap over replicas. Negative controls (independent Gaussian
eigenvalues, Poisson spacings) show that the same checks fail when the physics is wrong.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from sgdsweep.theory import rmt

SIGMA = 0.37  # weight²
X_M = 2.5  # weight²
N_REP = 40_000
Z_SE = 4.0  # tolerance in standard errors


def _goe_pairs(rng: np.random.Generator, n: int, sigma: float, x_m: float) -> np.ndarray:
    """Eigenvalues (n, 2) of x_m·I + H, H 2×2 real symmetric, Var H_ii = σ², Var H_12 = σ²/2."""
    h = np.empty((n, 2, 2))
    h[:, 0, 0] = rng.normal(0.0, sigma, n)
    h[:, 1, 1] = rng.normal(0.0, sigma, n)
    h[:, 0, 1] = h[:, 1, 0] = rng.normal(0.0, sigma / math.sqrt(2.0), n)
    return x_m + np.linalg.eigvalsh(h)


@pytest.fixture(scope="module")
def goe() -> np.ndarray:
    return _goe_pairs(np.random.default_rng(20240501), N_REP, SIGMA, X_M)


@pytest.fixture(scope="module")
def independent() -> np.ndarray:
    """Negative control: two independent N(x_m, σ²) eigenvalues per replica (no repulsion)."""
    return np.random.default_rng(7).normal(X_M, SIGMA, size=(N_REP, 2))


def _binder(x: np.ndarray) -> float:
    d = x - x.mean()
    return float(np.mean(d**4) / (3.0 * np.mean(d**2) ** 2) - 1.0)


def _binder_se(ev: np.ndarray) -> float:
    """Delta-method standard error of the pooled Binder cumulant of ev (replicas, 2).

    Influence function of U = m4/(3 m2²) − 1 with central moments about the pooled mean,
    summed within a replica (its two eigenvalues are correlated), variance across replicas.
    """
    d = ev - ev.mean()
    m2, m3, m4 = (float(np.mean(d**k)) for k in (2, 3, 4))
    inf_m2 = d**2 - m2
    inf_m4 = d**4 - m4 - 4.0 * m3 * d
    inf_u = inf_m4 / (3.0 * m2**2) - 2.0 * m4 / (3.0 * m2**3) * inf_m2
    psi = inf_u.sum(axis=1)
    return float(psi.std(ddof=1) / (2.0 * math.sqrt(ev.shape[0])))


def _bootstrap_binder_se(ev: np.ndarray, n_boot: int = 60, seed: int = 11) -> float:
    """Bootstrap (over replicas) standard error of the pooled Binder cumulant, a cross-check."""
    rng = np.random.default_rng(seed)
    n = ev.shape[0]
    vals = [_binder(ev[rng.integers(0, n, n)].ravel()) for _ in range(n_boot)]
    return float(np.std(vals, ddof=1))


# ---------------------------------------------------------------- density by quadrature


@pytest.mark.parametrize("sigma", [0.05, 0.37, 1.0, 13.0])
def test_density_normalised_variance_binder_by_quad(sigma):
    def moment(k):
        val, _ = integrate.quad(lambda x: x**k * rmt.pair_density(x, sigma), -np.inf, np.inf,
                                  epsabs=0.0, epsrel=1e-12, limit=200)
        return val

    m0, m1, m2, m4 = moment(0), moment(1), moment(2), moment(4)
    assert m0 == pytest.approx(1.0, rel=1e-10)
    assert abs(m1) < 1e-10 * sigma
    assert m2 == pytest.approx(1.5 * sigma**2, rel=1e-10)
    assert m4 == pytest.approx(23.0 / 4.0 * sigma**4, rel=1e-10)
    assert m4 / (3.0 * m2**2) - 1.0 == pytest.approx(-4.0 / 27.0, abs=1e-10)
    assert rmt.pair_variance(sigma) == pytest.approx(m2, rel=1e-10)
    assert rmt.BINDER_PAIR == pytest.approx(m4 / (3.0 * m2**2) - 1.0, abs=1e-10)


def test_density_is_marginal_of_two_eigenvalue_coulomb_gas():
    """ρ(x) = ∫ P(x, y) dy with P ∝ |x − y| exp(−(x² + y²)/(2σ²)), normalised numerically."""
    s = SIGMA

    def joint(y, x):
        return abs(x - y) * math.exp(-(x * x + y * y) / (2.0 * s * s))

    # normalisation over the triangle y < x, doubled by symmetry (the kink y = x is an edge)
    half, _ = integrate.dblquad(joint, -12 * s, 12 * s, -12 * s, lambda x: x, epsabs=0.0,
                                epsrel=1e-11)
    z = 2.0 * half
    for x in [0.0, 0.1, -0.3, 0.55, 1.2, -2.0]:
        # split at the kink y = x of |x − y|
        lo, _ = integrate.quad(joint, -np.inf, x, args=(x,), epsabs=0.0, epsrel=1e-12)
        hi, _ = integrate.quad(joint, x, np.inf, args=(x,), epsabs=0.0, epsrel=1e-12)
        marginal = (lo + hi) / z  # P(x1 = x); each eigenvalue has the same marginal
        assert rmt.pair_density(x, s) == pytest.approx(marginal, rel=1e-8)
    assert rmt.pair_density(np.array([-np.inf, np.inf]), s).tolist() == [0.0, 0.0]


def test_wigner_surmise_by_quad():
    norm, _ = integrate.quad(rmt.wigner_surmise_pdf, 0.0, np.inf, epsabs=0.0, epsrel=1e-12)
    mean, _ = integrate.quad(lambda t: t * rmt.wigner_surmise_pdf(t), 0.0, np.inf, epsabs=0.0,
                             epsrel=1e-12)
    assert norm == pytest.approx(1.0, rel=1e-11)
    assert mean == pytest.approx(1.0, rel=1e-11)  # s is normalised to unit mean
    for t in [0.0, 0.2, 0.8, 1.0, 1.7, 3.5]:
        cum, _ = integrate.quad(rmt.wigner_surmise_pdf, 0.0, t, epsabs=1e-14, epsrel=1e-12)
        assert rmt.wigner_surmise_cdf(t) == pytest.approx(cum, abs=1e-12)
    assert rmt.wigner_surmise_pdf(-1.0) == 0.0 and rmt.wigner_surmise_cdf(-1.0) == 0.0
    assert rmt.wigner_surmise_cdf(np.inf) == 1.0


# ---------------------------------------------------------------- Monte Carlo: 2×2 GOE


def test_mc_pooled_variance(goe, independent):
    for ev, expect_ok in [(goe, True), (independent, False)]:
        d = ev - ev.mean()
        per_rep = 0.5 * (d[:, 0] ** 2 + d[:, 1] ** 2)  # independent across replicas
        var, se = per_rep.mean(), per_rep.std(ddof=1) / math.sqrt(ev.shape[0])
        ok = abs(var - rmt.pair_variance(SIGMA)) < Z_SE * se
        assert ok == expect_ok, (var, se, rmt.pair_variance(SIGMA))


def test_mc_binder_cumulant(goe, independent):
    u, se = _binder(goe.ravel()), _binder_se(goe)
    assert abs(u - rmt.BINDER_PAIR) < Z_SE * se, (u, se)
    # the delta-method SE agrees with a bootstrap over replicas (60 resamples: ±~20 %)
    assert _bootstrap_binder_se(goe) == pytest.approx(se, rel=0.35)
    assert rmt.binder_cumulant(goe) == pytest.approx(u, rel=1e-12)
    # negative control: no repulsion, Gaussian δx → U₄ ≈ 0, many SE away from −4/27
    u0, se0 = _binder(independent.ravel()), _binder_se(independent)
    assert abs(u0) < Z_SE * se0, (u0, se0)
    assert abs(u0 - rmt.BINDER_PAIR) > 5 * Z_SE * se0


def test_mc_mean_spacing_and_wigner_surmise(goe, independent):
    spacing = np.abs(goe[:, 1] - goe[:, 0])
    se = spacing.std(ddof=1) / math.sqrt(spacing.size)
    assert abs(spacing.mean() - rmt.mean_spacing(SIGMA)) < Z_SE * se
    assert rmt.mean_spacing(SIGMA) == pytest.approx(math.sqrt(math.pi) * SIGMA)
    p = stats.kstest(spacing / spacing.mean(), rmt.wigner_surmise_cdf).pvalue
    assert p > 1e-3, p
    # negative controls: Poisson (exponential) spacings and independent-Gaussian spacings
    poisson = np.random.default_rng(3).exponential(1.0, 5000)
    assert stats.kstest(poisson / poisson.mean(), rmt.wigner_surmise_cdf).pvalue < 1e-6
    s_ind = np.abs(independent[:, 1] - independent[:, 0])
    assert stats.kstest(s_ind / s_ind.mean(), rmt.wigner_surmise_cdf).pvalue < 1e-6


def test_mc_density_shape_by_ks(goe, independent):
    """One randomly chosen eigenvalue per replica (independent draws) against the CDF of ρ."""
    grid = np.linspace(-10 * SIGMA, 10 * SIGMA, 20001)
    cdf = integrate.cumulative_simpson(rmt.pair_density(grid, SIGMA), x=grid, initial=0.0)
    assert cdf[-1] == pytest.approx(1.0, abs=1e-9)
    pick = np.random.default_rng(5).integers(0, 2, N_REP)

    def ks_p(ev):
        x = ev[np.arange(N_REP), pick] - X_M
        return stats.kstest(x, lambda t: np.interp(t, grid, cdf)).pvalue

    assert ks_p(goe) > 1e-3
    assert ks_p(independent) < 1e-6


# ---------------------------------------------------------------- pair_statistics


def test_pair_statistics_recovers_sigma(goe):
    st = rmt.pair_statistics(goe)
    n = goe.shape[0]
    assert st["n_replicas"] == n
    d = goe - goe.mean()
    per_rep = d[:, 0] ** 2 + d[:, 1] ** 2
    se_sigma2 = per_rep.std(ddof=1) * math.sqrt(n) / (3 * n - 1)
    se_sigma = se_sigma2 / (2 * SIGMA)
    assert abs(st["sigma"] - SIGMA) < Z_SE * se_sigma, (st["sigma"], se_sigma)
    spacing = np.abs(goe[:, 1] - goe[:, 0])
    se_sp = spacing.std(ddof=1) / math.sqrt(n) / math.sqrt(math.pi)
    assert abs(st["sigma_from_spacing"] - SIGMA) < Z_SE * se_sp
    assert abs(st["centre"] - X_M) < Z_SE * SIGMA / math.sqrt(2 * n)  # Var(pair centre) = σ²/2
    assert abs(st["binder"] - rmt.BINDER_PAIR) < Z_SE * _binder_se(goe)
    assert st["ks_pvalue"] > 1e-3 and 0.0 < st["ks_statistic"] < 0.02
    assert st["pooled_variance"] == pytest.approx(np.var(goe.ravel()), rel=1e-12)
    swapped = rmt.pair_statistics(goe[:, ::-1])
    assert swapped["sigma"] == pytest.approx(st["sigma"], rel=1e-12)
    assert swapped["ks_statistic"] == pytest.approx(st["ks_statistic"], rel=1e-12)


def test_pair_statistics_sigma_unbiased_at_small_n():
    """With 2 replicas σ̂² = SS/(3n − 1) is unbiased; pooled var/1.5 would be low by 1/(3n)."""
    rng = np.random.default_rng(99)
    n_rep, n_exp = 2, 1000
    est = np.array([rmt.pair_statistics(_goe_pairs(rng, n_rep, SIGMA, X_M))["sigma"] ** 2
                    for _ in range(n_exp)])
    mean, se = est.mean(), est.std(ddof=1) / math.sqrt(n_exp)
    assert abs(mean - SIGMA**2) < Z_SE * se, (mean, se)
    naive = (3 * n_rep - 1) / (3 * n_rep) * SIGMA**2  # E[pooled var]/1.5
    assert abs(mean - naive) > Z_SE * se


def test_pair_statistics_drops_nonfinite_rows(goe):
    ev = goe[:100].copy()
    ev[3, 0], ev[50, 1], ev[70, :] = np.nan, np.inf, -np.inf
    st = rmt.pair_statistics(ev)
    assert st["n_replicas"] == 97
    clean = np.delete(goe[:100], [3, 50, 70], axis=0)
    assert st["sigma"] == pytest.approx(rmt.pair_statistics(clean)["sigma"], rel=1e-12)


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf, "x", None])
def test_bad_sigma(bad):
    for f in (lambda: rmt.pair_density(0.1, bad), lambda: rmt.pair_variance(bad),
              lambda: rmt.mean_spacing(bad)):
        with pytest.raises(ValueError, match=r"sigma must .*got"):
            f()


@pytest.mark.parametrize("bad", [np.zeros(6), np.zeros((5, 3)), np.zeros((2, 2, 2)),
                                 np.full((4, 2), np.nan), [[1.0, 2.0]], np.ones((5, 2)),
                                 [["a", "b"]]])
def test_bad_eigenvalues(bad):
    with pytest.raises(ValueError, match="eigenvalues must"):
        rmt.pair_statistics(bad)


def test_bad_eigenvalues_message_names_shape():
    with pytest.raises(ValueError, match=r"shape \(replicas, 2\), got shape \(5, 3\)"):
        rmt.pair_statistics(np.zeros((5, 3)))


def test_constant_spread_but_zero_spacing_rejected():
    ev = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])  # spread, but every spacing is 0
    with pytest.raises(ValueError, match="eigenvalues must have a non-zero spacing"):
        rmt.pair_statistics(ev)


@pytest.mark.parametrize("bad", [[1.0], [2.0, 2.0, 2.0], [1.0, np.nan, 2.0], ["a"]])
def test_bad_binder_samples(bad):
    with pytest.raises(ValueError, match="samples must"):
        rmt.binder_cumulant(bad)
