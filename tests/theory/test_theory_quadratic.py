"""The quadratic-loss and escape-time theory against independent numerics.

Nothing here is checked against the module itself: the stationary covariance is recomputed from
the (w, m) state-space form (the module uses (w_t, w_{t−1})), by brute-force iteration of the
second-moment recursion, and from Liu's Thm 2 equation; the transient from the covariance
recursion; Kramers' time from the exact mean first-passage time of 1-D Langevin dynamics
(quadrature) and from a direct simulation of SGD.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from scipy.integrate import cumulative_simpson, simpson

from sgdsweep.theory import escape as esc
from sgdsweep.theory import quadratic as qd

# 2×2 Hessian and noise covariance that do not commute ([K, C] ≠ 0)
K2 = np.array([[1.3, 0.4], [0.4, 0.5]])
C2 = np.array([[0.7, -0.3], [-0.3, 0.2]])
MOMENTA = [0.0, 0.3, 0.6, 0.9, -0.2]


def _wm_state(k: np.ndarray, lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """State matrix A and noise matrix B of z = (w, m): m' = μm + Kw + ξ, w' = w − λm'."""
    d = k.shape[0]
    eye = np.eye(d)
    a = np.block([[eye - lr * k, -lr * mu * eye], [k, mu * eye]])
    b = np.vstack([-lr * eye, eye])
    return a, b


def _sigma_wm_lyapunov(k, c, lr, mu):
    a, b = _wm_state(k, lr, mu)
    z = scipy.linalg.solve_discrete_lyapunov(a, b @ c @ b.T)
    return z[: k.shape[0], : k.shape[0]]


def _sigma_brute_force(k, c, lr, mu, max_doublings=60):
    """Sum the series Z = Σ_s A^s (B C Bᵀ) A^sᵀ of the recursion Z ← A Z Aᵀ + B C Bᵀ (state
    (w, m)) directly, by doubling: Z_{2n} = Z_n + A^n Z_n A^nᵀ, until A^n is negligible."""
    a, b = _wm_state(k, lr, mu)
    z = b @ c @ b.T
    for _ in range(max_doublings):
        if np.max(np.abs(a)) < 1e-20:
            return z[: k.shape[0], : k.shape[0]]
        z = z + a @ z @ a.T
        a = a @ a
    raise AssertionError("covariance series did not converge")


def test_inputs_do_not_commute():
    assert np.max(np.abs(K2 @ C2 - C2 @ K2)) > 0.1


@pytest.mark.parametrize("mu", MOMENTA)
def test_stationary_covariance_against_wm_state_space(mu):
    lr = 0.8
    ref = _sigma_wm_lyapunov(K2, C2, lr, mu)
    got = qd.stationary_covariance(K2, C2, lr, mu)
    np.testing.assert_allclose(got, ref, rtol=1e-8, atol=0)


@pytest.mark.parametrize("mu", [0.0, 0.5, -0.2])
def test_stationary_covariance_against_brute_force_iteration(mu):
    lr = 0.8
    ref = _sigma_brute_force(K2, C2, lr, mu)
    got = qd.stationary_covariance(K2, C2, lr, mu)
    np.testing.assert_allclose(got, ref, rtol=1e-8, atol=0)


@pytest.mark.parametrize("mu", MOMENTA)
def test_stationary_covariance_solves_liu_theorem_2(mu):
    """−(1+μ²)/(1−μ²)λ²KΣK + μ/(1−μ²)λ²(K²Σ + ΣK²) + (1−μ)λ(KΣ + ΣK) = λ²C."""
    lr, k, c = 0.8, K2, C2
    s = qd.stationary_covariance(k, c, lr, mu)
    lhs = (-(1 + mu**2) / (1 - mu**2) * lr**2 * k @ s @ k
           + mu / (1 - mu**2) * lr**2 * (k @ k @ s + s @ k @ k)
           + (1 - mu) * lr * (k @ s + s @ k))
    np.testing.assert_allclose(lhs, lr**2 * c, rtol=1e-8, atol=1e-12)


