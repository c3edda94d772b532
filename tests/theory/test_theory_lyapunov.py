"""Leading-order stationary-covariance theories against independent numerics.

Nothing is checked against the module itself: the continuous solution against the eigenbasis
formula and a Kronecker-product linear solve written here; the discrete additive solution against
``scipy.linalg.solve_discrete_lyapunov`` of the linear iteration and against a fixed-seed Monte
Carlo of that iteration; Q against ``(2/λ) H M − C`` with M from the Kronecker solve; the
detailed-balance eigenvalues against ``numpy.linalg.eigvals`` of ``(λ/2) H⁻¹ C``.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from sgdsweep.theory import lyapunov as ly

LR = 0.5


def _rotation(seed: int, n: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q


# 3-d Hessian with spread eigenvalues and a positive definite noise covariance with strong
# off-diagonal entries in H's eigenbasis (so [H, C] ≠ 0 matters). λω ∈ {0.1, 0.45, 0.8}: the
# discrete factor 2/(2 − λω) is 5–67 %.
V3 = _rotation(1, 3)
OMEGA3 = np.array([0.2, 0.9, 1.6])
H3 = V3 @ np.diag(OMEGA3) @ V3.T
C3 = V3 @ (0.5 * np.array([[1.0, 0.7, -0.4], [0.7, 1.0, 0.2], [-0.4, 0.2, 1.0]])) @ V3.T
# commuting noise: same eigenvectors as H3, unrelated eigenvalues
C3_COMM = V3 @ np.diag([0.7, 0.1, 0.4]) @ V3.T


def _kron_continuous(h, c, lr):
    """Brute-force HM + MH = λC as an N²×N² linear system on row-major vec(M)."""
    n = h.shape[0]
    eye = np.eye(n)
    op = np.kron(h, eye) + np.kron(eye, h)  # vec(HM) = (H⊗I)vec M, vec(MH) = (I⊗Hᵀ)vec M
    return np.linalg.solve(op, lr * c.ravel()).reshape(n, n)


def _eigen_continuous(h, c, lr):
    w, v = np.linalg.eigh(h)
    ct = v.T @ c @ v
    return v @ (lr * ct / (w[:, None] + w[None, :])) @ v.T


def _rel(a, b):
    """Relative difference in the Frobenius norm."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_inputs_do_not_commute():
    assert np.max(np.abs(H3 @ C3 - C3 @ H3)) > 0.3
    assert np.max(np.abs(H3 @ C3_COMM - C3_COMM @ H3)) < 1e-14


# ---------------------------------------------------------------- continuous time


@pytest.mark.parametrize("c", [C3, C3_COMM], ids=["noncommuting", "commuting"])
def test_continuous_matches_eigenbasis_and_kronecker(c):
    m = ly.continuous_covariance(H3, c, LR)
    # direct solvers agree to rounding (condition number of H⊕H is 8): 1e-12 relative
    assert _rel(m, _kron_continuous(H3, c, LR)) < 1e-12
    assert _rel(m, _eigen_continuous(H3, c, LR)) < 1e-12
    assert np.allclose(m, m.T, rtol=0, atol=0)


def test_continuous_isotropic_limit_is_lr_sigma2_over_2s():
    # C = σ²H/S (the P/N → ∞ limit) gives M = λσ²/(2S) I exactly (Gross Eq. 2.34): every
    # normalised eigenvalue is 1; a missing ½ would give 2 and a missing 1/S would give S.
    sigma2, s = 0.25, 10
    m = ly.continuous_covariance(H3, sigma2 * H3 / s, LR)
    ev = ly.normalised_eigenvalues(m, LR, s, sigma2)
    assert np.allclose(ev, 1.0, rtol=1e-12, atol=0)
    assert ly.isotropic_variance(LR, s, sigma2) == pytest.approx(LR * sigma2 / (2 * s), rel=1e-15)


