"""Streaming per-lane accumulators: memory independent of the number of steps.

What is accumulated after a lane's burn-in, per lane (``L`` lanes, ``d`` parameters):

- ``n``: measured steps; ``sum_d``: Σδ; ``sum_dd``: Σδδᵀ (d ≤ ``cov_max_dim``) or ``sum_d2``:
  Σδ² (the diagonal) beyond, with δ = w − reference (the unique minimiser, or for models whose
  minima form a manifold the lane's weights at its first measured step — centred at the end);
- ``sum_loss``, ``sum_test_loss``: Σ L(w), Σ L_test(w);
- ``loss_lag``: Σ L_t L_{t−m·stride} for m = 0 … K−1 over the loss sampled every ``stride``
  steps (ring buffer of K values), for the integrated autocorrelation time;
- ``noise_lag``: Σ b_tᵀ b_{t−m} (n_in × n_in per lag) of the gradient noise at the minimum
  b_t = −g_{B_t}(W*) (single-layer models), and ``sum_gram``: Σ δᵀδ (n_in × n_in) — Han et
  al.'s D(m) and Σ_WW (physics.md §3).

The engine compacts lanes that stop (diverged or escaped) out of the working arrays; their
accumulators are flushed into the full-size result first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np


@dataclass(frozen=True)
class ObserveSpec:
    """Which observables to accumulate (``dynamics.observe`` in the config).

    Attributes:
        cov_max_dim: full covariance up to this many parameters, diagonal beyond.
        loss: accumulate the training loss (and its autocorrelation).
        test_loss: accumulate the test loss (models that define one).
        autocorr_lags: K, lags of the loss autocorrelation ring buffer (0 = off).
        autocorr_stride: steps between loss samples fed to the autocorrelation buffer.
        noise_lags: lags m of D(m) (0 included automatically); empty = off.
        escape: stop lanes when the model says they escaped and record the step.
    """

    cov_max_dim: int = 64
    loss: bool = True
    test_loss: bool = True
    autocorr_lags: int = 128
    autocorr_stride: int = 1
    noise_lags: tuple[int, ...] = ()
    escape: bool = False


@dataclass
class Accumulators:
    """Working-set accumulators (leading dimension = working lanes)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def create(cls, n_lanes: int, problem, spec: ObserveSpec, reference_per_lane: bool) -> "Accumulators":
        d = problem.dim
        a: dict[str, np.ndarray] = {
            "n": np.zeros(n_lanes, np.int64),
            "sum_d": np.zeros((n_lanes, d)),
            "diverged_step": np.full(n_lanes, -1, np.int64),
            "escape_step": np.full(n_lanes, -1, np.int64),
        }
        if d <= spec.cov_max_dim:
            a["sum_dd"] = np.zeros((n_lanes, d, d))
        else:
            a["sum_d2"] = np.zeros((n_lanes, d))
        if reference_per_lane:
            a["reference"] = np.full((n_lanes, d), np.nan)
        if spec.loss:
            a["sum_loss"] = np.zeros(n_lanes)
            a["sum_loss2"] = np.zeros(n_lanes)
            if spec.autocorr_lags > 0:
                k = spec.autocorr_lags
                a["loss_buf"] = np.zeros((n_lanes, k))
                a["loss_lag"] = np.zeros((n_lanes, k))
                a["loss_head"] = np.zeros((n_lanes, k))
                a["loss_n"] = np.zeros(n_lanes, np.int64)
                a["loss_sum_ac"] = np.zeros(n_lanes)
        if spec.test_loss:
            a["sum_test_loss"] = np.zeros(n_lanes)
        if spec.noise_lags and problem.linear_in_w:
            n_in, kmax = problem.n_inputs, max(spec.noise_lags) + 1
            a["noise_buf"] = np.zeros((n_lanes, kmax, problem.n_outputs, n_in))
            a["noise_lag"] = np.zeros((n_lanes, len(noise_lag_list(spec)), n_in, n_in))
            a["sum_gram"] = np.zeros((n_lanes, n_in, n_in))
        return cls(a)

    def take(self, keep: np.ndarray) -> None:
        for k, v in self.arrays.items():
            self.arrays[k] = v[keep]


def noise_lag_list(spec: ObserveSpec) -> list[int]:
    """Lags of D(m): 0 first, then the configured ones."""
    return [0] + sorted(m for m in set(spec.noise_lags) if m > 0)


