"""The two-layer linear network (``two_layer``: y = W2 W1 x, w = (vec W1, vec W2)) in the block
loop, with sampled noise or added noise (as in :mod:`.affine`: the per-sample gradients are
linear in G = Σ_μ c_μ e_μ x_μᵀ, so g = (W2ᵀ G, G W1ᵀ)). Its minima form a manifold: |w|² is
bounded, and each lane is measured around its weights at its first measured step
(``lanes.reference``).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .affine import plain_grad
from .common import FAST, feed_loss, matched_weights


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


def data(problem, added: int, want_test: bool, has_label: bool) -> TwoLayerData:
    """:class:`TwoLayerData` of a :class:`sgdsweep.models.two_layer.TwoLayerProblem`."""
    return TwoLayerData(problem.x, problem.y, int(problem.hidden), float(problem.label_noise),
                        added == 0 and has_label, np.ascontiguousarray(problem.map_min),
                        np.ascontiguousarray(problem.sxx), float(problem.loss_min),
                        np.ascontiguousarray(problem.teacher), problem.n_outputs * problem.label_noise**2 / 2,
                        want_test)


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def begin(lanes, data, common, lane, n_u):  # pragma: no cover - compiled
    """The lane's weights (a view) and scratch: ``work`` = (W2 W1, G, a row of n_out)."""
    n_in, n_out = data.x.shape[1], data.y.shape[1]
    d = data.hidden * (n_in + n_out)
    s = n_u if common.added == 0 else common.n_samples
    work = (np.empty((n_out, n_in)), np.empty((n_out, n_in)), np.empty(n_out))
    return lanes.w[lane], np.empty(d), np.empty(d), np.arange(s), np.full(s, 1.0 / s), work


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def gradient(lanes, data, common, lane, step, wl, idx, weight, g, work):  # pragma: no cover - compiled
    """The step's noisy gradient into ``g``: G from the drawn or weighted samples, then
    g1 = W2ᵀ G, g2 = G W1ᵀ (innermost loops over inputs), plus isotropic noise (``added`` 1)."""
    prod, gp, e = work
    x, y, hidden = data.x, data.y, data.hidden
    n_in, n_out = x.shape[1], y.shape[1]
    n1 = hidden * n_in
    added = common.added
    if added >= 2:
        matched_weights(lanes.z, lane, step, common.n_samples, common.noise_amp, added == 3, weight)
    end_to_end(wl, hidden, n_in, n_out, prod)
    if n_out == 1:  # G = Σ_k c_k (x_k·prod − y_k − ε_k) x_k: linear regression's gradient
        plain_grad(prod[0], x, y, 0, idx, weight, data.label_noise, lanes.z, lane, step, data.has_label, gp[0])
    else:
        two_layer_rows(prod, x, y, idx, weight, data.label_noise, lanes.z, lane, step, data.has_label, e, gp)
    for hh in range(hidden):
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
        for i in range(g.shape[0]):
            g[i] += common.noise_amp * lanes.z[lane, step, i]


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def deviation(lanes, data, lane, t, wl, delta):  # pragma: no cover - compiled
    """|w|²; from the first measured step on, δ = w − the lane's reference (its weights at that
    step, set then)."""
    d = delta.shape[0]
    d2 = 0.0
    for i in range(d):
        d2 += wl[i] * wl[i]
    if t >= lanes.burn[lane]:
        ref = lanes.reference[lane]
        if np.isnan(ref[0]):
            for i in range(d):
                ref[i] = wl[i]
        for i in range(d):
            delta[i] = wl[i] - ref[i]
    return d2


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def losses(lanes, data, common, lane, wl, delta, work):  # pragma: no cover - compiled
    """One loss sample: L(w) = L_min + ½ Σ_o (P_o − P*_o)ᵀ Σxx (P_o − P*_o) of the end-to-end
    map P = W2 W1, and the test loss ½ |P − teacher|²/N + n_out σ²/2."""
    prod = work[0]
    n_in, n_out = data.x.shape[1], data.y.shape[1]
    end_to_end(wl, data.hidden, n_in, n_out, prod)
    if common.want_loss:
        sxx, map_min = data.sxx, data.map_min
        val = 0.0
        for o in range(n_out):
            for i in range(n_in):
                acc = 0.0
                for j in range(n_in):
                    acc += sxx[i, j] * (prod[o, j] - map_min[o, j])
                val += (prod[o, i] - map_min[o, i]) * acc
        feed_loss(lane, data.loss_min + 0.5 * val, lanes.loss_count, lanes.sum_loss, lanes.loss_buf,
                  lanes.loss_lag, lanes.loss_head)
    if data.want_test:
        val = 0.0
        for o in range(n_out):
            for i in range(n_in):
                val += (prod[o, i] - data.teacher[o, i]) ** 2
        lanes.sum_test_loss[lane] += 0.5 * val / n_in + data.test_c


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def two_layer_rows(prod, x, y, idx, weight, label_noise, z, lane, step, has_label, e, gp):  # pragma: no cover
    """G = Σ_k c_k e_k x_kᵀ, e_k = prod x_k − y_k − ε_k (``prod`` = W2 W1, n_out × n_in; ε from
    z[lane, step] when ``has_label``; ``e``: scratch of n_out) — the two-layer gradient's data sum
    for several outputs (one output runs :func:`sgdsweep.kernels.affine.plain_grad`)."""
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
