"""Affine problems in the block loop: single linear layers (:class:`sgdsweep.models.affine.AffineProblem`:
``linear``, ``digits``, ``matrix``) with sampled noise (``minibatch``, ``minibatch_replace``,
``epoch``, ``label``) or added noise (``gaussian``, ``gaussian_matched``, ``student_t``).

The per-sample gradient is g_μ = M (W x_μ − y_μ − ε_μ) x_μᵀ − a_μ (M: the metric, a_μ: the
offsets, ε: label noise). Sampled noise sums S drawn samples with weight 1/S. Added noise on a
data set is a weighted sum over all P samples: the full gradient plus ``gaussian_matched`` noise
is Σ_μ c_μ g_μ with c_μ = 1/P + a (z_μ − z̄), a = √(f/P) (times the Student-t factor and the
SDE's noise scale), because √(f/P) Σ_μ z_μ (g_μ − ḡ) = √(f/P) Σ_μ (z_μ − z̄) g_μ
(:func:`sgdsweep.sim.kernels.common.matched_weights`). Isotropic ``gaussian`` noise is the full
gradient M (W Σxx − Σyx) − ā plus ``noise_amp``·z.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numba
import numpy as np

from sgdsweep.core.noise_types import MATCHED_ADDED_NOISE
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
    matched_weights,
    moments,
)
from sgdsweep.sim.kernels.loop import make_kernels
from sgdsweep.sim.noise import MODE, matched_by_covariance, normals_per_step
from sgdsweep.sim.observables import feed_noise_lane

#: Inputs from which :func:`plain_grad` takes rows eight at a time (below, four).
EIGHT_ROWS_MIN = 32
#: Below :data:`EIGHT_ROWS_MIN` inputs, linear regression's gradient (one output, sampled noise,
#: no metric or offsets) runs on the inputs and weights padded with zero columns to a multiple
#: of this (:func:`padded_inputs`), so the row loops have no scalar remainder.
PAD_INPUTS = 4


class AffineData(NamedTuple):
    """An affine problem's arrays for the block loop (P samples, N inputs, n_out outputs)."""

    x: np.ndarray  #: (P, N) inputs
    y: np.ndarray  #: (P, n_out) labels
    rows: np.ndarray  #: the inputs the gradient reads: x, or x padded (:func:`padded_inputs`)
    metric: np.ndarray  #: (n_out, n_out) M (empty: the identity)
    offsets: np.ndarray  #: (P, n_out·N) a_μ (empty: none)
    label_noise: float  #: standard deviation of label noise
    has_label: bool  #: whether each step draws label noise (S·n_out normals)
    syx: np.ndarray  #: (n_out, N) Σyx
    a_mean: np.ndarray  #: (n_out, N) ā
    sxx: np.ndarray  #: (N, N) Σxx
    ref: np.ndarray  #: (d,) the minimum w*
    loss_min: float  #: L(w*)
    want_test: bool  #: whether loss samples take the test loss
    test_a: np.ndarray  #: (N, N) A of the test loss, or (1, N) its diagonal
    test_b: np.ndarray  #: (d,) b of the test loss
    test_c: float  #: c of the test loss: L_test = c + Σ_o w_oᵀ (½ A w_o − b_o)
    observe_noise: bool  #: whether D(m) is observed (sampled noise only)
    lags: np.ndarray  #: int64: the lags m of D(m), 0 first


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Sampled noise under SGD or added noise (SGD or the SDE), with D(m) where asked; no escape,
    a unique minimum, and matched noise as a weighted sum over the samples."""
    if problem.w_min is None or escape:
        return False
    if noise in MATCHED_ADDED_NOISE and matched_by_covariance(problem):
        return False
    return (noise in MODE and dynamics_kind == "sgd") or noise in ADDED_CODE


amplitude = data_set_amplitude


def data(problem, noise: str, batch_size: int, want_test: bool, escape: bool, noise_lags: list[int]) -> AffineData:
    """:class:`AffineData` of ``problem`` under ``noise`` at batch size ``batch_size``
    (``noise_lags``: the lags m of D(m), 0 first, when the gradient noise is observed)."""
    added = ADDED_CODE.get(noise, 0)
    has_label = normals_per_step(noise, problem, batch_size) > 0
    empty2 = np.zeros((0, 0))
    metric = problem.metric if problem.metric is not None else empty2
    offsets = problem.offsets.reshape(problem.n_samples, -1) if problem.offsets is not None else empty2
    if problem.test_quadratic is not None:
        test_a, test_b, test_c = problem.test_quadratic
        if np.count_nonzero(test_a - np.diag(np.diag(test_a))) == 0:  # isotropic inputs: A = I/N
            test_a = np.ascontiguousarray(np.diag(test_a)).reshape(1, -1)  # its diagonal, a row
    else:
        test_a, test_b, test_c = empty2, np.zeros((0, 0)), 0.0
    plain = added == 0 and problem.y.shape[1] == 1 and metric.size == 0 and offsets.size == 0
    x_pad = padded_inputs(problem.x) if plain else empty2
    return AffineData(
        x=problem.x, y=problem.y, rows=x_pad if x_pad.size else problem.x, metric=metric, offsets=offsets,
        label_noise=float(problem.label_noise), has_label=added == 0 and has_label,
        syx=problem.syx, a_mean=problem.a_mean, sxx=problem.sxx, ref=np.asarray(problem.w_min),
        loss_min=float(problem.loss_min),
        want_test=want_test and test_a.size > 0, test_a=test_a, test_b=test_b.ravel(), test_c=float(test_c),
        observe_noise=added == 0 and len(noise_lags) > 0, lags=np.asarray(noise_lags, dtype=np.int64))


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def block(full, t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
    """The block loop (:mod:`sgdsweep.sim.kernels.loop`) of affine problems: sampled noise
    (``added`` = 0: S drawn samples, weight 1/S each), isotropic ``gaussian`` (1: the full
    gradient M (W Σxx − Σyx) − ā plus ``noise_amp``·z) or ``gaussian_matched``/``student_t``
    (2, 3: every sample, weighted by :func:`matched_weights`). With sampled noise and
    ``observe_noise``, the gradient noise at the minimum b = −g_B(W*) of the step's batch feeds
    D(m) (Han et al.)."""
    (ust, w, mom, lr, mu, burn, bound, stride, perm, pos, count, sum_d, sum_dd, sum_d2, sketch,
     loss_count, sum_loss, sum_test_loss, loss_buf, loss_lag, loss_head, diverged_step, _escape_step,
     _reference, noise_buf, noise_lag, sum_gram, stopped) = lanes
    added, noise_amp, mode, n_batches, _n_samples, omega, want_loss, dt_over_lr = common
    (x, y, rows, metric, offsets, label_noise, has_label, syx, a_mean, sxx, ref, loss_min, want_test,
     test_a, test_b, test_c, observe_noise, lags) = data
    n_lanes = w.shape[0]
    p, n_in = x.shape
    n_out = y.shape[1]
    d = n_in * n_out
    s = n_u if added == 0 else p  # rows of the gradient sum
    sample_losses = loss_count.shape[0] > 0
    d_grad = rows.shape[1] * n_out  # longer than d where the gradient runs on padded inputs
    for lane in range(n_lanes):
        g = np.empty(d_grad)
        tmp = np.empty(d)
        delta = np.empty(d)
        noise_b = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        if d_grad > d:
            wl = np.zeros(d_grad)  # the lane's weights for the block (the padding stays 0)
            for i in range(d):
                wl[i] = w[lane, i]
        else:
            wl = w[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        dt = lr[lane] * dt_over_lr
        for step in range(n_steps):
            t = t0 + step
            if added == 0:
                st_hi, st_lo = draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            elif added >= 2:
                matched_weights(z, lane, step, p, noise_amp, added == 3, weight)
            if added == 1:
                affine_full_grad(wl, sxx, syx, metric, a_mean, n_out, n_in, tmp, g)
                for i in range(d):
                    g[i] += noise_amp * z[lane, step, i]
            else:
                affine_grad(wl, rows, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp, g)
            heavy_ball(wl, g, mom, lane, mu[lane], dt)
            d2 = delta_from(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            if t < burn[lane]:
                continue
            nbuf = moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
            if observe_noise:
                noise_at_minimum(lane, ref, x, y, idx, weight, metric, offsets, label_noise, z, step, has_label,
                                 tmp, noise_b, delta, lags, count, noise_buf, noise_lag, sum_gram)
            if sample_losses and t % stride[lane] == 0:
                if want_loss:
                    feed_loss(lane, loss_min + 0.5 * metric_form(delta, sxx, metric, n_out, n_in),
                              loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                if want_test:  # c + Σ_o w_oᵀ (½ A w_o − b_o); A given by its diagonal when a row
                    val = test_c
                    for o in range(n_out):
                        lo = o * n_in
                        if test_a.shape[0] == 1:
                            for i in range(n_in):
                                wi = wl[lo + i]
                                val += wi * (0.5 * test_a[0, i] * wi - test_b[lo + i])
                        else:
                            sym_times(test_a, wl, lo, tmp)
                            for i in range(n_in):
                                val += wl[lo + i] * (0.5 * tmp[i] - test_b[lo + i])
                    sum_test_loss[lane] += val
                loss_count[lane] += 1
        if d_grad > d:
            for i in range(d):
                w[lane, i] = wl[i]
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if full and nbuf > 0:
            flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def plain_grad(wl, x, y, o, idx, weight, label_noise, z, lane, step, has_label, g):  # pragma: no cover - compiled
    """g_o = Σ_k weight_k (x_k·w_o − y_ko − ε_k) x_k: one output's data sum (the whole gradient
    of linear regression) into entries o·n_in … (o + 1)·n_in − 1 of g, w_o the same entries of
    wl (ε_k = label_noise · z[lane, step, k·n_out + o] when ``has_label``, n_out = y's columns; offsets,
    not per-output slices, which cost time on every step): rows eight (from
    :data:`EIGHT_ROWS_MIN` inputs), four, then two, then one at a time, each group's residuals
    and its share of g in one visit (a weight or gradient element loaded once per group; eight
    row streams in flight hide the latency of gathering them from L2). Inlined by Numba."""
    n_in = x.shape[1]
    n_out = y.shape[1]
    s = idx.shape[0]
    lo = o * n_in  # output o's entries of wl and g
    for i in range(n_in):
        g[lo + i] = 0.0
    k = 0
    while n_in >= EIGHT_ROWS_MIN and k + 8 <= s:
        r0, r1, r2, r3 = idx[k], idx[k + 1], idx[k + 2], idx[k + 3]
        r4, r5, r6, r7 = idx[k + 4], idx[k + 5], idx[k + 6], idx[k + 7]
        a0, a1, a2, a3 = -y[r0, o], -y[r1, o], -y[r2, o], -y[r3, o]
        a4, a5, a6, a7 = -y[r4, o], -y[r5, o], -y[r6, o], -y[r7, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
            a2 += wi * x[r2, i]
            a3 += wi * x[r3, i]
            a4 += wi * x[r4, i]
            a5 += wi * x[r5, i]
            a6 += wi * x[r6, i]
            a7 += wi * x[r7, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o]
            a2 -= label_noise * z[lane, step, (k + 2) * n_out + o]
            a3 -= label_noise * z[lane, step, (k + 3) * n_out + o]
            a4 -= label_noise * z[lane, step, (k + 4) * n_out + o]
            a5 -= label_noise * z[lane, step, (k + 5) * n_out + o]
            a6 -= label_noise * z[lane, step, (k + 6) * n_out + o]
            a7 -= label_noise * z[lane, step, (k + 7) * n_out + o]
        a0 *= weight[k]
        a1 *= weight[k + 1]
        a2 *= weight[k + 2]
        a3 *= weight[k + 3]
        a4 *= weight[k + 4]
        a5 *= weight[k + 5]
        a6 *= weight[k + 6]
        a7 *= weight[k + 7]
        for i in range(n_in):
            g[lo + i] += (a0 * x[r0, i] + a1 * x[r1, i] + a2 * x[r2, i] + a3 * x[r3, i]
                     + a4 * x[r4, i] + a5 * x[r5, i] + a6 * x[r6, i] + a7 * x[r7, i])
        k += 8
    while k + 4 <= s:
        r0, r1, r2, r3 = idx[k], idx[k + 1], idx[k + 2], idx[k + 3]
        a0, a1, a2, a3 = -y[r0, o], -y[r1, o], -y[r2, o], -y[r3, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
            a2 += wi * x[r2, i]
            a3 += wi * x[r3, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o]
            a2 -= label_noise * z[lane, step, (k + 2) * n_out + o]
            a3 -= label_noise * z[lane, step, (k + 3) * n_out + o]
        a0 *= weight[k]
        a1 *= weight[k + 1]
        a2 *= weight[k + 2]
        a3 *= weight[k + 3]
        for i in range(n_in):
            g[lo + i] += a0 * x[r0, i] + a1 * x[r1, i] + a2 * x[r2, i] + a3 * x[r3, i]
        k += 4
    while k < s:  # the last one to three rows, two at a time while two are left
        r0, r1 = idx[k], idx[min(k + 1, s - 1)]
        two = k + 1 < s
        a0, a1 = -y[r0, o], -y[r1, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o] if two else 0.0
        a0 *= weight[k]
        a1 = a1 * weight[k + 1] if two else 0.0
        for i in range(n_in):
            g[lo + i] += a0 * x[r0, i] + a1 * x[r1, i]
        k += 2


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def affine_grad(wl, x, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp,
                g):  # pragma: no cover
    """g = Σ_k weight_k g_{idx_k}(W) of the affine per-sample gradients g_μ = M (W x_μ − y_μ − ε_μ)
    x_μᵀ − a_μ (ε: label noise from z[lane, step] when ``has_label``; ``tmp``: scratch of d):
    output by output the data sum G_o = Σ_k weight_k (W_o·x_k − y_ko − ε_ko) x_k
    (:func:`plain_grad`), then M applied once to G (it is linear, so M Σ = Σ M), then the
    offsets. Inlined into the block loop (it takes a dozen arrays)."""
    n_in = x.shape[1]
    n_out = y.shape[1]
    for o in range(n_out):
        plain_grad(wl, x, y, o, idx, weight, label_noise, z, lane, step, has_label, g)
    if metric.shape[0] > 0:
        for i in range(g.shape[0]):
            tmp[i] = g[i]
            g[i] = 0.0
        for o in range(n_out):
            lo = o * n_in
            for q in range(n_out):
                m = metric[o, q]
                lq = q * n_in
                for i in range(n_in):
                    g[lo + i] += m * tmp[lq + i]
    if offsets.shape[0] > 0:
        for k in range(idx.shape[0]):
            row = idx[k]
            c = weight[k]
            for i in range(g.shape[0]):
                g[i] -= c * offsets[row, i]


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def noise_at_minimum(lane, ref, x, y, idx, weight, metric, offsets, label_noise, z, step, has_label, tmp, noise_b,
                     delta, lags, count, noise_buf, noise_lag, sum_gram):  # pragma: no cover - compiled
    """Han's D(m) for one measured step of one lane: the gradient noise at the minimum of the
    step's batch, b = −g_B(W*), and δ into :func:`sgdsweep.sim.observables.feed_noise_lane`."""
    affine_grad(ref, x, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp, noise_b)
    for i in range(noise_b.shape[0]):
        noise_b[i] = -noise_b[i]
    feed_noise_lane(lane, noise_b, delta, lags, count, noise_buf, noise_lag, sum_gram)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def affine_full_grad(wl, sxx, syx, metric, a_mean, n_out, n_in, r, g):  # pragma: no cover - compiled
    """The full gradient M (W Σxx − Σyx) − ā of an affine problem into ``g`` (``r``: scratch of
    n_out; Σxx is symmetric, so its rows are read)."""
    for i in range(n_in):
        for o in range(n_out):
            acc = -syx[o, i]
            for j in range(n_in):
                acc += wl[o * n_in + j] * sxx[i, j]
            r[o] = acc
        for o in range(n_out):
            if metric.shape[0] > 0:
                acc = 0.0
                for q in range(n_out):
                    acc += metric[o, q] * r[q]
            else:
                acc = r[o]
            g[o * n_in + i] = acc - a_mean[o, i]


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def sym_times(a, u, lo, out):  # pragma: no cover - compiled
    """out[:n] = A u[lo:lo + n] for an n × n A, a dot product per row."""
    n = a.shape[0]
    for i in range(n):
        acc = 0.0
        for j in range(n):
            acc += a[i, j] * u[lo + j]
        out[i] = acc


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def metric_form(delta, sxx, metric, n_out, n_in):  # pragma: no cover - compiled
    """tr(δᵀ M δ Σxx) for δ (n_out × n_in, flattened), M = metric (identity when empty), as
    Σ_{o,q} M_oq δ_oᵀ (Σxx δ_q): each entry of Σxx δ_q a dot product, used at once (no scratch
    row). Inlined into the block loop."""
    total = 0.0
    for q in range(n_out):
        lq = q * n_in
        for i in range(n_in):
            acc = 0.0
            for j in range(n_in):
                acc += sxx[i, j] * delta[lq + j]
            if metric.shape[0] == 0:
                total += acc * delta[lq + i]
            else:
                for o in range(n_out):
                    total += metric[o, q] * acc * delta[o * n_in + i]
    return total


def padded_inputs(x: np.ndarray) -> np.ndarray:
    """The rows of ``x`` (P × N) with zero columns appended up to a multiple of
    :data:`PAD_INPUTS`, for :func:`plain_grad`'s loops; an empty (0, 0) array where N is a
    multiple already or N ≥ :data:`EIGHT_ROWS_MIN` (rows go eight at a time there)."""
    p, n_in = x.shape
    width = -(-n_in // PAD_INPUTS) * PAD_INPUTS
    if width == n_in or n_in >= EIGHT_ROWS_MIN:
        return np.zeros((0, 0))
    out = np.zeros((p, width))
    out[:, :n_in] = x
    return out


#: The compiled kernels (with Σδδᵀ, with Σδ² and the sketch).
KERNELS = make_kernels(sys.modules[__name__])