def update_moments(acc: Accumulators, delta: np.ndarray, sel: np.ndarray | None) -> None:
    """Add δ (L, d) of the lanes ``sel`` (bool mask, None = all)."""
    a = acc.arrays
    if sel is None:
        a["n"] += 1
        a["sum_d"] += delta
        if "sum_dd" in a:
            a["sum_dd"] += delta[:, :, None] * delta[:, None, :]
        else:
            a["sum_d2"] += delta * delta
        return
    a["n"][sel] += 1
    a["sum_d"][sel] += delta[sel]
    if "sum_dd" in a:
        a["sum_dd"][sel] += delta[sel, :, None] * delta[sel, None, :]
    else:
        a["sum_d2"][sel] += delta[sel] ** 2


def update_loss(acc: Accumulators, loss: np.ndarray, sel: np.ndarray | None, sample_ac: bool) -> None:
    """Add L(w) (L,); when ``sample_ac`` also feed the autocorrelation ring buffer."""
    a = acc.arrays
    if sel is None:
        a["sum_loss"] += loss
        a["sum_loss2"] += loss * loss
    else:
        a["sum_loss"][sel] += loss[sel]
        a["sum_loss2"][sel] += loss[sel] ** 2
    if not sample_ac or "loss_buf" not in a:
        return
    mask = np.ones(loss.size, dtype=np.bool_) if sel is None else sel
    _feed_autocorr(loss, mask, a["loss_buf"], a["loss_head"], a["loss_lag"], a["loss_n"], a["loss_sum_ac"])


@numba.njit(cache=True, nogil=True)
def _feed_autocorr(loss, mask, buf, head, lag, count, total):  # pragma: no cover - compiled
    """Append one loss sample per selected lane to its ring buffer and lagged-product sums."""
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
        for m in range(min(n + 1, k)):
            lag[lane, m] += v * buf[lane, (pos - m) % k]
        total[lane] += v
        count[lane] = n + 1


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
    n_lanes, n_out, n_in = b.shape
    kmax = buf.shape[1]
    for lane in range(n_lanes):
        if not mask[lane]:
            continue
        n = count[lane] - 1  # update_moments ran first this step
        pos = n % kmax
        buf[lane, pos] = b[lane]
        for j in range(lags.size):
            m = lags[j]
            if n < m:
                continue
            prev = buf[lane, (pos - m) % kmax]
            for o in range(n_out):
                for i in range(n_in):
                    bi = b[lane, o, i]
                    if bi == 0.0:
                        continue
                    for k in range(n_in):
                        lag_sums[lane, j, i, k] += bi * prev[o, k]
        for o in range(n_out):
            for i in range(n_in):
                di = delta[lane, o, i]
                for k in range(n_in):
                    gram[lane, i, k] += di * delta[lane, o, k]


def loss_series_ends(acc_arrays, lane: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first K, last K in time order, n) loss samples of one lane from its buffers."""
    k = acc_arrays["loss_buf"].shape[1]
    n = int(acc_arrays["loss_n"][lane])
    buf = acc_arrays["loss_buf"][lane]
    m = min(n, k)
    last = buf[(np.arange(n - m, n)) % k]
    return acc_arrays["loss_head"][lane][:m], last, n


def integrated_autocorr_time(lag_sums: np.ndarray, head: np.ndarray, last: np.ndarray, total: float,
                             n: int, c: float = 5.0) -> tuple[float, bool]:
    """Integrated autocorrelation time (in samples) from lagged product sums.

    ``lag_sums[m] = Σ_t L_t L_{t−m}`` over n samples, ``total = Σ_t L_t``, ``head``/``last`` the
    first and last K samples: the autocovariance is centred exactly on the overall mean,
    ``c(m) = [S(m) − μ(A_m + B_m)]/(n − m) + μ²`` with A_m, B_m the sums of samples m… and
    …n−1−m. Uses Sokal's automatic window (the smallest W with W ≥ c·τ(W)). Returns
    (τ, truncated): ``truncated`` is True when no such window exists within the stored lags (τ
    is then a lower bound).
    """
    k = lag_sums.size
    if n <= 2 * k:
        return float("nan"), True
    mean = total / n
    lags = np.arange(k)
    head_cum = np.concatenate([[0.0], np.cumsum(head)[:-1]])  # Σ of the first m samples
    tail_cum = np.concatenate([[0.0], np.cumsum(last[::-1])[:-1]])  # Σ of the last m samples
    a_m = total - head_cum
    b_m = total - tail_cum
    pairs = n - lags
    cov = (lag_sums - mean * (a_m + b_m)) / pairs + mean * mean
    if not cov[0] > 0:
        return float("nan"), True
    rho = cov / cov[0]
    tau = 1.0 + 2.0 * np.cumsum(rho[1:])
    windows = np.arange(1, k)
    ok = windows >= c * tau
    if ok.any():
        return float(tau[np.argmax(ok)]), False
    return float(tau[-1]), True
