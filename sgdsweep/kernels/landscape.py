"""Landscapes in the block loop: the additive-noise problems whose gradient is a per-coordinate
polynomial (``quadratic``, the ``double_well`` landscape; ``gaussian`` or ``student_t`` noise)
and the thesis landscape (``landscape: thesis``, Vescovi's escape problem: f(a, b; x) =
a² + x(1 + b σ(a x)), loss = mean (f − y)²) with sampled or added noise. Both stop a lane
when it escapes.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from ..noise import cholesky_psd
from ..vecmath import exp
from .common import FAST, delta_from, feed_loss, student_factor


class PolynomialData(NamedTuple):
    """g_i = a1_i w_i + a2_i w_i² + a3_i w_i³ + noise, escape when w_0 ≥ ``threshold``."""

    a1: np.ndarray  #: (d,)
    a2: np.ndarray  #: (d,)
    a3: np.ndarray  #: (d,)
    chol: np.ndarray  #: (d, d) lower-triangular L, L Lᵀ = C/S (C: the noise covariance)
    threshold: float  #: escape threshold on w_0 (inf: none)
    ref: np.ndarray  #: (d,) the minimum w*


class ThesisData(NamedTuple):
    """The thesis landscape's data set and geometry (d = 2: w = (a, b))."""

    x: np.ndarray  #: (P,) inputs
    y: np.ndarray  #: (P,) labels
    ref: np.ndarray  #: (2,) the starting minimum
    saddle: np.ndarray  #: (2,) the saddle point
    normal: np.ndarray  #: (2,) the separatrix normal, pointing away from ``ref``
    check_escape: bool  #: whether a lane stops when (w − saddle)·normal > 0


def polynomial_data(problem, batch_size: int) -> PolynomialData:
    """:class:`PolynomialData` of a problem with ``polynomial`` coefficients, batch size S."""
    a1, a2, a3 = (np.asarray(c, dtype=np.float64) for c in problem.polynomial)
    return PolynomialData(a1, a2, a3, np.ascontiguousarray(problem.noise_chol) / np.sqrt(batch_size),
                          float(getattr(problem, "escape_threshold", np.inf)), problem.w_min)


def thesis_data(problem, escape: bool) -> ThesisData:
    """:class:`ThesisData` of a :class:`sgdsweep.models.landscape.Thesis` problem."""
    return ThesisData(problem.x, problem.y, problem.w_min, problem.saddle_point, problem.normal, escape)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def polynomial_begin(lanes, data, common, lane, n_u):  # pragma: no cover - compiled
    """The lane's weights (a view) and scratch; no samples."""
    d = data.a1.shape[0]
    idx = np.arange(0)
    return lanes.w[lane], np.empty(d), np.empty(d), idx, np.empty(0), (idx,)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def polynomial_gradient(lanes, data, common, lane, step, wl, idx, weight, g, work):  # pragma: no cover
    """g = the polynomial + scale · L z (z: the step's first d normals; Student-t when
    ``added`` is 3: the factor of the next ν normals)."""
    z = lanes.z
    chol, a1, a2, a3 = data.chol, data.a1, data.a2, data.a3
    d = a1.shape[0]
    scale = common.noise_amp * student_factor(z, lane, step, d) if common.added == 3 else common.noise_amp
    for i in range(d):
        xi = 0.0
        for j in range(i + 1):  # chol is lower triangular
            xi += chol[i, j] * z[lane, step, j]
        wi = wl[i]
        g[i] = wi * (a1[i] + wi * (a2[i] + wi * a3[i])) + scale * xi


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def deviation(lanes, data, lane, t, wl, delta):  # pragma: no cover - compiled
    """δ = w − w* and |δ|² (both families)."""
    return delta_from(wl, data.ref, delta)


@numba.njit(nogil=True, inline="always")
def polynomial_escaped(data, wl):  # pragma: no cover - compiled
    """w_0 ≥ threshold."""
    return wl[0] >= data.threshold


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def polynomial_losses(lanes, data, common, lane, wl, delta, work):  # pragma: no cover - compiled
    """L(w) = Σ_i w_i² (a1_i/2 + a2_i w_i/3 + a3_i w_i²/4)."""
    if common.want_loss:
        val = 0.0
        for i in range(data.a1.shape[0]):
            wi = wl[i]
            val += wi * wi * (0.5 * data.a1[i] + wi * (data.a2[i] / 3.0 + wi * data.a3[i] / 4.0))
        feed_loss(lane, val, lanes.loss_count, lanes.sum_loss, lanes.loss_buf, lanes.loss_lag, lanes.loss_head)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def thesis_begin(lanes, data, common, lane, n_u):  # pragma: no cover - compiled
    """The lane's weights (a view) and scratch: ``work`` = (per-sample gradients, a row per
    component (matched noise only), their 2 × 2 covariance, its Cholesky factor)."""
    s = n_u if common.added == 0 else common.n_samples
    idx = np.arange(s)
    weight = np.full(s, 1.0 / s)
    per_sample = np.empty((2, s)) if common.added >= 2 else np.empty((2, 0))
    return lanes.w[lane], np.empty(2), np.empty(2), idx, weight, (per_sample, np.empty((2, 2)), np.empty((2, 2)))


