"""The steps every family's block loop shares (:mod:`sgdsweep.sim.kernels.loop`): the heavy-ball
update, the deviation from the reference, the sample draw from the lane's PCG64 state, the
streaming moments and loss samples, and the per-sample weights of matched added noise.

All work on one lane (index ``lane`` of the per-lane arrays) at one step and take plain arrays
and scalars; arrays are float64 unless named otherwise, indices int64.
"""

from __future__ import annotations

import numba
import numpy as np

from sgdsweep.core.noise_types import NOISE, NoiseType
from sgdsweep.sim.noise import STUDENT_NU
from sgdsweep.sim.pcg64 import next_double


def added_code(t: NoiseType) -> int:
    """``Common.added`` of the noise type ``t``, from its properties: 0 sampled noise, 1 added
    noise not matched (isotropic, or a model's own C), 2 matched Gaussian noise, 3 heavy-tailed
    noise (a ``nu``: its Gaussian times the Student-t factor of :func:`student_factor`)."""
    if t.sampled:
        return 0
    if t.nu is not None:
        return 3
    return 2 if t.matched else 1


#: ``Common.added`` of each added-noise type (:func:`added_code`; the kernels compare with these
#: numbers).
ADDED_CODE: dict[str, int] = {name: added_code(t) for name, t in NOISE.items() if not t.sampled}
#: Flags of every compiled kernel function: reassociation and fused multiply-add, nothing that
#: changes results for non-finite values.
FAST = {"reassoc", "contract"}
#: Steps of δ buffered per lane before the full second moment Σδδᵀ takes them in one blocked
#: rank-k update (:func:`flush`).
DELTA_BUFFER = 16


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def heavy_ball(wl, g, mom, lane, mu, dt):  # pragma: no cover - compiled
    """One update of the lane's weights ``wl`` by the gradient ``g``: m ← μ m + g, w ← w − dt m
    (dt: the integrator's step, λ for SGD, the SDE's dt = λ·dt_over_lr; no momentum when ``mom``
    is empty; ``wl`` and ``g`` may be longer than the momentum, padded with zeros that stay 0)."""
    if mom.shape[0] > 0:
        for i in range(mom.shape[1]):
            m = mu * mom[lane, i] + g[i]
            mom[lane, i] = m
            wl[i] -= dt * m
    else:
        for i in range(wl.shape[0]):
            wl[i] -= dt * g[i]


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def delta_from(wl, ref, delta):  # pragma: no cover - compiled
    """δ = w − ref into ``delta``; returns |δ|² (not finite when w is not). ``wl`` may be
    longer than ``delta`` (padded)."""
    d2 = 0.0
    for i in range(delta.shape[0]):
        delta[i] = wl[i] - ref[i]
        d2 += delta[i] * delta[i]
    return d2


@numba.njit(cache=True, nogil=True, inline="always")
def draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx):  # pragma: no cover
    """One step's sample indices into ``idx`` from the lane's next S uniforms, drawn from its
    PCG64 state (st_hi, st_lo) and increment (:func:`sgdsweep.sim.pcg64.next_double`), exactly as
    :func:`sgdsweep.sim.noise.sample_indices` uses ``Generator.random``'s: mode 1 with replacement;
    0 a partial Fisher–Yates shuffle of the lane's permutation ``pl`` from position 0; 2
    continued at ``pos[lane]``. Returns the new state."""
    s = idx.shape[0]
    if mode == 1:
        for k in range(s):
            st_hi, st_lo, u = next_double(st_hi, st_lo, inc_hi, inc_lo)
            j = int(u * p)
            idx[k] = j if j < p else p - 1
        return st_hi, st_lo
    base = pos[lane] * s if mode == 2 else 0
    for k in range(s):
        st_hi, st_lo, u = next_double(st_hi, st_lo, inc_hi, inc_lo)
        a = base + k
        j = a + int(u * (p - a))
        if j >= p:
            j = p - 1
        pj = pl[j]
        pl[j] = pl[a]
        pl[a] = pj
        idx[k] = pj
    if mode == 2:
        pos[lane] = (pos[lane] + 1) % n_batches
    return st_hi, st_lo