def test_commuting_case_liu_theorem_1():
    """[C, K] = 0, μ = 0: Σ = λ [K(2I − λK)]⁻¹ C."""
    lr = 0.6
    c = 0.3 * K2 @ K2 + 0.1 * np.eye(2)
    ref = lr * np.linalg.solve(K2 @ (2 * np.eye(2) - lr * K2), c)
    np.testing.assert_allclose(qd.stationary_covariance(K2, c, lr), ref, rtol=1e-8)


@pytest.mark.parametrize("mu", MOMENTA)
@pytest.mark.parametrize("lk", [0.01, 0.5, 1.0, 1.7])
def test_variance_1d_against_scalar_state_space(mu, lk):
    k, sigma2 = 2.0, 0.35
    lr = lk / k
    if _spectral_radius_wm(k, lr, mu) >= 1.0:  # λk = 1.7 > 2(1 + μ) at μ = −0.2
        assert qd.variance_1d(k, sigma2, lr, mu) == math.inf
        return
    ref = _sigma_wm_lyapunov(np.array([[k]]), np.array([[sigma2]]), lr, mu)[0, 0]
    assert qd.variance_1d(k, sigma2, lr, mu) == pytest.approx(ref, rel=1e-8)
    assert qd.stationary_covariance([[k]], [[sigma2]], lr, mu)[0, 0] == pytest.approx(ref, rel=1e-8)


def test_variance_1d_brute_force_recursion():
    k, sigma2, lr, mu = 1.5, 0.4, 0.9, 0.45
    ref = _sigma_brute_force(np.array([[k]]), np.array([[sigma2]]), lr, mu)[0, 0]
    assert qd.variance_1d(k, sigma2, lr, mu) == pytest.approx(ref, rel=1e-8)


def _spectral_radius_wm(k, lr, mu):
    a, _ = _wm_state(np.array([[k]]), lr, mu)
    return float(np.max(np.abs(np.linalg.eigvals(a))))


@pytest.mark.parametrize("mu", [0.0, 0.2, 0.37, 0.375])
def test_stability_boundary_diverges_below_0375(mu):
    k, lr = 2.75, 1.0  # λk = 2.75: stable iff μ > λk/2 − 1 = 0.375
    assert _spectral_radius_wm(k, lr, mu) >= 1.0 - 1e-12
    assert qd.variance_1d(k, 0.5, lr, mu) == math.inf
    assert np.all(np.isinf(qd.stationary_covariance([[k]], [[0.5]], lr, mu)))
    assert qd.training_loss([[k]], [[0.5]], lr, mu) == math.inf
    assert qd.training_loss_closed_form([[k]], [[0.5]], lr, mu) == math.inf


def test_stability_boundary_finite_at_05_and_diverges_towards_0375():
    k, lr, sigma2 = 2.75, 1.0, 0.5
    assert _spectral_radius_wm(k, lr, 0.5) < 1.0
    ref = _sigma_brute_force(np.array([[k]]), np.array([[sigma2]]), lr, 0.5)[0, 0]
    assert qd.variance_1d(k, sigma2, lr, 0.5) == pytest.approx(ref, rel=1e-8)
    np.testing.assert_allclose(qd.stationary_covariance([[k]], [[sigma2]], lr, 0.5), [[ref]],
                               rtol=1e-8)
    near = [qd.variance_1d(k, sigma2, lr, 0.375 + eps) for eps in (1e-2, 1e-4, 1e-6)]
    assert near[0] < near[1] < near[2] and near[2] > 1e3 * near[0]  # ~ 1/(μ − 0.375)