@numba.njit(nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def thesis_gradient(lanes, data, common, lane, step, wl, idx, weight, g, work):  # pragma: no cover
    """The step's noisy gradient: the sum over the S drawn samples (sampled noise), or the full
    gradient plus isotropic noise (``added`` 1) or matched noise from the 2 × 2 covariance of
    the per-sample gradients (2, 3: :func:`thesis_matched`). σ goes through
    :func:`sgdsweep.vecmath.exp`, so the sample loop vectorises."""
    a, b = wl[0], wl[1]
    added = common.added
    x, y = data.x, data.y
    if added >= 2:
        per_sample, cov, chol = work
        thesis_matched(a, b, x, y, common.noise_amp, added == 3, lanes.z, lane, step, per_sample, cov, chol, g)
    else:
        ga = 0.0
        gb = 0.0
        for k in range(idx.shape[0]):
            xk = x[idx[k]]
            sig = 1.0 / (1.0 + exp(-a * xk))
            r = 2.0 * weight[k] * (a * a + xk * (1.0 + b * sig) - y[idx[k]])
            ga += r * (2.0 * a + b * xk * xk * sig * (1.0 - sig))
            gb += r * xk * sig
        g[0] = ga
        g[1] = gb
    if added == 1:
        g[0] += common.noise_amp * lanes.z[lane, step, 0]
        g[1] += common.noise_amp * lanes.z[lane, step, 1]


@numba.njit(nogil=True, inline="always")
def thesis_escaped(data, wl):  # pragma: no cover - compiled
    """(w − saddle)·normal > 0, where escape is checked."""
    return data.check_escape and (wl[0] - data.saddle[0]) * data.normal[0] + (wl[1] - data.saddle[1]) * data.normal[1] > 0


@numba.njit(nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def thesis_losses(lanes, data, common, lane, wl, delta, work):  # pragma: no cover - compiled
    """L(w) = mean_μ (f(a, b; x_μ) − y_μ)²."""
    if common.want_loss:
        x, y = data.x, data.y
        p = x.shape[0]
        a, b = wl[0], wl[1]
        val = 0.0
        for q in range(p):
            f = a * a + x[q] * (1.0 + b / (1.0 + exp(-a * x[q]))) - y[q]
            val += f * f
        feed_loss(lane, val / p, lanes.loss_count, lanes.sum_loss, lanes.loss_buf, lanes.loss_lag, lanes.loss_head)


@numba.njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def thesis_matched(a, b, x, y, noise_amp, student, z, lane, step, per_sample, cov, chol, g):  # pragma: no cover
    """g = ḡ + noise_amp · L z for the thesis landscape at (a, b): the full gradient ḡ (the mean
    of the P per-sample gradients g_μ) plus matched noise drawn from their covariance, L Lᵀ =
    Σ_μ (g_μ − ḡ)(g_μ − ḡ)ᵀ (:func:`sgdsweep.noise.cholesky_psd`), z = z[lane, step, :2] — times the
    Student-t factor of z[lane, step, 2:2 + ν] when ``student``. As :func:`sgdsweep.noise.added_noise`."""
    p = x.shape[0]
    ma = 0.0
    mb = 0.0
    for k in range(p):  # per-sample gradients (vecmath.exp: the loop vectorises)
        xk = x[k]
        sig = 1.0 / (1.0 + exp(-a * xk))
        r = 2.0 * (a * a + xk * (1.0 + b * sig) - y[k])
        ga = r * (2.0 * a + b * xk * xk * sig * (1.0 - sig))
        gb = r * xk * sig
        per_sample[0, k] = ga
        per_sample[1, k] = gb
        ma += ga
        mb += gb
    ma /= p
    mb /= p
    caa = 0.0
    cab = 0.0
    cbb = 0.0
    for k in range(p):
        da = per_sample[0, k] - ma
        db = per_sample[1, k] - mb
        caa += da * da
        cab += da * db
        cbb += db * db
    cov[0, 0] = caa
    cov[1, 0] = cab
    cov[0, 1] = cab
    cov[1, 1] = cbb
    cholesky_psd(cov, chol)
    amp = noise_amp * student_factor(z, lane, step, 2) if student else noise_amp
    z0, z1 = z[lane, step, 0], z[lane, step, 1]
    g[0] = ma + amp * chol[0, 0] * z0
    g[1] = mb + amp * (chol[1, 0] * z0 + chol[1, 1] * z1)