def test_one_dimensional_continuous_and_discrete():
    # 1-D closed forms λσ²/(2k) and λσ²/(k(2 − λk)) (docs/physics.md §1)
    k, s2, lr = 1.3, 0.7, 0.9
    assert ly.continuous_covariance(k, s2, lr)[0, 0] == pytest.approx(lr * s2 / (2 * k), rel=1e-14)
    assert ly.discrete_additive_covariance(k, s2, lr)[0, 0] == pytest.approx(
        lr * s2 / (k * (2 - lr * k)), rel=1e-14)


# ---------------------------------------------------------------- discrete time


@pytest.mark.parametrize("c", [C3, C3_COMM], ids=["noncommuting", "commuting"])
def test_discrete_matches_solve_discrete_lyapunov(c):
    a = np.eye(3) - LR * H3
    ref = scipy.linalg.solve_discrete_lyapunov(a, LR * LR * c)
    assert _rel(ly.discrete_additive_covariance(H3, c, LR), ref) < 1e-12
    # and it is not the continuous answer: the discreteness is a 5-67 % effect here
    assert _rel(ly.continuous_covariance(H3, c, LR), ref) > 0.04


def test_discrete_matches_kronecker_of_its_equation():
    # HM + MH − λHMH = λC as an N²×N² linear system
    eye = np.eye(3)
    op = np.kron(H3, eye) + np.kron(eye, H3) - LR * np.kron(H3, H3)
    ref = np.linalg.solve(op, LR * C3.ravel()).reshape(3, 3)
    assert _rel(ly.discrete_additive_covariance(H3, C3, LR), ref) < 1e-12


