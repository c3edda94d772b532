"""The two-layer linear network (``two_layer``: y = W2 W1 x, w = (vec W1, vec W2)) in the block
loop, with sampled noise or added noise (as in :mod:`.affine`: the per-sample gradients are
linear in G = Σ_μ c_μ e_μ x_μᵀ, so g = (W2ᵀ G, G W1ᵀ)). Its minima form a manifold: |w|² is
bounded, and each lane is measured around its weights at its first measured step
(``Lanes.reference``).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np

from sgdsweep.core.noise_types import MATCHED_ADDED_NOISE
from sgdsweep.sim.kernels.affine import plain_grad
from sgdsweep.sim.kernels.common import (
    ADDED_CODE,
    DELTA_BUFFER,
    FAST,
    data_set_amplitude,
    draw,
    feed_loss,
    flush,
    heavy_ball,
    matched_weights,
    moments,
)
from sgdsweep.sim.kernels.loop import make_kernels
from sgdsweep.sim.noise import MODE, matched_by_covariance, normals_per_step


class TwoLayerData(NamedTuple):
    """The network's data set and its losses' terms (P samples, N inputs, n_out outputs)."""

    x: np.ndarray  #: (P, N) inputs
    y: np.ndarray  #: (P, n_out) labels
    hidden: int  #: hidden width h
    label_noise: float  #: standard deviation of label noise
    has_label: bool  #: whether each step draws label noise (S·n_out normals)
    map_min: np.ndarray  #: (n_out, N) the end-to-end map W2 W1 at the minimum
    sxx: np.ndarray  #: (N, N) Σxx
    loss_min: float  #: the minimum training loss
    teacher: np.ndarray  #: (n_out, N) the teacher's map
    test_c: float  #: the test loss's label-noise term, n_out σ²/2
    want_test: bool  #: whether loss samples take the test loss


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Sampled noise under SGD or added noise (SGD or the SDE); no escape, no D(m), and matched
    noise as a weighted sum over the samples."""
    if noise_lags or escape:
        return False
    if noise in MATCHED_ADDED_NOISE and matched_by_covariance(problem):
        return False
    return (noise in MODE and dynamics_kind == "sgd") or noise in ADDED_CODE


amplitude = data_set_amplitude