def test_unstable_or_flat_mode_gives_inf_matrix():
    # one eigenvalue of K with λk > 2, one k < 0, one k = 0: all unstable/non-stationary
    for k in ([[3.0, 0.0], [0.0, 1.0]], [[-0.5, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 1.0]]):
        s = qd.stationary_covariance(k, C2, 0.7)
        assert s.shape == (2, 2) and np.all(np.isinf(s))
        assert qd.training_loss(k, C2, 0.7) == math.inf
    assert qd.variance_1d(-1.0, 0.3, 0.1) == math.inf
    assert qd.variance_1d(0.0, 0.3, 0.1) == math.inf
    assert qd.variance_1d(1.0, 0.3, 0.1, momentum=1.0) == math.inf
    assert qd.continuous_variance_1d(0.0, 0.3, 0.1) == math.inf


@pytest.mark.parametrize("mu", MOMENTA)
def test_training_loss_and_liu_theorem_5_non_commuting(mu):
    """Thm 5 holds for non-commuting C with momentum (trace of Thm 2 against f(K))."""
    lr = 0.8
    sigma = _sigma_wm_lyapunov(K2, C2, lr, mu)
    ref = 0.5 * np.trace(K2 @ sigma)
    assert qd.training_loss(K2, C2, lr, mu) == pytest.approx(ref, rel=1e-8)
    assert qd.training_loss_closed_form(K2, C2, lr, mu) == pytest.approx(ref, rel=1e-8)


def test_training_loss_3d_random_non_commuting():
    rng = np.random.default_rng(7)
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    k = q @ np.diag([0.2, 1.0, 2.3]) @ q.T
    g = rng.standard_normal((3, 3))
    c = g @ g.T
    lr, mu = 0.5, 0.7
    ref = 0.5 * np.trace(k @ _sigma_brute_force(k, c, lr, mu))
    assert qd.training_loss_closed_form(k, c, lr, mu) == pytest.approx(ref, rel=1e-8)
    assert qd.training_loss(k, c, lr, mu) == pytest.approx(ref, rel=1e-8)


def _transient_recursion(k, c, lr, steps):
    a = np.eye(k.shape[0]) - lr * k
    s = np.zeros_like(k)
    out = [0.0]
    for _ in range(steps):
        s = a @ s @ a.T + lr**2 * c
        out.append(0.5 * np.trace(k @ s))
    return np.array(out)


@pytest.mark.parametrize("lr", [1e-3, 0.4, 1.0, 1.5])
def test_transient_loss_against_covariance_recursion(lr):
    steps = 60
    got = qd.transient_loss(K2, C2, lr, steps)
    assert got.shape == (steps + 1,)
    np.testing.assert_allclose(got, _transient_recursion(K2, C2, lr, steps), rtol=1e-8, atol=0)


def test_transient_loss_edge_cases():
    # λk = 2 exactly (marginal mode, formula is 0/0) and λk = 1 (a = 0) and k < 0
    k = np.diag([4.0, 2.0, -0.3])
    rng = np.random.default_rng(3)
    g = rng.standard_normal((3, 3))
    c = g @ g.T
    steps = 25
    np.testing.assert_allclose(qd.transient_loss(k, c, 0.5, steps),
                               _transient_recursion(k, c, 0.5, steps), rtol=1e-8, atol=1e-14)


def test_transient_loss_converges_to_stationary_loss():
    lr = 0.8
    got = qd.transient_loss(K2, C2, lr, 3000)[-1]
    ref = 0.5 * np.trace(K2 @ _sigma_wm_lyapunov(K2, C2, lr, 0.0))
    assert got == pytest.approx(ref, rel=1e-8)


def test_continuous_variance_1d_against_continuous_lyapunov():
    """OU process with diffusion λσ²/2 per unit t: k Σ + Σ k = λσ²; discrete differs by 2/(2−λk)."""
    k, sigma2, lr = 1.7, 0.6, 0.3
    ref = scipy.linalg.solve_continuous_lyapunov(np.array([[k]]), np.array([[lr * sigma2]]))
    assert qd.continuous_variance_1d(k, sigma2, lr) == pytest.approx(ref[0, 0], rel=1e-8)
    disc = _sigma_wm_lyapunov(np.array([[k]]), np.array([[sigma2]]), lr, 0.0)[0, 0]
    assert disc / qd.continuous_variance_1d(k, sigma2, lr) == pytest.approx(2 / (2 - lr * k),
                                                                           rel=1e-8)


