"""Compiled helpers of the models (numba), imported when a simulation needs them: planning a
sweep imports the models but never pays numba's import."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def batch_grad(x, y, w, idx, eps):  # pragma: no cover - compiled
    """Mean over the batch ``idx`` (L, S) of (W x − y − ε) xᵀ, without gathering the batch."""
    n_lanes, s = idx.shape
    n_out, n_in = w.shape[1], w.shape[2]
    g = np.zeros((n_lanes, n_out, n_in))
    with_eps = eps.shape[0] > 0
    for lane in range(n_lanes):
        for k in range(s):
            row = idx[lane, k]
            for o in range(n_out):
                r = -y[row, o]
                if with_eps:
                    r -= eps[lane, k, o]
                for i in range(n_in):
                    r += w[lane, o, i] * x[row, i]
                r /= s
                for i in range(n_in):
                    g[lane, o, i] += r * x[row, i]
    return g
