"""The streaming accumulators against direct sums over the whole series, and the mirroring of Σδδᵀ."""

from __future__ import annotations

import numpy as np
import pytest

from sgdsweep.sim import observables as obs


class _Problem:
    dim = 3
    linear_in_w = False


def test_lagged_products_head_and_tail_match_the_series():
    """Σ_t L_t L_{t−m} (m < K) over a series that wraps the K-sample ring buffer many times,
    for two lanes fed on different steps; the head and the last K samples come back in order."""
    k, n = 8, 53
    rng = np.random.default_rng(0)
    series = rng.random((2, n))
    acc = obs.Accumulators.create(2, _Problem(), obs.ObserveSpec(autocorr_lags=k, test_loss=False), False)
    fed = [0, 0]
    for t in range(n):
        for lane in range(2):
            if lane == 1 and t % 3 == 0:  # lane 1 skips some steps: its own sample count
                continue
            sel = np.array([lane == 0, lane == 1])
            obs.update_losses(acc, np.where(sel, series[:, fed[lane]], 0.0), None, sel)
            fed[lane] += 1
    for lane in range(2):
        x = series[lane, : fed[lane]]
        direct = [np.dot(x[m:], x[: x.size - m]) for m in range(k)]
        np.testing.assert_allclose(acc.arrays["loss_lag"][lane], direct, rtol=1e-12)
        head, last, count = obs.loss_series_ends(acc.arrays, np.array([lane]))
        assert count[0] == x.size
        np.testing.assert_array_equal(head[0], x[:k])
        np.testing.assert_array_equal(last[0], x[-k:])
        assert acc.arrays["sum_loss"][lane] == pytest.approx(np.sum(x), rel=1e-12)


def test_autocorr_times_of_all_lanes_match_the_direct_estimate():
    """τ_int from the streaming sums, all lanes at once, against the autocovariance of each whole
    series centred on its mean with Sokal's window; a lane with n ≤ 2K samples gives NaN."""
    k, lengths = 16, [400, 1000, 250, 30]
    rng = np.random.default_rng(3)
    series = []
    for n, phi in zip(lengths, [0.9, 0.5, -0.3, 0.7]):
        x, v = np.empty(n), 0.0
        for t in range(n):
            v = phi * v + rng.normal()
            x[t] = 2.0 + v
        series.append(x)
    acc = obs.Accumulators.create(len(lengths), _Problem(), obs.ObserveSpec(autocorr_lags=k, test_loss=False), False)
    for t in range(max(lengths)):
        sel = np.array([t < n for n in lengths])
        obs.update_losses(acc, np.array([x[t] if t < x.size else 0.0 for x in series]), None, sel)
    tau, truncated = obs.integrated_autocorr_times(acc.arrays, np.arange(len(lengths)))
    for lane, x in enumerate(series):
        if x.size <= 2 * k:
            assert np.isnan(tau[lane]) and truncated[lane]
            continue
        d = x - x.mean()
        cov = np.array([np.dot(d[m:], d[: d.size - m]) / (d.size - m) for m in range(k)])
        direct = 1.0 + 2.0 * np.cumsum(cov[1:] / cov[0])
        fits = np.flatnonzero(np.arange(1, k) >= 5.0 * direct)
        assert truncated[lane] == (fits.size == 0)
        assert tau[lane] == pytest.approx(direct[fits[0]] if fits.size else direct[-1], rel=1e-10)
    assert 3.0 < tau[0] < 40.0 and tau[2] < 1.0  # AR(1): (1 + φ)/(1 − φ) = 19 and 0.54


def test_symmetrize_mirrors_the_lanes_that_measured_and_leaves_the_others_untouched():
    """The upper triangle of Σδδᵀ is the lower one mirrored, for every lane with a measured step;
    a lane with none keeps its array as it was (all zeros in a run: never written, so a run
    without measured steps never pages in the L·d² doubles)."""
    rng = np.random.default_rng(3)
    lower = np.tril(rng.standard_normal((3, 5, 5)))
    sum_dd = lower.copy()
    obs.symmetrize(sum_dd, np.array([4, 0, 1]))
    for lane in (0, 2):
        np.testing.assert_array_equal(sum_dd[lane], lower[lane] + np.tril(lower[lane], -1).T)
    np.testing.assert_array_equal(sum_dd[1], lower[1])
