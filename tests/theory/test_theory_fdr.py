"""The discrete fluctuation–dissipation relation against the exact linear-regression solution
(an independent N²×N² linear solve of the stationarity condition), never against itself."""

from __future__ import annotations

import numpy as np
import pytest

from sgdsweep.models import linear
from sgdsweep.theory import fdr
from sgdsweep.theory import linear as linear_theory


def _problem(n=4, ratio=3.0, seed=2):
    params = {"n_inputs": n, "n_outputs": 1, "n_samples": int(round(n * ratio)), "label_noise": 0.5,
              "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher", "seed": seed,
              "noiseless": False, "model": "linear"}
    return linear.make_problem(params)


@pytest.mark.parametrize("noise", ["minibatch", "minibatch_replace"])
def test_exact_relation_holds_at_the_exact_stationary_moment(noise):
    prob = _problem()
    lr, s = 0.6, 3
    m = linear_theory.stationary_second_moment(prob, lr, s, 0.0, noise)
    c = linear_theory.noise_covariance(prob, s, noise)
    batch = linear_theory.batch_product(prob, m, s, noise)
    lhs = fdr.relation_lhs(prob.sxx, m, lr, batch)
    assert np.allclose(lhs, lr * c, rtol=1e-9, atol=1e-12 * np.abs(lr * c).max())
    # the papers' relation (without the batch term) is off by exactly the predicted residual, and
    # that residual is not small at this λ
    pred = fdr.predicted_residual(lr * batch, lr * c)
    assert fdr.fdr_residual(prob.sxx, m, c, lr) == pytest.approx(pred, rel=1e-9)
    assert pred > 0.1
    # a factor-2 error in the batch term breaks the exact relation
    assert not np.allclose(fdr.relation_lhs(prob.sxx, m, lr, 2 * batch), lr * c, rtol=1e-3)


def test_residual_vanishes_as_the_learning_rate_goes_to_zero():
    prob = _problem()
    res = []
    for lr in (0.2, 0.02, 0.002):
        m = linear_theory.stationary_second_moment(prob, lr, 2, 0.0, "minibatch")
        c = linear_theory.noise_covariance(prob, 2, "minibatch")
        res.append(fdr.fdr_residual(prob.sxx, m, c, lr))
    assert res[0] > res[1] > res[2] and res[1] / res[2] == pytest.approx(10, rel=0.05)  # O(λ)


def test_q_ratio_is_zero_for_commuting_and_positive_otherwise():
    sxx = np.diag([1.0, 2.0, 3.0])
    assert fdr.q_ratio(sxx, np.diag([0.3, 0.2, 0.1])) == pytest.approx(0.0, abs=1e-15)
    assert fdr.q_ratio(sxx, np.array([[1.0, 0.4, 0], [0.4, 1.0, 0], [0, 0, 1.0]])) > 0.05
    with pytest.raises(ValueError, match="sigma_ww must be a square matrix"):
        fdr.q_ratio(sxx, np.ones(3))


def test_fourier_profile_sees_the_image_period_through_dropped_pixels():
    """Han et al. Fig. 2: a matrix whose rows repeat with the image width a = 8 has its profile's
    peaks at k_x = multiples of 2π/8 (j = 8, 16, …), with dropped pixels embedded as zeros; the
    normalisation removes overall scale; a wrong pixel map is refused."""
    width, n_pixels = 8, 64
    pixels = np.array([p for p in range(n_pixels) if p % width not in (0, 7)])  # edge columns dropped
    col = pixels % width
    a = np.outer(np.cos(2 * np.pi * col / width) + 2.0, np.ones(pixels.size))
    prof = fdr.fourier_profile(a, pixels, n_pixels)
    assert prof.shape == (33,) and prof[0] == 1.0
    peaks = np.argsort(prof)[::-1][:3]
    assert set(peaks) <= {0, 8, 16, 24, 32} and prof[8] > 0.1 and np.max(np.delete(prof, [0, 8, 16, 24, 32])) < 1e-12
    assert np.allclose(fdr.fourier_profile(5.0 * a, pixels, n_pixels), prof)
    with pytest.raises(ValueError, match="pixels"):
        fdr.fourier_profile(a, pixels[:-1], n_pixels)