def test_discrete_monte_carlo():
    """Fixed-seed Monte Carlo of δ' = (I − λH)δ + λξ, Cov ξ = C (64 replicas × 1e5 steps)."""
    rng = np.random.default_rng(2)
    replicas, steps, burn, chunk = 64, 100_000, 500, 5000
    at = (np.eye(3) - LR * H3).T
    lt = LR * np.linalg.cholesky(C3).T
    d = np.zeros((replicas, 3))
    for _ in range(burn):  # 0.95^500 ~ 1e-11 of the start value remains (slowest |1 − λω| = 0.9)
        d = d @ at + rng.standard_normal((replicas, 3)) @ lt
    acc = np.zeros((replicas, 3, 3))
    traj = np.empty((chunk, replicas, 3))
    for _ in range(steps // chunk):
        xi = rng.standard_normal((chunk, replicas, 3)) @ lt
        for k in range(chunk):
            d = d @ at + xi[k]
            traj[k] = d
        acc += np.einsum("trj,trk->rjk", traj, traj)
    per_replica = acc / steps
    mean = per_replica.mean(axis=0)
    # replicas are independent: standard error from their spread (relative SE here ~0.1-0.3 %)
    se = per_replica.std(axis=0, ddof=1) / np.sqrt(replicas)
    theory = ly.discrete_additive_covariance(H3, C3, LR)
    z = np.abs(mean - theory) / se
    assert np.max(z) < 5.0, z  # 5 standard errors (measured max 1.05)
    # the Monte Carlo resolves the discreteness: every diagonal entry of the continuous answer is
    # > 30 standard errors away (measured 47-382)
    zc = np.abs(mean - ly.continuous_covariance(H3, C3, LR)) / se
    assert np.min(np.diag(zc)) > 30.0, zc


def test_discrete_unstable_is_inf():
    lr = 2.0 / OMEGA3.max()  # λω_max = 2 exactly: no stationary state
    assert np.all(np.isinf(ly.discrete_additive_covariance(H3, C3, lr)))
    assert np.all(np.isfinite(ly.discrete_additive_covariance(H3, C3, 0.999 * lr)))


# ---------------------------------------------------------------- detailed balance and Q


def test_q_matches_hessian_times_exact_solution():
    # Q defined through Gross Eq. 2.30: M = (λ/2) H⁻¹ (C + Q)  ⇔  Q = (2/λ) H M − C
    m = _kron_continuous(H3, C3, LR)
    q_ref = 2.0 / LR * H3 @ m - C3
    q = ly.q_matrix(H3, C3)
    assert _rel(q, q_ref) < 1e-12
    assert np.allclose(q_ref, -q_ref.T, atol=1e-12 * np.max(np.abs(q_ref)))  # antisymmetric
    assert np.max(np.abs(q)) > 0.1 * np.max(np.abs(C3))  # and far from zero here


def test_broken_balance_form_equals_continuous_solution():
    m = ly.broken_balance_covariance(H3, C3, LR)
    assert _rel(m, _kron_continuous(H3, C3, LR)) < 1e-12
    # also assembled by hand from q_matrix
    m_hand = 0.5 * LR * np.linalg.solve(H3, C3 + ly.q_matrix(H3, C3))
    assert _rel(m_hand, _kron_continuous(H3, C3, LR)) < 1e-12


def test_detailed_balance_exact_when_commuting():
    ref = _kron_continuous(H3, C3_COMM, LR)
    assert _rel(ly.detailed_balance_covariance(H3, C3_COMM, LR), ref) < 1e-12
    assert np.max(np.abs(ly.q_matrix(H3, C3_COMM))) < 1e-13 * np.max(np.abs(C3_COMM))
    assert np.max(ly.q_eigenvalue_magnitudes(H3, C3_COMM)) < 1e-13
    # the isotropic-limit noise C ∝ H commutes too
    assert np.max(np.abs(ly.q_matrix(H3, 0.3 * H3))) < 1e-13


def test_detailed_balance_wrong_when_not_commuting():
    ref = _kron_continuous(H3, C3, LR)
    db = ly.detailed_balance_covariance(H3, C3, LR)
    assert _rel(db, ref) > 0.2  # measured 0.50 (Frobenius)
    sym = ly.detailed_balance_covariance(H3, C3, LR, symmetric=True)
    assert _rel(sym, ref) > 0.2  # measured 0.28
    assert np.linalg.eigvalsh(sym)[0] < 0.0  # the symmetric part is not even positive here
    assert np.max(np.abs(db - db.T)) > 0.1 * np.max(np.abs(db))  # not a covariance
    # its spectrum differs from the exact one as well: the smallest eigenvalue is ~3x too small
    # (measured 0.0163 vs 0.0469), the largest 5 % too large
    ev_exact = np.linalg.eigvalsh(ref)[::-1]
    ev_db = ly.detailed_balance_eigenvalues(H3, C3, LR)
    assert ev_exact[-1] / ev_db[-1] > 2.0


def test_detailed_balance_eigenvalues_are_those_of_the_unsymmetrised_matrix():
    raw = 0.5 * LR * np.linalg.inv(H3) @ C3
    ev = np.linalg.eigvals(raw)
    assert np.max(np.abs(ev.imag)) < 1e-12
    ref = np.sort(ev.real)[::-1]
    assert _rel(ly.detailed_balance_eigenvalues(H3, C3, LR), ref) < 1e-12
    # normalised_eigenvalues accepts the unsymmetrised matrix and uses the same real spectrum
    s, s2 = 4, 0.3
    got = ly.normalised_eigenvalues(ly.detailed_balance_covariance(H3, C3, LR), LR, s, s2)
    assert _rel(got, ref / (LR * s2 / (2 * s))) < 1e-10
    # the symmetric part has a different spectrum (why the choice matters; measured 0.08)
    sym = ly.detailed_balance_covariance(H3, C3, LR, symmetric=True)
    assert _rel(np.linalg.eigvalsh(sym)[::-1], ref) > 0.04


def test_q_eigenvalue_magnitudes():
    q = ly.q_matrix(H3, C3)
    ev = np.linalg.eigvals(q)
    assert np.max(np.abs(ev.real)) < 1e-12 * np.max(np.abs(ev))  # purely imaginary
    ref = np.sort(np.abs(ev))[::-1]
    got = ly.q_eigenvalue_magnitudes(H3, C3)
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-14 * ref[0])
    # N = 3: one pair ±iq and one zero
    assert got[0] == pytest.approx(got[1], rel=1e-12)
    assert got[2] < 1e-13 * got[0]
    # 3-d antisymmetric: q = ‖(Q_23, Q_13, Q_12)‖
    assert got[0] == pytest.approx(np.sqrt(q[1, 2] ** 2 + q[0, 2] ** 2 + q[0, 1] ** 2), rel=1e-12)


