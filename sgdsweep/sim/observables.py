"""Streaming per-lane accumulators: memory independent of the number of steps.

What is accumulated after a lane's burn-in, per lane (``L`` lanes, ``d`` parameters):

- ``n``: measured steps; ``sum_d``: Σδ; ``sum_dd``: Σδδᵀ (d ≤ ``cov_max_dim``) or ``sum_d2``:
  Σδ² (the diagonal) beyond, with δ = w − reference (the unique minimiser, or for models whose
  minima form a manifold the lane's weights at its first measured step — centred at the end);
- ``sum_loss``, ``sum_test_loss``, ``loss_count``: Σ L(w), Σ L_test(w) over the measured steps
  that are multiples of ``stride`` (:func:`sgdsweep.sim.replicas.loss_stride`: an eighth of the
  slowest relaxation time of the mean dynamics, a thinning that costs almost no information),
  and their number;
- ``loss_lag``: Σ L_t L_{t−m·stride} for m = 0 … K−1 (ring buffer of K values), for the
  integrated autocorrelation time;
- ``noise_lag``: Σ b_tᵀ b_{t−m} (n_in × n_in per lag) of the gradient noise at the minimum
  b_t = −g_{B_t}(W*) (single-layer models), and ``sum_gram``: Σ δᵀδ (n_in × n_in) — Han et
  al.'s D(m) and Σ_WW (docs/physics.md §3).

The engine compacts lanes that stop (diverged or escaped) out of the working arrays; their
accumulators are flushed into the full-size result first.

Hand-written: Sokal's automatic window (:func:`integrated_autocorr_times`) here works on these
streaming lagged sums; library estimators (emcee, ArviZ) need the whole series, which a sweep
does not keep. ``tests/sim/test_observables.py`` pins it against the estimate on the full series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from sgdsweep.sim.shapes import ObserveSpec, accumulator_layout, noise_lag_list, sketch_width

__all__ = ["Accumulators", "ObserveSpec", "noise_lag_list", "sketch_width"]


@dataclass
class Accumulators:
    """Working-set accumulators (leading dimension = working lanes)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def create(cls, n_lanes: int, problem, spec: ObserveSpec, reference_per_lane: bool) -> Accumulators:
        """Fresh accumulators of ``n_lanes`` lanes (:func:`sgdsweep.sim.shapes.accumulator_layout`);
        the zeroed ones from ``np.zeros``, whose pages are not touched until written."""
        layout = accumulator_layout(problem, spec, reference_per_lane)
        return cls({name: np.zeros((n_lanes, *shape), dtype) if fill == 0 else np.full((n_lanes, *shape), fill, dtype)
                    for name, (shape, dtype, fill) in layout.items()})

    def take(self, keep: np.ndarray) -> None:
        for k, v in self.arrays.items():
            self.arrays[k] = v[keep]


def update_moments(acc: Accumulators, delta: np.ndarray, sel: np.ndarray | None) -> None:
    """Add δ (L, d) of the lanes ``sel`` (bool mask, None = all)."""
    a = acc.arrays
    mask = np.ones(delta.shape[0], dtype=np.bool_) if sel is None else sel
    if "sum_dd" in a:
        _accumulate_full(delta, mask, a["n"], a["sum_d"], a["sum_dd"])
        return
    a["n"][mask] += 1
    a["sum_d"][mask] += delta[mask]
    a["sum_d2"][mask] += delta[mask] ** 2
    if "sketch" in a:
        omega = sketch_matrix(delta.shape[1], a["sketch"].shape[2])
        a["sketch"][mask] += delta[mask, :, None] * (delta[mask] @ omega)[:, None, :]


@numba.njit(cache=True, nogil=True)
def _accumulate_full(delta, mask, count, sum_d, sum_dd):  # pragma: no cover - compiled
    """n += 1, Σδ += δ and the lower triangle of Σδδᵀ += δδᵀ (mirrored by :func:`symmetrize`)."""
    n_lanes, d = delta.shape
    for lane in range(n_lanes):
        if not mask[lane]:
            continue
        count[lane] += 1
        for i in range(d):
            di = delta[lane, i]
            sum_d[lane, i] += di
            for j in range(i + 1):
                sum_dd[lane, i, j] += di * delta[lane, j]


