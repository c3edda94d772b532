"""The exact stability edge (sgdsweep.theory.edge) against independent numerics.

The second-moment map is built by brute force: E[T_B ⊗ T_B] over every possible minibatch
(distinct subsets without replacement, ordered tuples with it), on the full d² space, and its
eigenvalues are taken with numpy; no formula of the theory package (F(M), the sampling factors,
the symmetric reduction) is used. The quadratic's edge is compared with Liu et al.'s closed form.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sgdsweep.models import edge as model_edge
from sgdsweep.models import linear
from sgdsweep.theory import edge
from sgdsweep.theory import linear as th


def make_data(d, noiseless=False):
    """A linear-regression problem with one output and isotropic inputs."""
    return linear.make_problem({"n_outputs": 1, "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                "noiseless": noiseless, **d})


@pytest.fixture(scope="module")
def data():
    return make_data({"n_inputs": 3, "n_samples": 6, "label_noise": 0.5, "seed": 1})


def _batches(p: int, s: int, noise: str):
    if noise == "minibatch_replace":
        return [list(c) for c in itertools.product(range(p), repeat=s)]
    # minibatch, label (fresh labels on distinct samples) and gaussian_matched (noise with the
    # without-replacement batch covariance at the current weights: the same second moment)
    return [list(c) for c in itertools.combinations(range(p), s)]


def brute_radius(data, lr, s, mu, noise):
    """ρ of Z ↦ E_B[T_B Z T_Bᵀ] with the expectation over every batch, T_B the exact update of
    the state (δ_t, δ_{t−1}) (δ_t for μ = 0); ``gaussian`` adds noise to the full gradient."""
    n, x = data.n_inputs, data.x
    batches = [None] if noise == "gaussian" else _batches(data.n_samples, s, noise)
    d = n if mu == 0.0 else 2 * n
    op = np.zeros((d * d, d * d))
    for b in batches:
        a = data.sxx if b is None else x[b].T @ x[b] / s
        t = np.eye(n) - lr * a
        if mu != 0.0:
            t = np.block([[t + mu * np.eye(n), -mu * np.eye(n)], [np.eye(n), np.zeros((n, n))]])
        op += np.kron(t, t)
    return float(np.max(np.abs(np.linalg.eigvals(op / len(batches)))))


NOISES = ("minibatch", "minibatch_replace", "label", "gaussian_matched", "gaussian")


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("mu", [0.0, 0.6])
def test_radius_matches_the_enumerated_map(data, noise, mu):
    for lr in (0.4, 1.3):
        assert edge.second_moment_radius(data, lr, 2, mu, noise) == pytest.approx(
            brute_radius(data, lr, 2, mu, noise), rel=1e-11)


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("mu", [0.0, 0.6])
def test_lr_edge_is_where_the_stationary_moment_stops_existing(data, noise, mu):
    """At the edge the enumerated map has radius 1; the exact stationary second moment exists
    just below it and not just above."""
    out = edge.linear_edge(data, "lr", 0.1, 2, mu, noise)
    lam = out["value"]
    assert out["stable"] == "below" and 0 < lam < math.inf
    assert brute_radius(data, lam, 2, mu, noise) == pytest.approx(1.0, abs=1e-10)
    below = th.stationary_second_moment(data, lam * (1 - 1e-6), 2, mu, noise)
    above = th.stationary_second_moment(data, lam * (1 + 1e-6), 2, mu, noise)
    assert np.all(np.isfinite(below)) and np.trace(below) > 0
    assert np.all(np.isinf(above))
    assert brute_radius(data, lam * 0.99, 2, mu, noise) < 1 < brute_radius(data, lam * 1.01, 2, mu, noise)


def test_label_noise_has_the_edge_of_minibatch(data):
    """Fresh label noise is additive: it leaves the map, hence the edge, of its sampling scheme."""
    noiseless = make_data({"n_inputs": 3, "n_samples": 6, "label_noise": 0.5, "seed": 1}, noiseless=True)
    lab = edge.linear_edge(noiseless, "lr", 0.1, 2, 0.3, "label")["value"]
    assert lab == pytest.approx(edge.linear_edge(data, "lr", 0.1, 2, 0.3, "minibatch")["value"], rel=1e-10)


def test_sampling_scheme_changes_the_edge(data):
    without = edge.linear_edge(data, "lr", 0.1, 3, 0.0, "minibatch")["value"]
    with_ = edge.linear_edge(data, "lr", 0.1, 3, 0.0, "minibatch_replace")["value"]
    assert with_ < 0.95 * without  # with replacement the batch varies more: the edge comes earlier
    for lam, noise in ((without, "minibatch"), (with_, "minibatch_replace")):
        assert brute_radius(data, lam, 3, 0.0, noise) == pytest.approx(1.0, abs=1e-10)
    assert brute_radius(data, with_ * 1.001, 3, 0.0, "minibatch") < 1  # the other scheme's edge is wrong


def test_gaussian_noise_edge_is_the_mean_dynamics(data):
    """Isotropic added noise is additive: the edge is λ h_max = 2(1 + μ)."""
    h_max = np.linalg.eigvalsh(data.sxx).max()
    for mu in (0.0, 0.4):
        got = edge.linear_edge(data, "lr", 0.1, 2, mu, "gaussian")["value"]
        assert got == pytest.approx(2 * (1 + mu) / h_max, rel=1e-10)
    assert edge.linear_edge(data, "lr", 0.1, 2, 0.0, "minibatch")["value"] < 0.9 * 2 / h_max


def test_momentum_edge_of_linear_regression(data):
    """Multiplicative noise makes large momentum unstable (λ/(1 − μ) grows): the largest stable μ."""
    lr, s = 0.5, 2
    out = edge.linear_edge(data, "momentum", lr, s, 0.0, "minibatch")
    mu = out["value"]
    assert out["stable"] == "below" and "lower" not in out and 0 < mu < 1
    assert brute_radius(data, lr, s, mu, "minibatch") == pytest.approx(1.0, abs=1e-10)
    assert np.all(np.isfinite(th.stationary_second_moment(data, lr, s, mu - 1e-6, "minibatch")))
    assert np.all(np.isinf(th.stationary_second_moment(data, lr, s, mu + 1e-6, "minibatch")))
    # the lr edge at that momentum is the given lr: the two axes meet on one curve
    assert edge.linear_edge(data, "lr", 0.0, s, mu, "minibatch")["value"] == pytest.approx(lr, rel=1e-9)
    # stable at every momentum with gaussian noise at a small lr; nowhere far beyond the edge
    assert edge.linear_edge(data, "momentum", 0.5, s, 0.0, "gaussian")["value"] == math.inf
    assert math.isnan(edge.linear_edge(data, "momentum", 50.0, s, 0.0, "minibatch")["value"])


def test_matrix_free_radius_matches_dense(monkeypatch, data):
    dense = [edge.second_moment_radius(data, 0.9, 2, mu, "minibatch") for mu in (0.0, 0.5)]
    monkeypatch.setattr(edge, "DENSE_MAX_UNKNOWNS", 0)
    for mu, ref in zip((0.0, 0.5), dense):
        assert edge.second_moment_radius(data, 0.9, 2, mu, "minibatch") == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("curvatures", [[1.0], [0.3, 2.0, 5.0]])
@pytest.mark.parametrize("mu", [0.0, 0.37, 0.9])
def test_quadratic_radius_edge_is_liu_corollary_1(curvatures, mu):
    """Radius of the additive map (2×2 companion per curvature) against Kronecker eigenvalues,
    and its edge against 0 < λk < 2(1 + μ)."""
    k = np.diag(curvatures)
    n = len(curvatures)
    for lr in (0.2, 1.1):
        b = np.block([[(1 + mu) * np.eye(n) - lr * k, -mu * np.eye(n)], [np.eye(n), np.zeros((n, n))]])
        ref = np.max(np.abs(np.linalg.eigvals(np.kron(b, b))))
        assert edge.quadratic_radius(curvatures, lr, mu) == pytest.approx(ref, rel=1e-10)
    got = edge.quadratic_edge(curvatures, "lr", 0.0, mu)["value"]
    assert got == pytest.approx(edge.liu_edge(curvatures, "lr", momentum=mu), rel=1e-10)
    assert got == pytest.approx(2 * (1 + mu) / max(curvatures), rel=1e-10)


def test_quadratic_momentum_edge_is_liu():
    """λk = 2.75 diverges for μ < 0.375 (docs/physics.md §1) and is stable up to μ → 1."""
    out = edge.quadratic_edge([1.0], "momentum", 2.75)
    assert out["value"] == math.inf and out["lower"] == pytest.approx(0.375, rel=1e-10)
    assert edge.liu_edge([1.0], "momentum", lr=2.75) == pytest.approx(0.375)
    assert "lower" not in edge.quadratic_edge([1.0], "momentum", 1.5)  # λk < 2: stable at every μ
    assert math.isnan(edge.quadratic_edge([1.0], "momentum", 4.5)["value"])  # λk > 4: stable at none


def test_bad_axis_is_named():
    with pytest.raises(ValueError, match="axis 'batch_size': allowed are lr, momentum"):
        edge.liu_edge([1.0], "batch_size", lr=1.0)
    with pytest.raises(ValueError, match="noise 'epoch': no exact"):
        edge.second_moment_radius(make_data({"n_inputs": 2, "n_samples": 4, "label_noise": 0.5, "seed": 1}),
                                  0.5, 2, 0.0, "epoch")
    with pytest.raises(ValueError, match="axis 'lrr'"):
        model_edge.stability_edge(None, {"model": "linear"}, "lrr")


# ---- the model hook and the engine --------------------------------------------------------


def _point(cfg):
    from sgdsweep import models
    from sgdsweep.sweep.config import build_sweep

    params = build_sweep({"sweep": "t", **cfg}).points[0].params
    return models.make_problem(params), params


def test_stability_edge_dispatches_through_the_model_hook():
    problem, params = _point({"model": {"kind": "linear", "n_inputs": 3, "label_noise": 0.5},
                              "grid": {"lr": 0.1, "batch_size": 2, "momentum": 0.3, "samples_per_param": 2,
                                       "noise": "minibatch_replace"}})
    got = model_edge.stability_edge(problem, params, "lr")
    assert got["value"] == edge.linear_edge(problem, "lr", 0.1, 2, 0.3, "minibatch_replace")["value"]
    assert "linear regression" in got["method"]
    problem, params = _point({"model": {"kind": "quadratic", "curvatures": [0.5, 2.0], "noise_cov": [1.0, 1.0]},
                              "grid": {"lr": 0.1, "batch_size": 2, "momentum": 0.3, "noise": "student_t"}})
    assert model_edge.stability_edge(problem, params, "lr")["value"] == pytest.approx(1.3, rel=1e-10)
    lin = {"lr": 0.1, "batch_size": 2, "samples_per_param": 2}
    no_theory = [
        {"model": {"kind": "linear", "n_inputs": 3}, "grid": {**lin, "noise": "epoch"}},
        {"model": {"kind": "linear", "n_inputs": 3, "n_outputs": 2}, "grid": lin},
        {"model": {"kind": "linear", "n_inputs": 3}, "grid": {**lin, "noise": "gaussian"},
         "dynamics": {"method": "sde"}},
        {"model": {"kind": "landscape"}, "grid": {"lr": 0.1, "batch_size": 2}},  # the default hook
    ]
    for cfg in no_theory:
        assert model_edge.stability_edge(*_point(cfg), "lr") is None, cfg


def test_engine_replicas_are_bounded_below_the_edge_and_diverge_above(tmp_path):
    """N = 2, P = 5, S = 4 without replacement, μ = 0.5: at 0.9× the exact edge no replica
    diverges, at 1.1× every one does, although 1.1× the edge is still below the mean-dynamics
    bound 2(1 + μ)/h_max (a theory without the multiplicative noise would call it stable)."""
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store import points as point_store
    from sgdsweep.sweep.config import build_sweep

    grid = {"batch_size": 4, "momentum": 0.5, "samples_per_param": 2.5, "noise": "minibatch"}
    model = {"kind": "linear", "n_inputs": 2, "label_noise": 0.5}
    problem, params = _point({"seed": 3, "model": model, "grid": {"lr": 0.1, **grid}})
    lam = model_edge.stability_edge(problem, params, "lr")["value"]
    assert 1.1 * lam < 0.95 * 3.0 / np.linalg.eigvalsh(problem.sxx).max()
    sweep = build_sweep({"sweep": "t", "seed": 3, "model": model, "grid": {"lr": [0.9 * lam, 1.1 * lam], **grid},
                         "dynamics": {"steps": 4000, "replicas": 32}})
    simulate_points([p.spec() for p in sweep.points], str(tmp_path))
    diverged = sorted((p.params["lr"] / lam, point_store.read_attrs(point_store.point_path(tmp_path, p.hash))
                       ["summary"]["diverged_replicas"]) for p in sweep.points)
    assert [d for _, d in diverged] == [0, 32] and diverged[0][0] == pytest.approx(0.9)