def test_normalised_eigenvalues_order_and_inf():
    m = np.diag([1.0, 3.0, 2.0])
    got = ly.normalised_eigenvalues(m, 0.2, 5, 0.5)  # scale 0.01
    assert np.allclose(got, [300.0, 200.0, 100.0], rtol=1e-13)
    assert np.all(np.isinf(ly.normalised_eigenvalues(np.full((2, 2), np.inf), 0.2, 5, 0.5)))


@pytest.mark.parametrize("n, seed", [(3, 0), (10, 1), (25, 2)])
def test_leading_order_equals_independent_references(n, seed):
    """The three theories of one call against the references above: the Kronecker solve, the
    eigenvalues of (λ/2) H⁻¹ C, and |eig Q| with Q = (2/λ) H M − C from the Kronecker M."""
    rng = np.random.default_rng(seed)
    v = _rotation(seed, n)
    h = v @ np.diag(np.geomspace(0.05, 2.0, n)) @ v.T
    a = rng.normal(size=(n, n))
    c = a @ a.T / n + 0.1 * np.eye(n)
    got = ly.leading_order(h, c, LR)
    m = _kron_continuous(h, c, LR)
    assert _rel(got.continuous_covariance, m) < 1e-10
    balanced = np.sort(np.linalg.eigvals(0.5 * LR * np.linalg.solve(h, c)).real)[::-1]
    assert _rel(got.detailed_balance_eigenvalues, balanced) < 1e-10
    q = (2.0 / LR) * h @ m - c
    magnitudes = np.sort(np.abs(np.linalg.eigvals(0.5 * (q - q.T))))[::-1]
    assert np.allclose(got.q_eigenvalue_magnitudes, magnitudes, rtol=1e-9, atol=1e-12 * magnitudes[0])
    assert got.q_eigenvalue_magnitudes[0] > 0.05 * np.max(np.abs(c))  # [H, C] ≠ 0: Q is not small


# ---------------------------------------------------------------- input validation


@pytest.mark.parametrize("func", [ly.continuous_covariance, ly.discrete_additive_covariance,
                                  ly.detailed_balance_covariance, ly.broken_balance_covariance,
                                  ly.detailed_balance_eigenvalues, ly.leading_order])
def test_bad_inputs(func):
    with pytest.raises(ValueError, match=r"h must be a non-empty square.*\(2, 3\)"):
        func(np.ones((2, 3)), np.eye(2), LR)
    with pytest.raises(ValueError, match="h must be symmetric"):
        func(np.array([[1.0, 0.5], [0.0, 1.0]]), np.eye(2), LR)
    with pytest.raises(ValueError, match="h must be positive definite.*-1"):
        func(np.diag([1.0, -1.0]), np.eye(2), LR)
    with pytest.raises(ValueError, match=r"c must have the shape of h, \(2, 2\), got shape \(3, 3\)"):
        func(np.eye(2), np.eye(3), LR)
    with pytest.raises(ValueError, match="c must be positive semidefinite"):
        func(np.eye(2), np.diag([1.0, -0.5]), LR)
    with pytest.raises(ValueError, match="c must have finite entries"):
        func(np.eye(2), np.array([[np.nan, 0.0], [0.0, 1.0]]), LR)
    for lr in (0.0, -1.0, np.inf, "x"):
        with pytest.raises(ValueError, match="lr must be a finite number > 0"):
            func(np.eye(2), np.eye(2), lr)


def test_bad_normalisation_inputs():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        ly.normalised_eigenvalues(np.eye(2), LR, 0, 1.0)
    with pytest.raises(ValueError, match="noise_var must be a finite number > 0"):
        ly.normalised_eigenvalues(np.eye(2), LR, 2, 0.0)
    with pytest.raises(ValueError, match="m must have a real spectrum"):
        ly.normalised_eigenvalues(np.array([[0.0, 1.0], [-1.0, 0.0]]), LR, 2, 1.0)
    with pytest.raises(ValueError, match=r"m must be a non-empty square.*\(3,\)"):
        ly.normalised_eigenvalues(np.ones(3), LR, 2, 1.0)
