"""Additive-noise problems in the block loop: a gradient that is a per-coordinate polynomial,
g_i = a1_i w_i + a2_i w_i² + a3_i w_i³ (``quadratic``, the ``double_well`` landscape), plus
noise L z with L Lᵀ = C/S (C: the problem's noise covariance), ``gaussian`` or ``student_t``
(the last STUDENT_NU normals of a step make the χ²), under SGD or the SDE; a lane escapes when
w_0 ≥ the problem's threshold.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np

from sgdsweep.core.noise_types import DATA_FREE_NOISE
from sgdsweep.sim.kernels.common import (
    DELTA_BUFFER,
    FAST,
    delta_from,
    feed_loss,
    flush,
    heavy_ball,
    moments,
    student_factor,
)
from sgdsweep.sim.kernels.loop import make_kernels

#: The noise types of this family: those that need no data set (a model's own noise covariance).
NOISE: tuple[str, ...] = DATA_FREE_NOISE


class AdditiveData(NamedTuple):
    """g_i = a1_i w_i + a2_i w_i² + a3_i w_i³ + noise, escape when w_0 ≥ ``threshold``."""

    a1: np.ndarray  #: (d,)
    a2: np.ndarray  #: (d,)
    a3: np.ndarray  #: (d,)
    chol: np.ndarray  #: (d, d) lower-triangular L, L Lᵀ = C/S (C: the noise covariance)
    threshold: float  #: escape threshold on w_0 (inf: none)
    ref: np.ndarray  #: (d,) the minimum w*


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """``gaussian`` or ``student_t`` noise (SGD or the SDE) on a problem with a minimum and
    polynomial coefficients; no D(m)."""
    return (not noise_lags and problem.w_min is not None and getattr(problem, "polynomial", None) is not None
            and noise in NOISE)


def amplitude(problem, noise: str, batch_size: int, noise_scale: float) -> float:
    """The noise's factor: the SDE's noise scale (1 for SGD); C/S is in :attr:`AdditiveData.chol`."""
    return float(noise_scale)


def data(problem, noise: str, batch_size: int, want_test: bool, escape: bool,
         noise_lags: list[int]) -> AdditiveData:
    """:class:`AdditiveData` of a problem with ``polynomial`` coefficients at batch size S."""
    a1, a2, a3 = (np.asarray(c, dtype=np.float64) for c in problem.polynomial)
    return AdditiveData(a1, a2, a3, np.ascontiguousarray(problem.noise_chol) / np.sqrt(batch_size),
                        float(getattr(problem, "escape_threshold", np.inf)), problem.w_min)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def block(full, t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
    """The block loop (:mod:`sgdsweep.sim.kernels.loop`) of the polynomial gradient with additive
    noise: g = the polynomial + scale · L z (z: the step's first d normals; Student-t when
    ``added`` is 3: the factor of the next ν normals); a lane escapes when w_0 ≥ threshold."""
    (_ust, w, mom, lr, mu, burn, bound, stride, _perm, _pos, count, sum_d, sum_dd, sum_d2, sketch,
     loss_count, sum_loss, _sum_test_loss, loss_buf, loss_lag, loss_head, diverged_step, escape_step,
     _reference, _noise_buf, _noise_lag, _sum_gram, stopped) = lanes
    added, noise_amp, _mode, _n_batches, _n_samples, omega, want_loss, dt_over_lr = common
    a1, a2, a3, chol, threshold, ref = data
    n_lanes = w.shape[0]
    d = a1.shape[0]
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(d)
        delta = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        wl = w[lane]
        dt = lr[lane] * dt_over_lr
        for step in range(n_steps):
            t = t0 + step
            scale = noise_amp * student_factor(z, lane, step, d) if added == 3 else noise_amp
            for i in range(d):
                xi = 0.0
                for j in range(i + 1):  # chol is lower triangular
                    xi += chol[i, j] * z[lane, step, j]
                wi = wl[i]
                g[i] = wi * (a1[i] + wi * (a2[i] + wi * a3[i])) + scale * xi
            heavy_ball(wl, g, mom, lane, mu[lane], dt)
            d2 = delta_from(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            escaped = wl[0] >= threshold
            if t >= burn[lane]:
                nbuf = moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
                if sample_losses and t % stride[lane] == 0:
                    if want_loss:
                        val = 0.0
                        for i in range(d):
                            wi = wl[i]
                            val += wi * wi * (0.5 * a1[i] + wi * (a2[i] / 3.0 + wi * a3[i] / 4.0))
                        feed_loss(lane, val, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                    loss_count[lane] += 1
            if escaped:
                escape_step[lane] = t
                stopped[lane] = True
                break
        if full and nbuf > 0:
            flush(dbuf, nbuf, sum_dd, lane)


#: The compiled kernels (with Σδδᵀ, with Σδ² and the sketch).
KERNELS = make_kernels(sys.modules[__name__])