@numba.njit(cache=True, nogil=True)
def symmetrize(sum_dd: np.ndarray, count: np.ndarray) -> None:  # pragma: no cover - compiled
    """Fill the upper triangle of the accumulated Σδδᵀ (L, d, d) from its lower one, in place,
    for the lanes that measured a step (``count`` > 0). A lane that measured none keeps its
    zeros untouched: in a run without measured steps (all burn-in) the L·d² doubles are then
    never written, so the pages of the freshly allocated array are never faulted in (at
    L = 1024, d = 100: 82 MB, up to 0.18 s on first touch here)."""
    d = sum_dd.shape[1]
    for lane in range(sum_dd.shape[0]):
        if count[lane] == 0:
            continue
        for i in range(d):
            for j in range(i):
                sum_dd[lane, j, i] = sum_dd[lane, i, j]


_OMEGA: dict[tuple[int, int], np.ndarray] = {}


def sketch_matrix(d: int, k: int) -> np.ndarray:
    """The fixed Gaussian test matrix Ω (d × k) of the Nyström sketch Y = Σ δ (δᵀΩ) = n·MΩ."""
    key = (d, k)
    if key not in _OMEGA:
        _OMEGA[key] = np.random.default_rng(12345).standard_normal((d, k))
    return _OMEGA[key]