@numba.njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega):  # pragma: no cover
    """One measured step of :func:`sgdsweep.sim.observables.update_moments`: n, Σδ, and, when
    ``full``, Σδδᵀ through the δ buffer (flushed when it fills up; returns its new fill), else
    Σδ² and the Nyström sketch."""
    d = delta.shape[0]
    count[lane] += 1
    for i in range(d):
        sum_d[lane, i] += delta[i]
    if full:
        for i in range(d):
            dbuf[nbuf, i] = delta[i]
        nbuf += 1
        if nbuf == DELTA_BUFFER:
            flush(dbuf, nbuf, sum_dd, lane)
            nbuf = 0
        return nbuf
    for i in range(d):
        sum_d2[lane, i] += delta[i] * delta[i]
    if sketch.shape[0] > 0:
        for c in range(omega.shape[1]):
            proj = 0.0
            for i in range(d):
                proj += delta[i] * omega[i, c]
            for i in range(d):
                sketch[lane, i, c] += delta[i] * proj
    return nbuf


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def flush(dbuf, nbuf, out, lane):  # pragma: no cover - compiled
    """Lower triangle of out[lane] (d × d) += Σ_b δ_b δ_bᵀ over the first ``nbuf`` rows δ_b of
    the δ buffer ``dbuf`` (DELTA_BUFFER × d); the upper triangle is left alone. Two rows of
    ``out`` and four steps at a time, innermost loops along j; the arrays are indexed directly
    (a row view costs an atomic reference-count update each time it is made)."""
    d = dbuf.shape[1]
    i = 0
    while i + 2 <= d:
        b = 0
        while b + 4 <= nbuf:
            a0, a1, a2, a3 = dbuf[b, i], dbuf[b + 1, i], dbuf[b + 2, i], dbuf[b + 3, i]
            c0, c1, c2, c3 = dbuf[b, i + 1], dbuf[b + 1, i + 1], dbuf[b + 2, i + 1], dbuf[b + 3, i + 1]
            for j in range(i + 1):
                x0, x1, x2, x3 = dbuf[b, j], dbuf[b + 1, j], dbuf[b + 2, j], dbuf[b + 3, j]
                out[lane, i, j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                out[lane, i + 1, j] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
            out[lane, i + 1, i + 1] += c0 * c0 + c1 * c1 + c2 * c2 + c3 * c3
            b += 4
        while b < nbuf:
            a0, c0 = dbuf[b, i], dbuf[b, i + 1]
            for j in range(i + 1):
                out[lane, i, j] += a0 * dbuf[b, j]
                out[lane, i + 1, j] += c0 * dbuf[b, j]
            out[lane, i + 1, i + 1] += c0 * c0
            b += 1
        i += 2
    if i < d:  # odd d: the last row alone
        for b in range(nbuf):
            a0 = dbuf[b, i]
            for j in range(i + 1):
                out[lane, i, j] += a0 * dbuf[b, j]


@numba.njit(cache=True, nogil=True)
def feed_loss(lane, val, loss_count, sum_loss, loss_buf, loss_lag, loss_head):  # pragma: no cover
    """One training-loss sample ``val``: its sum and the autocorrelation ring buffer
    (:func:`sgdsweep.sim.observables.update_losses`; the caller counts the sample). A call, not
    inlined: it runs once per loss sample, and its vector loops stay out of the step loop."""
    k = loss_buf.shape[1]
    if k > 0:
        n = loss_count[lane]
        at = n % k
        loss_buf[lane, at] = val
        if n < k:
            loss_head[lane, n] = val
        m = min(n + 1, k)
        # lags whose sample sits at or before `at`, then the rest (no modulo: an integer division
        # per lag); unsigned indices, which Numba does not check for wraparound (a signed index
        # of unknown sign costs a select per element, and the loop would not vectorise)
        top, end = np.uint64(at), np.uint64(at + k)
        for lag in range(np.uint64(min(m, at + 1))):
            loss_lag[lane, lag] += val * loss_buf[lane, top - lag]
        for lag in range(np.uint64(at + 1), np.uint64(m)):
            loss_lag[lane, lag] += val * loss_buf[lane, end - lag]
    sum_loss[lane] += val


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def matched_weights(z, lane, step, p, noise_amp, student, weight):  # pragma: no cover - compiled
    """Per-sample weights c_μ = 1/P + a (z_μ − z̄) of the full gradient plus ``gaussian_matched``
    noise (:mod:`sgdsweep.sim.kernels.affine`) from the step's normals z[lane, step]: z_μ = its first P;
    with ``student`` the amplitude a = ``noise_amp`` is scaled by √((ν−2)/V), V = the sum of squares of the last ν."""
    zbar = 0.0
    for q in range(p):
        zbar += z[lane, step, q]
    zbar /= p
    amp = noise_amp * student_factor(z, lane, step, p) if student else noise_amp
    inv_p = 1.0 / p
    for q in range(p):
        weight[q] = inv_p + amp * (z[lane, step, q] - zbar)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def student_factor(z, lane, step, first):  # pragma: no cover - compiled
    """√((ν−2)/V), V = the sum of squares of the ν = STUDENT_NU normals z[lane, step, first:first + ν]: the
    factor that makes Gaussian noise multivariate Student-t of the same covariance."""
    v = 0.0
    for j in range(first, first + STUDENT_NU):
        v += z[lane, step, j] * z[lane, step, j]
    return np.sqrt((STUDENT_NU - 2) / v)


def data_set_amplitude(problem, noise: str, batch_size: int, noise_scale: float) -> float:
    """The amplitude a of added noise on a data set: √(f/P) with f = (P−S)/(S(P−1)) for
    ``gaussian_matched`` and ``student_t`` (:mod:`sgdsweep.sim.kernels.affine`), the standard
    deviation √(gaussian_noise_var) per coordinate for ``gaussian`` — times the SDE's
    ``noise_scale``; 0 for sampled noise."""
    added = ADDED_CODE.get(noise, 0)
    if added == 1:
        return noise_scale * float(np.sqrt(problem.gaussian_noise_var(batch_size)))
    if added:
        p = problem.n_samples
        f = (p - batch_size) / (batch_size * (p - 1))
        return noise_scale * float(np.sqrt(f / p))
    return 0.0
