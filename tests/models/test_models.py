"""Every model's gradients against finite differences of its loss, and its pieces against each
other: the full gradient, the per-sample gradients, the minibatch gradient over all samples,
the minimum (zero gradient) and the located landmarks of the landscapes."""

from __future__ import annotations

import numpy as np
import pytest

from sgdsweep.sweep.config import build_sweep

CASES = {
    "quadratic": {"model": {"kind": "quadratic", "curvatures": [1.0, 0.3], "noise_cov": [[1.0, 0.2], [0.2, 1.0]]},
                  "grid": {"lr": 0.1, "batch_size": 1}},
    "linear": {"model": {"kind": "linear", "n_inputs": 4, "n_outputs": 2, "inputs": "wishart"},
               "grid": {"lr": 0.1, "batch_size": 2, "samples_per_param": 5}},
    "linear_random_labels": {"model": {"kind": "linear", "n_inputs": 3, "labels": "noise"},
                             "grid": {"lr": 0.1, "batch_size": 2, "samples_per_param": 5}},
    "two_layer": {"model": {"kind": "two_layer", "n_inputs": 3, "n_outputs": 2, "labels": "teacher"},
                  "grid": {"lr": 0.1, "batch_size": 2, "samples_per_param": 5, "hidden_width": 2}},
    "matrix": {"model": {"kind": "matrix", "targets": [2.0, 1.0], "z_matrix": "random"},
               "grid": {"lr": 0.1, "batch_size": 2, "samples_per_param": 10}},
    "double_well": {"model": {"kind": "landscape"}, "grid": {"lr": 0.1, "batch_size": 1, "noise": "gaussian"}},
    "thesis": {"model": {"kind": "landscape", "landscape": "thesis"}, "grid": {"lr": 1e-4, "batch_size": 1},
               "dynamics": {"burn_in": 10}},
    "digits": {"model": {"kind": "digits"}, "grid": {"lr": 0.001, "batch_size": 5}, "dynamics": {"burn_in": 10}},
}


def _problem(name):
    from sgdsweep.models import make_problem

    sweep = build_sweep({"sweep": "m", **CASES[name]})
    return make_problem(sweep.points[0].params)


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_is_the_derivative_of_the_loss(name):
    pb = _problem(name)
    rng = np.random.default_rng(0)
    base = pb.w_min if pb.w_min is not None else np.zeros(pb.dim)
    w = (base + 0.3 * rng.standard_normal(pb.dim))[None, :]
    if name == "digits":  # 610 parameters: check 20 random directions
        dirs = rng.standard_normal((20, pb.dim))
    else:
        dirs = np.eye(pb.dim)
    h = 1e-6
    g = pb.grad(w)[0]
    for v in dirs:
        fd = (pb.loss(w + h * v)[0] - pb.loss(w - h * v)[0]) / (2 * h)
        assert fd == pytest.approx(g @ v, rel=1e-5, abs=1e-7 * max(1.0, np.abs(g).max()))


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("quadratic", "double_well")])
def test_sample_batch_and_full_gradients_agree(name):
    pb = _problem(name)
    rng = np.random.default_rng(1)
    base = pb.w_min if pb.w_min is not None else np.zeros(pb.dim)
    w = base + 0.2 * rng.standard_normal((3, pb.dim))
    full = pb.grad(w)
    np.testing.assert_allclose(pb.sample_grads(w).mean(axis=1), full, rtol=1e-9, atol=1e-12)
    every = np.tile(np.arange(pb.n_samples), (3, 1))
    np.testing.assert_allclose(pb.grad(w, every), full, rtol=1e-9, atol=1e-12)
    one = np.array([[5], [5], [7]])
    np.testing.assert_allclose(pb.grad(w, one)[0], pb.sample_grads(w)[0, 5], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in CASES if n != "two_layer"])
def test_minimum_has_zero_gradient(name):
    pb = _problem(name)
    g = pb.grad(pb.w_min[None, :])[0]
    scale = np.abs(pb.grad((pb.w_min + 0.1)[None, :])[0]).max()
    assert np.abs(g).max() < 1e-8 * max(1.0, scale)


def test_label_noise_enters_as_a_label_shift():
    pb = _problem("linear")
    w = pb.w_min[None, :] + 0.1
    idx = np.array([[0, 3]])
    eps = np.full((1, 2, 2), 0.5)
    shifted = pb.grad(w - 0.0, idx, eps)
    # d/dW of ½‖Wx − (y + ε)‖² = (Wx − y − ε)xᵀ: the shift is −mean(ε xᵀ)
    x = pb.x[idx[0]]
    expected = pb.grad(w, idx) - (eps[0][:, :, None] * x[:, None, :]).mean(axis=0).ravel()
    np.testing.assert_allclose(shifted, expected, rtol=1e-12)


def test_landscape_landmarks():
    dw = _problem("double_well")
    assert dw.grad(np.array([[dw.saddle], [dw.other_minimum]])) == pytest.approx(np.zeros((2, 1)), abs=1e-12)
    assert dw.loss(np.array([[dw.saddle]]))[0] == pytest.approx(dw.barrier)
    h = 1e-5
    curv = lambda x: (dw.grad(np.array([[x + h]]))[0, 0] - dw.grad(np.array([[x - h]]))[0, 0]) / (2 * h)
    assert curv(0.0) == pytest.approx(dw.k_min, rel=1e-6)
    assert curv(dw.saddle) == pytest.approx(-dw.k_saddle, rel=1e-6)
    th = _problem("thesis")  # docs/physics.md §6: minima and saddle of the thesis model
    np.testing.assert_allclose(th.minima["real"], [0.97, 5.0], atol=0.1)
    np.testing.assert_allclose(th.minima["spurious"], [-5.6, 3.0], atol=0.1)
    np.testing.assert_allclose(th.saddle_point, [-0.30, 0.16], atol=0.05)
    assert 2.0 < th.loss(th.minima["real"][None])[0] < 3.5 and 400 < th.loss_min < 430
    assert 1000 < th.loss_saddle < 1070
    assert not th.escaped(th.w_min[None])[0] and th.escaped(th.other[None])[0]