def test_formula_dicts_cover_public_functions():
    for mod, names in [(qd, ["stationary_covariance", "variance_1d", "training_loss",
                             "training_loss_closed_form", "transient_loss",
                             "continuous_variance_1d"]),
                       (esc, ["kramers_time", "sgd_temperature", "kramers_steps",
                              "powerlaw_log_time", "powerlaw_slope"])]:
        for name in names:
            assert isinstance(mod.FORMULA[name], str) and mod.FORMULA[name]
            assert callable(getattr(mod, name))


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        qd.stationary_covariance([[1.0, 0.2], [0.0, 1.0]], np.eye(2), 0.1)  # not symmetric
    with pytest.raises(ValueError):
        qd.stationary_covariance(np.eye(2), np.eye(3), 0.1)
    with pytest.raises(ValueError):
        qd.variance_1d(1.0, 0.1, 0.0)
    with pytest.raises(ValueError):
        esc.kramers_time(1.0, 1.0, -1.0, 0.0)


# ----------------------------------------------------------- escape (docs/physics.md §6)

def _double_well_mfpt(barrier, temperature, x0, x_end, n=100_001):
    """Exact mean first-passage time x0 → x_end of dx = −U'dt + √(2T)dW, U = ΔL(x² − 1)².

    τ = (1/T) ∫_{x0}^{x_end} dy e^{U(y)/T} ∫_{−∞}^{y} dz e^{−U(z)/T} (reflecting at −∞),
    on a grid starting where U/T = 50 to the left of the well.
    """
    lo = -math.sqrt(1.0 + math.sqrt(50.0 * temperature / barrier))
    z = np.linspace(lo, x_end, n)
    u = barrier * (z * z - 1.0) ** 2 / temperature
    inner = cumulative_simpson(np.exp(-u), x=z, initial=0.0)
    m = z >= x0
    return simpson(np.exp(u[m]) * inner[m], x=z[m]) / temperature


def _kramers_relative_errors(ratio):
    """(2·MFPT(−1 → 0), MFPT(−1 → +1)) relative to kramers_time at ΔL/T = ratio."""
    barrier = 1.0
    temp = barrier / ratio
    tau = esc.kramers_time(barrier, 8.0 * barrier, -4.0 * barrier, temp)
    to_top = 2.0 * _double_well_mfpt(barrier, temp, -1.0, 0.0)
    to_other_well = _double_well_mfpt(barrier, temp, -1.0, 1.0)
    return to_top / tau - 1.0, to_other_well / tau - 1.0


def test_kramers_time_against_exact_mean_first_passage():
    """kramers_time = time into the other well = 2 × time to the saddle, up to O(T/ΔL)."""
    errs = {r: _kramers_relative_errors(r) for r in (8.0, 16.0, 32.0)}
    for top, other in errs.values():
        assert top == pytest.approx(other, abs=2e-3)  # both definitions agree
    assert abs(errs[8.0][0]) < 0.07 and abs(errs[8.0][1]) < 0.07
    for which in (0, 1):
        e8, e16, e32 = (abs(errs[r][which]) for r in (8.0, 16.0, 32.0))
        assert e8 > e16 > e32
        # first-order correction O(T/ΔL): halving T/ΔL roughly halves the error
        assert 1.7 < e8 / e16 < 2.5 and 1.7 < e16 / e32 < 2.5


