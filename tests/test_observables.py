"""The streaming loss accumulators against direct sums over the whole series."""

from __future__ import annotations

import numpy as np
import pytest

from sgdsweep import observables as obs


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
        head, last, count = obs.loss_series_ends(acc.arrays, lane)
        assert count == x.size
        np.testing.assert_array_equal(head, x[:k])
        np.testing.assert_array_equal(last, x[-k:])
        assert acc.arrays["sum_loss"][lane] == pytest.approx(np.sum(x), rel=1e-12)