def nystrom_eigenpairs(y: np.ndarray, omega: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Leading k eigenpairs of a PSD matrix M from its sketch Y = MΩ (single-pass Nyström,
    Tropp et al. 2017): M ≈ Y (ΩᵀY)⁺ Yᵀ. Returns (eigenvalues descending, eigenvectors d × k)."""
    nu = np.finfo(float).eps * np.linalg.norm(y)
    ys = y + nu * omega
    b = omega.T @ ys
    b = 0.5 * (b + b.T)
    c = np.linalg.cholesky(b + 1e-14 * np.trace(b) * np.eye(b.shape[0]))
    f = np.linalg.solve(c, ys.T).T  # Y C⁻ᵀ
    u, sv, _ = np.linalg.svd(f, full_matrices=False)
    vals = np.maximum(sv**2 - nu, 0.0)
    return vals[:k], u[:, :k]


def update_losses(acc: Accumulators, loss: np.ndarray | None, test_loss: np.ndarray | None,
                  sel: np.ndarray | None) -> None:
    """Add one sample of L(w) and L_test(w) (each (L,) or None) of the lanes ``sel``; the
    training loss also feeds the autocorrelation ring buffer."""
    a = acc.arrays
    mask = np.ones(a["loss_count"].size, dtype=np.bool_) if sel is None else sel
    if loss is not None:
        if "loss_buf" in a:
            _feed_autocorr(loss, mask, a["loss_buf"], a["loss_head"], a["loss_lag"], a["loss_count"])
        a["sum_loss"][mask] += loss[mask]
    if test_loss is not None:
        a["sum_test_loss"][mask] += test_loss[mask]
    a["loss_count"][mask] += 1


@numba.njit(cache=True, nogil=True)
def _feed_autocorr(loss, mask, buf, head, lag, count):  # pragma: no cover - compiled
    """Append one loss sample per selected lane (its index: ``count``) to its ring buffer and
    lagged-product sums."""
    k = buf.shape[1]
    for lane in range(loss.size):
        if not mask[lane]:
            continue
        n = count[lane]
        pos = n % k
        v = loss[lane]
        buf[lane, pos] = v
        if n < k:
            head[lane, n] = v
        top = min(n + 1, k)
        # the ring buffer in two pieces (no modulo per lag), unsigned indices (no wraparound
        # check per element: the loops vectorise)
        last, end = np.uint64(pos), np.uint64(pos + k)
        for m in range(np.uint64(min(top, pos + 1))):
            lag[lane, m] += v * buf[lane, last - m]
        for m in range(np.uint64(pos + 1), np.uint64(top)):
            lag[lane, m] += v * buf[lane, end - m]


def update_noise(acc: Accumulators, b: np.ndarray, delta_mat: np.ndarray, sel: np.ndarray | None,
                 lags: list[int]) -> None:
    """Add the gradient noise at the minimum b_t (L, n_out, n_in) to the D(m) sums and δᵀδ of
    the single-layer weights δ (L, n_out, n_in) to Σ_WW's sum."""
    a = acc.arrays
    mask = np.ones(b.shape[0], dtype=np.bool_) if sel is None else sel
    _feed_noise(np.ascontiguousarray(b), np.ascontiguousarray(delta_mat), mask, np.asarray(lags, np.int64),
                a["n"], a["noise_buf"], a["noise_lag"], a["sum_gram"])


@numba.njit(cache=True, nogil=True)
def _feed_noise(b, delta, mask, lags, count, buf, lag_sums, gram):  # pragma: no cover - compiled
    for lane in range(b.shape[0]):
        if mask[lane]:
            feed_noise_lane(lane, b[lane].ravel(), delta[lane].ravel(), lags, count, buf, lag_sums, gram)


@numba.njit(cache=True, nogil=True)
def feed_noise_lane(lane, b, delta, lags, count, buf, lag_sums, gram):  # pragma: no cover - compiled
    """One measured step of one lane (after its count was incremented): the gradient noise at
    the minimum b (n_out × n_in, flattened row-major) into the ring buffer and the lagged sums
    Σ b_tᵀ b_{t−m}, and δᵀδ (δ: n_out × n_in, flattened) into the Gram sum."""
    n_out, n_in = buf.shape[2], buf.shape[3]
    kmax = buf.shape[1]
    n = count[lane] - 1
    pos = n % kmax
    cur = buf[lane, pos]
    for o in range(n_out):
        for i in range(n_in):
            cur[o, i] = b[o * n_in + i]
    for j in range(lags.size):
        m = lags[j]
        if n < m:
            continue
        prev = buf[lane, (pos - m) % kmax]
        out = lag_sums[lane, j]
        for o in range(n_out):
            for i in range(n_in):
                bi = b[o * n_in + i]
                if bi == 0.0:
                    continue
                for k in range(n_in):
                    out[i, k] += bi * prev[o, k]
    g = gram[lane]
    for o in range(n_out):
        for i in range(n_in):
            di = delta[o * n_in + i]
            for k in range(n_in):
                g[i, k] += di * delta[o * n_in + k]


def loss_series_ends(acc_arrays, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first K, last K in time order, n) loss samples of the lanes ``lanes`` (indices) from their
    buffers, shapes (lanes, K), (lanes, K), (lanes,); the K-sample rows are meaningful where n ≥ K."""
    k = acc_arrays["loss_buf"].shape[1]
    n = acc_arrays["loss_count"][lanes].astype(np.int64)
    last = np.take_along_axis(acc_arrays["loss_buf"][lanes], (n[:, None] - k + np.arange(k)) % k, axis=1)
    return acc_arrays["loss_head"][lanes], last, n


def integrated_autocorr_times(acc_arrays, lanes: np.ndarray, c: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Integrated autocorrelation time (in samples) of each lane's loss series, from its lagged
    product sums, for the lanes ``lanes`` (indices) of the accumulators ``acc_arrays``, all at once.

    With ``S(m) = Σ_t L_t L_{t−m}`` over a lane's n samples, K lags and μ its mean, the
    autocovariance is centred exactly on μ, ``c(m) = [S(m) − μ(A_m + B_m)]/(n − m) + μ²`` with
    A_m, B_m the sums of samples m…n−1 and 0…n−1−m (from the first and last K samples); Sokal's
    automatic window takes the smallest W with W ≥ c·τ(W), τ(W) = 1 + 2 Σ_{m=1..W} ρ(m).

    Returns:
        (τ, truncated), one entry per lane. τ is NaN, and truncated, where a lane has n ≤ 2K
        samples or no positive variance; truncated where no window fits within the stored lags
        (τ is then a lower bound, τ(K − 1)).
    """
    lag_sums = acc_arrays["loss_lag"][lanes]
    n_lanes, k = lag_sums.shape
    head, last, n = loss_series_ends(acc_arrays, lanes)
    if k < 2:
        return np.full(n_lanes, np.nan), np.ones(n_lanes, dtype=bool)
    total = acc_arrays["sum_loss"][lanes]
    lags = np.arange(k)
    zero = np.zeros((n_lanes, 1))
    a_m = total[:, None] - np.hstack([zero, np.cumsum(head, axis=1)[:, :-1]])  # less the first m samples
    b_m = total[:, None] - np.hstack([zero, np.cumsum(last[:, ::-1], axis=1)[:, :-1]])  # less the last m
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        cov = (lag_sums - mean[:, None] * (a_m + b_m)) / (n[:, None] - lags) + (mean * mean)[:, None]
        tau = 1.0 + 2.0 * np.cumsum(cov[:, 1:] / cov[:, :1], axis=1)
    fits = np.arange(1, k) >= c * tau
    found = fits.any(axis=1)
    taus = tau[np.arange(n_lanes), np.where(found, np.argmax(fits, axis=1), k - 2)]
    valid = (n > 2 * k) & (cov[:, 0] > 0)
    return np.where(valid, taus, np.nan), ~valid | ~found
