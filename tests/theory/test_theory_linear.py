"""The exact linear-regression theory against independent numerics.

The stationarity equation is checked by brute force: the expectation over minibatches is
computed by enumerating every possible batch (distinct subsets for ``minibatch``, ordered tuples
for ``minibatch_replace``), so no formula of the module (F(M), the sampling factors, C) is used.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg

from sgdsweep.models import linear
from sgdsweep.theory import linear as th


def make_data(d, noiseless=False):
    """A linear-regression problem with one output and isotropic inputs."""
    return linear.make_problem({"n_outputs": 1, "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                "noiseless": noiseless, **d})


def _batches(p: int, s: int, noise: str):
    if noise in ("minibatch", "label"):
        return [list(c) for c in itertools.combinations(range(p), s)]
    return [list(c) for c in itertools.product(range(p), repeat=s)]


def _brute_force_moment(data, lr, s, mu, noise):
    """Solve Z = E_B[T_B Z T_Bᵀ] + λ² E_B[e_B e_Bᵀ] with the expectation over every batch.

    T_B is the exact update of the state z = (δ_t, δ_{t−1}) (or δ_t for μ = 0) for batch B and
    e_B = (b_B, 0). Returns the δδᵀ block.
    """
    n = data.n_inputs
    x, r = data.x, data.residual[:, 0]
    d = n if mu == 0.0 else 2 * n
    op = np.zeros((d * d, d * d))
    rhs = np.zeros((d, d))
    batches = _batches(data.n_samples, s, noise)
    for b in batches:
        a = x[b].T @ x[b] / s
        bb = x[b].T @ r[b] / s
        if mu == 0.0:
            t = np.eye(n) - lr * a
        else:
            t = np.block([[(1 + mu) * np.eye(n) - lr * a, -mu * np.eye(n)], [np.eye(n), np.zeros((n, n))]])
        e = np.concatenate([bb, np.zeros(d - n)])
        op += np.kron(t, t)
        rhs += lr**2 * np.outer(e, e)
        if noise == "label":  # fresh label noise ε on the batch: E[b bᵀ] += σ² X_BᵀX_B/S²
            rhs[:n, :n] += lr**2 * data.label_noise**2 * x[b].T @ x[b] / s**2
    op /= len(batches)
    rhs /= len(batches)
    z = np.linalg.solve(np.eye(d * d) - op, rhs.ravel()).reshape(d, d)
    return z[:n, :n]


SMALL = {"n_inputs": 3, "n_samples": 7, "label_noise": 0.7, "seed": 11}


@pytest.fixture(scope="module")
def small_data():
    return make_data(SMALL)


@pytest.mark.parametrize("noise", ["minibatch", "minibatch_replace", "label"])
@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_stationary_moment_is_a_fixed_point_of_the_exact_dynamics(noise, mu):
    data = make_data(SMALL, noiseless=noise == "label")
    lr, s = 0.6, 3
    m = th.stationary_second_moment(data, lr, s, mu, noise)
    assert np.all(np.linalg.eigvalsh(m) > 0)
    np.testing.assert_allclose(m, _brute_force_moment(data, lr, s, mu, noise), rtol=1e-9)


def test_added_noise_theories(small_data):
    """gaussian_matched and student_t share minibatch's answer (E[C(w)] = E[AMA] − HMH + C);
    gaussian is the additive discrete Lyapunov solution with C = (Tr C_minibatch / N) I."""
    lr, s = 0.6, 3
    mb = th.stationary_second_moment(small_data, lr, s, 0.0, "minibatch")
    for noise in ("gaussian_matched", "student_t"):
        np.testing.assert_allclose(th.stationary_second_moment(small_data, lr, s, 0.0, noise), mb, rtol=1e-12)
    c = np.trace(th.noise_covariance(small_data, s, "minibatch")) / 3 * np.eye(3)
    a = np.eye(3) - lr * small_data.sxx
    ref = scipy.linalg.solve_discrete_lyapunov(a, lr**2 * c)
    np.testing.assert_allclose(th.stationary_second_moment(small_data, lr, s, 0.0, "gaussian"), ref, rtol=1e-9)


def test_sampling_schemes_differ(small_data):
    a = th.stationary_second_moment(small_data, 0.6, 3, 0.0, "minibatch")
    b = th.stationary_second_moment(small_data, 0.6, 3, 0.0, "minibatch_replace")
    assert np.trace(b) / np.trace(a) > 1.3  # (P−1)/(P−S) = 1.5 at leading order


def test_noise_covariance_matches_enumeration(small_data):
    p, s = small_data.n_samples, 3
    for noise in ("minibatch", "minibatch_replace"):
        bs = _batches(p, s, noise)
        g = [small_data.x[b].T @ small_data.residual[b, 0] / s for b in bs]
        emp = sum(np.outer(v, v) for v in g) / len(bs)
        np.testing.assert_allclose(th.noise_covariance(small_data, s, noise), emp, rtol=1e-10, atol=1e-14)


def test_additive_limit_matches_scipy_lyapunov():
    """Large P, small λ: M solves the discrete Lyapunov equation with additive noise C."""
    data = make_data({"n_inputs": 4, "n_samples": 4000, "label_noise": 0.5, "seed": 2})
    lr, s = 0.02, 8
    m = th.stationary_second_moment(data, lr, s, 0.0, "minibatch")
    c = th.noise_covariance(data, s, "minibatch")
    a = np.eye(4) - lr * data.sxx
    ref = scipy.linalg.solve_discrete_lyapunov(a, lr**2 * c)
    # multiplicative noise adds O(λ σ_x² / S) = O(1e-3) relative
    np.testing.assert_allclose(m, ref, rtol=2e-3, atol=1e-3 * np.abs(ref).max())
    iso = lr * 0.25 / (2 * s)  # isotropic limit λσ_ε²/(2S)
    assert abs(np.trace(m) / 4 / iso - 1) < 0.05


def test_momentum_limit_is_continuous_and_gmres_matches_direct(monkeypatch, small_data):
    m0 = th.stationary_second_moment(small_data, 0.3, 2, 0.0)
    m_eps = th.stationary_second_moment(small_data, 0.3, 2, 1e-9)
    np.testing.assert_allclose(m_eps, m0, rtol=1e-6)
    direct = th.stationary_second_moment(small_data, 0.3, 2, 0.6)
    monkeypatch.setattr(th, "DIRECT_MAX_UNKNOWNS", 0)
    np.testing.assert_allclose(th.stationary_second_moment(small_data, 0.3, 2, 0.6), direct, rtol=1e-8)
    np.testing.assert_allclose(th.stationary_second_moment(small_data, 0.3, 2, 0.0), m0, rtol=1e-8)


def test_unstable_learning_rate_has_no_stationary_state(small_data):
    m = th.stationary_second_moment(small_data, 50.0, 2, 0.0)
    assert np.all(np.isinf(m))


def test_near_the_variance_edge_the_second_moment_relaxes_slower_than_the_mean_update():
    """docs/physics.md §8: with minibatch noise E[δδᵀ] relaxes by M ↦ (I − λH)M(I − λH) +
    λ²(E[AMA] − HMH), whose spectral radius r exceeds ρ² (ρ that of the mean update, which
    ``burn_in: auto`` and ``burn_in_relaxations`` count) more and more towards the variance-stability
    edge λ_v (r = 1, below the mean update's 2/k_max). N = 10, P/N = 4, S = 1: at λ = 0.5 the
    relaxation times 1/(1 − r) and τ/2 agree within 5 %; at 0.97 λ_v the first is over 4 times the
    second and the auto burn-in (8τ) under 3 of it (on the default data set, λ = 1.6 ≈ 0.96 λ_v:
    69 against 7.3 steps, and 1.7)."""
    from sgdsweep.models import get_model
    from sgdsweep.sweep.config import build_sweep

    model = get_model("linear")

    def point(lr: float):
        (p,) = build_sweep({"sweep": "edge", "model": {"kind": "linear", "n_inputs": 10, "label_noise": 0.5},
                            "dynamics": {"steps": 100000, "replicas": 2},
                            "grid": {"lr": lr, "batch_size": 1, "samples_per_param": 4}}).points
        return p

    data = model.make_problem(model.data_params(point(0.5).params))
    fluctuation = th._fluctuation_matrix(data, 1, "minibatch")

    def radius(lr: float) -> float:
        a = np.eye(data.n_inputs) - lr * data.sxx
        return float(np.abs(np.linalg.eigvals(np.kron(a, a) + lr**2 * fluctuation)).max())

    low, high = 0.5, 2 / data.curvatures().max()
    assert radius(low) < 1 <= radius(high)
    for _ in range(30):  # bisection for λ_v
        mid = (low + high) / 2
        low, high = (mid, high) if radius(mid) < 1 else (low, mid)
    times = {}
    for lr in (0.5, 0.97 * low):
        times[lr] = (1 / (1 - radius(lr)), data.relaxation_steps(lr, 0.0) / 2, point(lr).burn_in)
    slow, half, _ = times[0.5]
    assert slow == pytest.approx(half, rel=0.05), times
    slow, half, burn = times[0.97 * low]
    assert slow > 4 * half and burn / slow < 3, times
