"""The SGD kernel for linear regression: many lanes (point × replica) advanced together.

A *lane* is one replica of one point. All lanes of a call share the data set, the batch size
and the sampling scheme; learning rate, momentum and burn-in are per lane. Random numbers come
from one ``numpy.random.Generator`` per lane, drawn in blocks of steps and consumed by a
compiled (numba) loop, so a lane's trajectory is bitwise the same whatever other lanes share
the call and however the work is chunked.

Per lane the kernel keeps streaming sums after burn-in — Σδ, Σδδᵀ and the count — so memory is
independent of the number of steps. A lane whose |δ|² exceeds its divergence bound or stops
being finite is flagged with the step and stops costing compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

#: Upper bound on the random numbers held per block (memory ≈ 8 bytes each).
BLOCK_RANDOM_NUMBERS = 2_000_000


@dataclass
class LaneResults:
    """Streaming sums per lane after burn-in.

    Attributes:
        sum_delta: Σ δ_t over measured steps, shape (L, N).
        sum_outer: Σ δ_t δ_tᵀ, shape (L, N, N).
        count: number of measured steps, shape (L,).
        diverged_step: step at which the lane diverged, −1 if it did not, shape (L,).
    """

    sum_delta: np.ndarray
    sum_outer: np.ndarray
    count: np.ndarray
    diverged_step: np.ndarray


@numba.njit(cache=True, nogil=True)
def _advance(x, y, w_hat, lr, momentum, burn_in, bound, replace, batch_size, t0, u,
             w, mom, perm, grad, sum_delta, sum_outer, count, diverged_step):  # pragma: no cover
    """Advance every lane over the steps t0 … t0 + u.shape[1] − 1 (compiled)."""
    n_lanes, n_steps, _ = u.shape
    p, n = x.shape
    for lane in range(n_lanes):
        if diverged_step[lane] >= 0:
            continue
        lam = lr[lane]
        mu = momentum[lane]
        for step in range(n_steps):
            t = t0 + step
            for i in range(n):
                grad[i] = 0.0
            for k in range(batch_size):
                if replace:
                    j = int(u[lane, step, k] * p)
                    if j >= p:
                        j = p - 1
                    row = j
                else:  # partial Fisher–Yates on the lane's permutation: S distinct samples
                    j = k + int(u[lane, step, k] * (p - k))
                    if j >= p:
                        j = p - 1
                    tmp = perm[lane, k]
                    perm[lane, k] = perm[lane, j]
                    perm[lane, j] = tmp
                    row = perm[lane, k]
                r = -y[row]
                for i in range(n):
                    r += x[row, i] * w[lane, i]
                for i in range(n):
                    grad[i] += r * x[row, i]
            d2 = 0.0
            for i in range(n):
                mom[lane, i] = mu * mom[lane, i] + grad[i] / batch_size
                w[lane, i] -= lam * mom[lane, i]
                d = w[lane, i] - w_hat[i]
                d2 += d * d
            if not (d2 <= bound[lane]):  # also catches NaN
                diverged_step[lane] = t
                break
            if t >= burn_in[lane]:
                count[lane] += 1
                for i in range(n):
                    di = w[lane, i] - w_hat[i]
                    sum_delta[lane, i] += di
                    for k2 in range(i + 1):
                        sum_outer[lane, i, k2] += di * (w[lane, k2] - w_hat[k2])


def run_lanes(x: np.ndarray, y: np.ndarray, w_hat: np.ndarray, w0: np.ndarray, *,
              lr: np.ndarray, momentum: np.ndarray, burn_in: np.ndarray, bound: np.ndarray,
              batch_size: int, replace: bool, steps: int,
              generators: list[np.random.Generator]) -> LaneResults:
    """Run SGD with heavy-ball momentum on L lanes for ``steps`` updates.

    Args:
        x, y: data, shapes (P, N) and (P,).
        w_hat: minimiser ŵ, shape (N,); δ = w − ŵ is what is accumulated.
        w0: initial weights, shape (N,) (the same for every lane).
        lr, momentum, burn_in, bound: per-lane λ, μ, burn-in steps and the divergence bound
            on |δ|², shapes (L,).
        batch_size: S, samples per step.
        replace: draw the S samples with replacement (``minibatch_replace``) or as S
            distinct samples (``minibatch``).
        steps: number of updates.
        generators: one generator per lane (its only source of randomness).

    Returns:
        The per-lane streaming sums (:class:`LaneResults`); ``sum_outer`` is symmetric.
    """
    n_lanes = len(generators)
    p, n = x.shape
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    w_hat = np.ascontiguousarray(w_hat, dtype=np.float64)
    w = np.tile(np.asarray(w0, dtype=np.float64), (n_lanes, 1))
    mom = np.zeros((n_lanes, n))
    perm = np.tile(np.arange(p, dtype=np.int64), (n_lanes, 1))
    grad = np.zeros(n)
    res = LaneResults(sum_delta=np.zeros((n_lanes, n)), sum_outer=np.zeros((n_lanes, n, n)),
                      count=np.zeros(n_lanes, dtype=np.int64),
                      diverged_step=np.full(n_lanes, -1, dtype=np.int64))
    args = (np.ascontiguousarray(lr, dtype=np.float64), np.ascontiguousarray(momentum, dtype=np.float64),
            np.ascontiguousarray(burn_in, dtype=np.int64), np.ascontiguousarray(bound, dtype=np.float64))
    block = max(1, min(steps, BLOCK_RANDOM_NUMBERS // max(1, n_lanes * batch_size)))
    u = np.empty((n_lanes, block, batch_size))
    for t0 in range(0, steps, block):
        nb = min(block, steps - t0)
        ub = u if nb == block else np.empty((n_lanes, nb, batch_size))
        for lane, gen in enumerate(generators):
            gen.random(out=ub[lane])
        _advance(x, y, w_hat, *args, bool(replace), int(batch_size), t0, ub,
                 w, mom, perm, grad, res.sum_delta, res.sum_outer, res.count, res.diverged_step)
    # fill the upper triangle from the accumulated lower one
    iu = np.triu_indices(n, 1)
    res.sum_outer[:, iu[0], iu[1]] = res.sum_outer[:, iu[1], iu[0]]
    return res
