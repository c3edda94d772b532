"""The thesis landscape in the block loop (``landscape: thesis``, Vescovi's escape problem:
f(a, b; x) = a² + x(1 + b σ(a x)), loss = mean (f − y)², w = (a, b)) with sampled noise under
SGD (not ``label``) or added noise (SGD or the SDE); matched noise is drawn from the 2 × 2
covariance of the per-sample gradients (:func:`sgdsweep.sim.noise.matched_by_covariance`). A
lane escapes when (w − saddle)·normal > 0. The sample loops take σ through
:func:`sgdsweep.sim.vecmath.exp` and are compiled with NumPy's error model, so they vectorise.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np

from sgdsweep.core.noise_types import NOISE
from sgdsweep.sim.kernels.common import (
    ADDED_CODE,
    DELTA_BUFFER,
    FAST,
    data_set_amplitude,
    delta_from,
    draw,
    feed_loss,
    flush,
    heavy_ball,
    moments,
    student_factor,
)
from sgdsweep.sim.kernels.loop import make_kernels
from sgdsweep.sim.noise import MODE, cholesky_psd
from sgdsweep.sim.vecmath import exp


class ThesisData(NamedTuple):
    """The thesis landscape's data set and geometry (d = 2: w = (a, b))."""

    x: np.ndarray  #: (P,) inputs
    y: np.ndarray  #: (P,) labels
    ref: np.ndarray  #: (2,) the starting minimum
    saddle: np.ndarray  #: (2,) the saddle point
    normal: np.ndarray  #: (2,) the separatrix normal, pointing away from ``ref``
    check_escape: bool  #: whether a lane stops when (w − saddle)·normal > 0


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Sampled noise without fresh labels (not ``label``) under SGD, or added noise (SGD or the SDE);
    no D(m)."""
    if noise_lags or problem.w_min is None:
        return False
    return (noise in MODE and not NOISE[noise].fresh_labels and dynamics_kind == "sgd") or noise in ADDED_CODE


amplitude = data_set_amplitude


def data(problem, noise: str, batch_size: int, want_test: bool, escape: bool,
         noise_lags: list[int]) -> ThesisData:
    """:class:`ThesisData` of a :class:`sgdsweep.models.landscape.Thesis` problem."""
    return ThesisData(problem.x, problem.y, problem.w_min, problem.saddle_point, problem.normal, escape)


@numba.njit(nogil=True, fastmath=FAST, error_model="numpy", inline="always")
def block(full, t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
    """The block loop (:mod:`sgdsweep.sim.kernels.loop`) of the thesis landscape: the sum over
    the S drawn samples (sampled noise), or the full gradient plus isotropic noise (``added`` 1)
    or matched noise from the 2 × 2 covariance of the per-sample gradients (2, 3:
    :func:`thesis_matched`); a lane escapes when (w − saddle)·normal > 0, where checked."""
    (ust, w, mom, lr, mu, burn, bound, stride, perm, pos, count, sum_d, sum_dd, sum_d2, sketch,
     loss_count, sum_loss, _sum_test_loss, loss_buf, loss_lag, loss_head, diverged_step, escape_step,
     _reference, _noise_buf, _noise_lag, _sum_gram, stopped) = lanes
    added, noise_amp, mode, n_batches, _n_samples, omega, want_loss, dt_over_lr = common
    x, y, ref, saddle, normal, check_escape = data
    n_lanes = w.shape[0]
    p = x.shape[0]
    s = n_u if added == 0 else p
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(2)
        delta = np.empty(2)
        dbuf = np.empty((DELTA_BUFFER, 2))
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        per_sample = np.empty((2, s)) if added >= 2 else np.empty((2, 0))  # g_μ, a row per component
        cov = np.empty((2, 2))
        chol = np.empty((2, 2))
        wl = w[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        dt = lr[lane] * dt_over_lr
        for step in range(n_steps):
            t = t0 + step
            if added == 0:
                st_hi, st_lo = draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            a, b = wl[0], wl[1]
            if added >= 2:
                thesis_matched(a, b, x, y, noise_amp, added == 3, z, lane, step, per_sample, cov, chol, g)
            else:
                ga = 0.0
                gb = 0.0
                for k in range(s):
                    xk = x[idx[k]]
                    sig = 1.0 / (1.0 + exp(-a * xk))
                    r = 2.0 * weight[k] * (a * a + xk * (1.0 + b * sig) - y[idx[k]])
                    ga += r * (2.0 * a + b * xk * xk * sig * (1.0 - sig))
                    gb += r * xk * sig
                g[0] = ga
                g[1] = gb
            if added == 1:
                g[0] += noise_amp * z[lane, step, 0]
                g[1] += noise_amp * z[lane, step, 1]
            heavy_ball(wl, g, mom, lane, mu[lane], dt)
            d2 = delta_from(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            escaped = check_escape and (wl[0] - saddle[0]) * normal[0] + (wl[1] - saddle[1]) * normal[1] > 0
            if t >= burn[lane]:
                nbuf = moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
                if sample_losses and t % stride[lane] == 0:
                    if want_loss:
                        a, b = wl[0], wl[1]
                        val = 0.0
                        for q in range(p):
                            f = a * a + x[q] * (1.0 + b / (1.0 + exp(-a * x[q]))) - y[q]
                            val += f * f
                        feed_loss(lane, val / p, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                    loss_count[lane] += 1
            if escaped:
                escape_step[lane] = t
                stopped[lane] = True
                break
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if full and nbuf > 0:
            flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def thesis_matched(a, b, x, y, noise_amp, student, z, lane, step, per_sample, cov, chol, g):  # pragma: no cover
    """g = ḡ + noise_amp · L z for the thesis landscape at (a, b): the full gradient ḡ (the mean
    of the P per-sample gradients g_μ) plus matched noise drawn from their covariance, L Lᵀ =
    Σ_μ (g_μ − ḡ)(g_μ − ḡ)ᵀ (:func:`sgdsweep.sim.noise.cholesky_psd`), z = z[lane, step, :2] — times the
    Student-t factor of z[lane, step, 2:2 + ν] when ``student``. As :func:`sgdsweep.sim.noise.added_noise`."""
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


#: The compiled kernels (with Σδδᵀ, with Σδ² and the sketch), under NumPy's error model.
KERNELS = make_kernels(sys.modules[__name__], error_model="numpy")