def test_kramers_time_scaling_in_barrier_and_curvatures():
    """Independent of the double well: the quadrature MFPT of a rescaled potential U → cU at
    T → cT is unchanged in shape, and the time scales as 1/c (curvatures × c)."""
    base = _double_well_mfpt(1.0, 1.0 / 10.0, -1.0, 1.0)
    scaled = _double_well_mfpt(3.0, 3.0 / 10.0, -1.0, 1.0)
    assert scaled == pytest.approx(base / 3.0, rel=1e-6)
    ratio = esc.kramers_time(3.0, 24.0, -12.0, 0.3) / esc.kramers_time(1.0, 8.0, -4.0, 0.1)
    assert ratio == pytest.approx(1.0 / 3.0, rel=1e-12)


def test_sgd_temperature_is_boltzmann_limit_of_exact_discrete_variance():
    """Boltzmann Var w = T/k must equal the exact discrete variance × (1 − λk/2)."""
    lr, sigma2, s, k = 0.02, 3.0, 8, 1.5
    disc = _sigma_wm_lyapunov(np.array([[k]]), np.array([[sigma2 / s]]), lr, 0.0)[0, 0]
    t = esc.sgd_temperature(lr, sigma2, s)
    assert t / k == pytest.approx(disc * (1 - lr * k / 2), rel=1e-8)


def test_kramers_steps_against_sgd_simulation():
    """Simulate w ← w − λ(U'(w) + ξ), Var ξ = v, from −1 until w ≥ +1 (the other minimum).

    The mean step count × λ must match the exact Langevin MFPT at T = λv/2 (this checks the
    unit conventions of sgd_temperature / kramers_steps), and kramers_steps must deviate from
    the simulation only by Kramers' own O(T/ΔL) error.
    """
    barrier, ratio, lr, s = 1.0, 3.0, 0.005, 4
    temp = barrier / ratio
    v = 2.0 * temp / lr  # per-step gradient-noise variance
    sigma2 = v * s
    assert esc.sgd_temperature(lr, sigma2, s) == pytest.approx(temp, rel=1e-12)
    rng = np.random.default_rng(1)
    n = 2000
    w = np.full(n, -1.0)
    steps = np.zeros(n)
    alive = np.arange(n)
    k = 0
    while alive.size and k < 200_000:
        k += 1
        x = w[alive]
        x = x - lr * (4.0 * barrier * x * (x * x - 1.0) + math.sqrt(v) * rng.standard_normal(x.size))
        w[alive] = x
        done = x >= 1.0
        steps[alive[done]] = k
        alive = alive[~done]
    assert alive.size == 0
    mc = steps.mean()
    exact_t = _double_well_mfpt(barrier, temp, -1.0, 1.0)
    assert mc * lr == pytest.approx(exact_t, rel=0.08)  # 2.2% standard error, λk = 0.04
    pred = esc.kramers_steps(barrier, 8.0 * barrier, -4.0 * barrier, lr, v)
    kramers_err = esc.kramers_time(barrier, 8.0, -4.0, temp) / exact_t
    assert pred / mc == pytest.approx(kramers_err, rel=0.08)
    assert pred == pytest.approx(esc.kramers_time(barrier, 8.0, -4.0, temp) / lr, rel=1e-12)


def test_powerlaw_log_time():
    """ln τ = const + (S/(λh*)) ln(L_saddle/L_min): linear in S/λ, fixed numbers."""
    h, l_min, l_sad = 2.0, 3.0, 1050.0
    got = esc.powerlaw_log_time(0.1, 4, h, l_min, l_sad, const=1.5)
    assert got == pytest.approx(1.5 + 40.0 / 2.0 * math.log(350.0), rel=1e-12)
    assert esc.powerlaw_log_time(0.1, 4, h, l_min, l_sad) == pytest.approx(got - 1.5, rel=1e-12)
    a = esc.powerlaw_log_time(0.2, 4, h, l_min, l_sad)
    b = esc.powerlaw_log_time(0.05, 8, h, l_min, l_sad)
    slope = (b - a) / (8 / 0.05 - 4 / 0.2)
    assert esc.powerlaw_slope(h, l_min, l_sad) == pytest.approx(slope, rel=1e-10)
    assert slope == pytest.approx(math.log(350.0) / 2.0, rel=1e-10)
