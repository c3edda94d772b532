"""Two-layer linear network fluctuation theory (Gross 2024 Sec. III) against independent numerics.

The linearised problem is built here from scratch, without the module: at a global minimum of the
population loss ``L(θ) = ½ (W2W1 − ŵ) Σxx (W2W1 − ŵ)ᵀ + ½σ_y²`` (exact input moments Σxx; the
residual ``y − ŵx`` is label noise independent of x with constant variance σ_y²) the joint
Hessian over θ = (W1, W2) comes from central finite differences of L; the gradient-noise
covariance at the minimum is ``C = (σ_y²/S) E[J_x J_xᵀ]`` with ``J_x = ∇θ (W2W1x)`` from central
finite differences of the network output (linear in x, so ``E[J_x J_xᵀ] = Gᵀ Σxx G`` with the
rows of G the Jacobians at x = e_k). ``HΣ + ΣH = λC`` is solved by ``scipy.linalg.
solve_continuous_lyapunov`` on the range of H (the zero modes are the minimum manifold).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from sgdsweep.theory import two_layer as tl

LR, S, SIGMA_Y2 = 0.1, 8, 0.3
FD_STEP = 1e-4
# L is a quartic polynomial of θ and f a bilinear one: the central differences err by
# O(h²)·(4th derivative) ≲ 1e-9 plus rounding eps·L/h² ≈ 2e-16·0.2/1e-8 ≈ 4e-9 (relative to the
# largest Hessian entry, measured ≤ 7e-9); the output differences err by rounding only.
# Hessian eigenvalues below this fraction of the largest are zero modes: the finite-difference
# zero modes come out ≤ 1e-8 of the largest, the smallest true one (σ_x²·D2 or σ_x²(D1 + D2))
# ≥ 0.08 of it in every case below.
ZERO_MODE_RTOL = 1e-6
# Agreement of the numerical Lyapunov solution with the closed forms, relative to λσ_y²/(2S):
# limited by the finite-difference error of H and C; measured ≤ 4e-8 (non-white case), ≤ 2e-8
# otherwise. Any error in the formula (a factor 2, a missing D2) is O(1).
TOL = 1e-6


def _pack(w1, w2):
    return np.concatenate([w1.ravel(), np.ravel(w2)])


def _unpack(theta, n_h, n_i):
    return theta[: n_h * n_i].reshape(n_h, n_i), theta[n_h * n_i:].reshape(1, n_h)


def _linearised_problem(w1, w2, sxx, w_hat):
    """Finite-difference Hessian H and E[J_x J_xᵀ] at θ = (w1, w2)."""
    n_h, n_i = w1.shape
    theta0 = _pack(w1, w2)
    n = theta0.size

    def loss(theta):
        a, b = _unpack(theta, n_h, n_i)
        d = b @ a - w_hat
        return 0.5 * (d @ sxx @ d.T).item() + 0.5 * SIGMA_Y2

    def output(theta, x):
        a, b = _unpack(theta, n_h, n_i)
        return (b @ a @ x).item()

    e = np.eye(n) * FD_STEP
    h = np.empty((n, n))
    for i in range(n):
        for j in range(i, n):
            h[i, j] = h[j, i] = (loss(theta0 + e[i] + e[j]) - loss(theta0 + e[i] - e[j])
                                 - loss(theta0 - e[i] + e[j]) + loss(theta0 - e[i] - e[j])
                                 ) / (4 * FD_STEP**2)
    g = np.array([[(output(theta0 + e[p], x) - output(theta0 - e[p], x)) / (2 * FD_STEP)
                   for p in range(n)] for x in np.eye(n_i)])  # (N_i, n): J at x = e_k
    return h, g.T @ sxx @ g


def _lyapunov_on_range(h, c, lr):
    omega, v = np.linalg.eigh(h)
    vr = v[:, omega > ZERO_MODE_RTOL * omega[-1]]
    sr = scipy.linalg.solve_continuous_lyapunov(vr.T @ h @ vr, lr * (vr.T @ c @ vr))
    return vr @ sr @ vr.T, vr.shape[1]


def _orthogonal(rng, n):
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return q


def _w1(rng, d1, n_i):
    """N_h×N_i matrix with random singular vectors and W1W1ᵀ eigenvalues ``d1`` (N_h of them)."""
    n_h = len(d1)
    s1 = np.zeros((n_h, n_i))
    k = min(n_h, n_i)
    s1[np.arange(k), np.arange(k)] = np.sqrt(d1[:k])
    return _orthogonal(rng, n_h) @ s1 @ _orthogonal(rng, n_i).T


def _w2(rng, n_h, d2):
    v = rng.normal(size=n_h)
    return np.sqrt(d2) * v[None, :] / np.linalg.norm(v)


# W1W1ᵀ spectra spread around D2 = ‖W2‖² = 0.4 so that D1/(D1 + D2) runs from ~0.1 to ~0.8:
# a wrong formula (isotropic, missing D2, factor 2) cannot pass.
D1_SPREAD = [1.6, 0.5, 0.05]


def _case(name):
    """(w1, w2, Σxx, ŵ) of a global minimum."""
    rng = np.random.default_rng(11)
    if name in ("teacher_white", "teacher_nonwhite"):
        n_i = 5
        w1, w2 = _w1(rng, D1_SPREAD, n_i), _w2(rng, 3, 0.4)
        sxx = np.eye(n_i) / n_i
        if name == "teacher_nonwhite":
            b = rng.normal(size=(n_i, n_i))
            sxx = (b @ b.T / n_i + 0.3 * np.eye(n_i)) / n_i  # condition number ~ 20
        return w1, w2, sxx, w2 @ w1  # teacher ŵ = W2W1: any (W1, W2) is then a minimum
    if name == "hidden_wider":
        # N_h = 4 > N_i = 3: W1W1ᵀ has a zero eigenvalue, a zero mode of cov(δW2)
        n_i = 3
        w1, w2 = _w1(rng, D1_SPREAD + [0.0], n_i), _w2(rng, 4, 0.4)
        return w1, w2, np.eye(n_i) / n_i, w2 @ w1
    if name == "pure_noise":
        # pure-noise targets with exact moments: ŵ = 0, so W2W1 = 0 with W2 ≠ 0 needs a
        # rank-deficient W1 whose range is orthogonal to W2 (D1 = 0 along W2's direction)
        n_i = 5  # N_h = 4
        w1 = _w1(rng, D1_SPREAD + [0.0], n_i)
        u, _, _ = np.linalg.svd(w1)
        w2 = np.sqrt(0.4) * u[:, -1][None, :]  # the left null vector of W1
        return w1, w2, np.eye(n_i) / n_i, np.zeros((1, n_i))
    raise KeyError(name)


CASES = ["teacher_white", "teacher_nonwhite", "hidden_wider", "pure_noise"]


@pytest.mark.parametrize("name", CASES)
def test_minimum_and_gauss_newton(name):
    w1, w2, sxx, w_hat = _case(name)
    assert np.max(np.abs(w2 @ w1 - w_hat)) < 1e-14  # a global minimum (L = σ_y²/2)
    h, ejj = _linearised_problem(w1, w2, sxx, w_hat)
    # at a minimum with residual independent of x the Hessian is the Gauss-Newton E[J Jᵀ], so the
    # noise C = σ_y² E[J Jᵀ]/S is ∝ H (the premise of the theory)
    assert np.max(np.abs(h - ejj)) < 1e-7 * np.max(np.abs(h))  # finite-difference error, see top


@pytest.mark.parametrize("name", CASES)
def test_joint_covariance_isotropic_on_range(name):
    w1, w2, sxx, w_hat = _case(name)
    n_h, n_i = w1.shape
    h, ejj = _linearised_problem(w1, w2, sxx, w_hat)
    sigma, rank = _lyapunov_on_range(h, SIGMA_Y2 / S * ejj, LR)
    scale = LR * SIGMA_Y2 / (2 * S)
    assert tl.joint_eigenvalue(LR, S, SIGMA_Y2) == pytest.approx(scale, rel=1e-15)
    ev = np.sort(np.linalg.eigvalsh(sigma))[::-1]
    # N_o·N_i = N_i nonzero eigenvalues, all λσ_y²/(2S); the other N_h(N_i + 1) − N_i are zero
    assert rank == n_i == tl.n_joint_modes(w1, w2)
    assert np.max(np.abs(ev[:n_i] / tl.joint_eigenvalue(LR, S, SIGMA_Y2) - 1.0)) < TOL
    assert np.max(np.abs(ev[n_i:])) < TOL * scale
    assert ev.size - n_i == n_h * (n_i + 1) - n_i


@pytest.mark.parametrize("name", CASES)
def test_w2_block_matches_gross_eq_3_34(name):
    w1, w2, sxx, w_hat = _case(name)
    n_h, n_i = w1.shape
    h, ejj = _linearised_problem(w1, w2, sxx, w_hat)
    sigma, _ = _lyapunov_on_range(h, SIGMA_Y2 / S * ejj, LR)
    s22 = sigma[n_h * n_i:, n_h * n_i:]  # cov(δW2), N_h × N_h
    scale = LR * SIGMA_Y2 / (2 * S)

    values, vectors = tl.w2_covariance_eigenvalues(w1, w2, LR, S, SIGMA_Y2)
    ev = np.sort(np.linalg.eigvalsh(s22))[::-1]
    assert np.max(np.abs(values - ev)) < TOL * scale
    # the ratios D1/(D1 + D2) are spread (measured 0-0.9), so isotropic fluctuations, a factor 2
    # or D2/(D1 + D2) would all fail the line above
    assert values[0] > 0.5 * scale and values[-1] < 0.25 * scale
    # eigenvectors: orthonormal, and s22 v_i = value_i v_i
    assert np.allclose(vectors.T @ vectors, np.eye(n_h), atol=1e-12)
    assert np.max(np.abs(s22 @ vectors - vectors * values)) < TOL * scale
    # the ratios computed here from an independent eigendecomposition of W1 W1ᵀ
    d1 = np.sort(np.linalg.eigvalsh(w1 @ w1.T))[::-1]
    d2 = float(np.sum(w2**2))
    assert np.max(np.abs(values - scale * d1 / (d1 + d2))) < 1e-12 * scale
    # matrix form
    assert np.max(np.abs(tl.w2_covariance(w1, w2, LR, S, SIGMA_Y2) - s22)) < TOL * scale


def test_w2_zero_minimum_has_rank_w1_modes():
    """Pure noise, ŵ = 0, at the minimum W2 = 0 with a full-rank W1 (N_h < N_i): the joint rank
    is rank W1 = N_h, not N_i, and δW2 is isotropic on range W1 (D1/(D1 + 0) = 1)."""
    rng = np.random.default_rng(5)
    n_h, n_i = 3, 5
    w1 = rng.normal(size=(n_h, n_i)) / np.sqrt(n_i)
    w2 = np.zeros((1, n_h))
    sxx = np.eye(n_i) / n_i
    h, ejj = _linearised_problem(w1, w2, sxx, np.zeros((1, n_i)))
    sigma, rank = _lyapunov_on_range(h, SIGMA_Y2 / S * ejj, LR)
    scale = LR * SIGMA_Y2 / (2 * S)
    assert rank == n_h == tl.n_joint_modes(w1, w2)
    ev = np.sort(np.linalg.eigvalsh(sigma))[::-1]
    assert np.max(np.abs(ev[:n_h] / scale - 1.0)) < TOL
    assert np.max(np.abs(ev[n_h:])) < TOL * scale
    values, _ = tl.w2_covariance_eigenvalues(w1, w2, LR, S, SIGMA_Y2)
    assert np.allclose(values, scale, rtol=1e-12)
    s22 = sigma[n_h * n_i:, n_h * n_i:]
    assert np.max(np.abs(tl.w2_covariance(w1, w2, LR, S, SIGMA_Y2) - s22)) < TOL * scale


def test_bad_inputs():
    w1, w2 = np.ones((3, 4)), np.ones((1, 3))
    with pytest.raises(ValueError, match=r"w2 must have shape \(1, N_h\) = \(1, 3\).*\(2, 3\)"):
        tl.w2_covariance_eigenvalues(w1, np.ones((2, 3)), LR, S, SIGMA_Y2)
    with pytest.raises(ValueError, match=r"w1 must be a non-empty 2-D array.*\(4,\)"):
        tl.w2_covariance_eigenvalues(np.ones(4), w2, LR, S, SIGMA_Y2)
    with pytest.raises(ValueError, match="w1 must have finite entries"):
        tl.w2_covariance_eigenvalues(np.full((3, 4), np.nan), w2, LR, S, SIGMA_Y2)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got -0.1"):
        tl.joint_eigenvalue(-0.1, S, SIGMA_Y2)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 2.5"):
        tl.joint_eigenvalue(LR, 2.5, SIGMA_Y2)
    with pytest.raises(ValueError, match="sigma_y2 must be a finite number >= 0, got -1"):
        tl.w2_covariance(w1, w2, LR, S, -1.0)