def data(problem, noise: str, batch_size: int, want_test: bool, escape: bool,
         noise_lags: list[int]) -> TwoLayerData:
    """:class:`TwoLayerData` of a :class:`sgdsweep.models.two_layer.TwoLayerProblem` under
    ``noise`` at batch size ``batch_size``."""
    has_label = ADDED_CODE.get(noise, 0) == 0 and normals_per_step(noise, problem, batch_size) > 0
    return TwoLayerData(problem.x, problem.y, int(problem.hidden), float(problem.label_noise), has_label,
                        problem.map_min, problem.sxx, float(problem.loss_min), problem.teacher,
                        problem.n_outputs * problem.label_noise**2 / 2, want_test)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def block(full, t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
    """The block loop (:mod:`sgdsweep.sim.kernels.loop`) of the two-layer network with sampled
    noise (``added`` = 0) or added noise (as for affine problems: the per-sample gradients are
    linear in G = Σ_μ c_μ e_μ x_μᵀ, g = (W2ᵀ G, G W1ᵀ)). |w|² is bounded, and each lane is
    measured around its weights at its first measured step (``reference``)."""
    (ust, w, mom, lr, mu, burn, bound, stride, perm, pos, count, sum_d, sum_dd, sum_d2, sketch,
     loss_count, sum_loss, sum_test_loss, loss_buf, loss_lag, loss_head, diverged_step, _escape_step,
     reference, _noise_buf, _noise_lag, _sum_gram, stopped) = lanes
    added, noise_amp, mode, n_batches, _n_samples, omega, want_loss, dt_over_lr = common
    x, y, hidden, label_noise, has_label, map_min, sxx, loss_min, teacher, test_c, want_test = data
    n_lanes = w.shape[0]
    p, n_in = x.shape
    n_out = y.shape[1]
    n1 = hidden * n_in
    d = n1 + n_out * hidden
    s = n_u if added == 0 else p
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(d)
        prod = np.empty((n_out, n_in))
        gp = np.empty((n_out, n_in))
        e = np.empty(n_out)
        delta = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        wl = w[lane]
        ref = reference[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        dt = lr[lane] * dt_over_lr
        for step in range(n_steps):
            t = t0 + step
            if added == 0:
                st_hi, st_lo = draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            elif added >= 2:
                matched_weights(z, lane, step, p, noise_amp, added == 3, weight)
            end_to_end(wl, hidden, n_in, n_out, prod)
            if n_out == 1:  # G = Σ_k c_k (x_k·prod − y_k − ε_k) x_k: linear regression's gradient
                plain_grad(prod[0], x, y, 0, idx, weight, label_noise, z, lane, step, has_label, gp[0])
            else:
                two_layer_rows(prod, x, y, idx, weight, label_noise, z, lane, step, has_label, e, gp)
            for hh in range(hidden):  # g1 = W2ᵀ gp, g2 = gp W1ᵀ (innermost loops over inputs)
                for i in range(n_in):
                    g[hh * n_in + i] = 0.0
                for o in range(n_out):
                    c = wl[n1 + o * hidden + hh]
                    for i in range(n_in):
                        g[hh * n_in + i] += c * gp[o, i]
                for o in range(n_out):
                    acc = 0.0
                    for i in range(n_in):
                        acc += gp[o, i] * wl[hh * n_in + i]
                    g[n1 + o * hidden + hh] = acc
            if added == 1:
                for i in range(d):
                    g[i] += noise_amp * z[lane, step, i]
            heavy_ball(wl, g, mom, lane, mu[lane], dt)
            d2 = 0.0
            for i in range(d):
                d2 += wl[i] * wl[i]
            measuring = t >= burn[lane]
            if measuring and np.isnan(ref[0]):
                for i in range(d):
                    ref[i] = wl[i]
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            if not measuring:
                continue
            for i in range(d):
                delta[i] = wl[i] - ref[i]
            nbuf = moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
            if sample_losses and t % stride[lane] == 0:
                end_to_end(wl, hidden, n_in, n_out, prod)
                if want_loss:
                    val = 0.0
                    for o in range(n_out):
                        for i in range(n_in):
                            acc = 0.0
                            for j in range(n_in):
                                acc += sxx[i, j] * (prod[o, j] - map_min[o, j])
                            val += (prod[o, i] - map_min[o, i]) * acc
                    feed_loss(lane, loss_min + 0.5 * val, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                if want_test:
                    val = 0.0
                    for o in range(n_out):
                        for i in range(n_in):
                            val += (prod[o, i] - teacher[o, i]) ** 2
                    sum_test_loss[lane] += 0.5 * val / n_in + test_c
                loss_count[lane] += 1
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if full and nbuf > 0:
            flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def two_layer_rows(prod, x, y, idx, weight, label_noise, z, lane, step, has_label, e, gp):  # pragma: no cover
    """G = Σ_k c_k e_k x_kᵀ, e_k = prod x_k − y_k − ε_k (``prod`` = W2 W1, n_out × n_in; ε from
    z[lane, step] when ``has_label``; ``e``: scratch of n_out) — the two-layer gradient's data sum
    for several outputs (one output runs :func:`sgdsweep.sim.kernels.affine.plain_grad`)."""
    n_out, n_in = prod.shape
    gp[:, :] = 0.0
    for k in range(idx.shape[0]):
        row = idx[k]
        for o in range(n_out):
            acc = -y[row, o]
            if has_label:
                acc -= label_noise * z[lane, step, k * n_out + o]
            for i in range(n_in):
                acc += prod[o, i] * x[row, i]
            e[o] = acc * weight[k]
        for o in range(n_out):
            eo = e[o]
            for i in range(n_in):
                gp[o, i] += eo * x[row, i]


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def end_to_end(wl, hidden, n_in, n_out, prod):  # pragma: no cover - compiled
    """prod = W2 W1 (n_out × n_in) of the flattened two-layer weights wl."""
    n1 = hidden * n_in
    prod[:, :] = 0.0
    for o in range(n_out):
        for hh in range(hidden):
            c = wl[n1 + o * hidden + hh]
            for i in range(n_in):
                prod[o, i] += c * wl[hh * n_in + i]


#: The compiled kernels (with Σδδᵀ, with Σδ² and the sketch).
KERNELS = make_kernels(sys.modules[__name__])
