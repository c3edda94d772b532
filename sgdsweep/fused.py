"""The fused kernel: a block of SGD steps of single-layer (affine) models in one compiled loop.

:func:`sgdsweep.engine.run_lanes` advances lanes with numpy, one vectorised step at a time,
which costs about 100 µs of interpreter overhead per step whatever the number of lanes. For the
models whose gradient is affine in the weights (:class:`sgdsweep.models.affine.AffineProblem`:
``linear``, ``digits``, ``matrix``) with sampled noise (``minibatch``, ``minibatch_replace``,
``epoch``, ``label``) and SGD dynamics, this module runs the whole block instead — sample
selection, gradient, heavy-ball update, divergence check and the streaming accumulators of
:mod:`sgdsweep.observables` — lane by lane (so a lane's weights, momentum and N×N second moment
stay in cache for the block), optionally in threads over lanes (the compiled loop releases the GIL).

It consumes exactly the random numbers the numpy path consumes (the same per-lane uniform and
normal blocks, the same partial Fisher–Yates shuffle), so both paths give the same trajectories
up to floating-point rounding; ``tests/test_fused.py`` checks that.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .models.affine import AffineProblem
from .noise import MODE

#: Environment variable: threads the fused kernel may use in one process (default 1: a
#: sweep's parallelism is its Dask workers, one per core; set it for in-process runs).
THREADS_ENV = "SGDSWEEP_THREADS"
#: Accumulate-and-flush buffer of δ per lane (steps): the N×N second moment is updated from
#: this many steps at once (a blocked rank-k update) instead of once per step.
DELTA_BUFFER = 16


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int]) -> bool:
    """Whether the fused kernel can run this call (otherwise the numpy engine does)."""
    return (isinstance(problem, AffineProblem) and noise in MODE and dynamics_kind == "sgd"
            and not noise_lags and problem.w_min is not None)


def threads() -> int:
    """Threads the fused kernel uses: ``$SGDSWEEP_THREADS`` (default 1)."""
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads") from None
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads")
    return n


class Model:
    """The arrays of an :class:`AffineProblem` the kernel reads (empty where unused)."""

    def __init__(self, problem: AffineProblem) -> None:
        empty2 = np.zeros((0, 0))
        self.x, self.y = problem.x, problem.y
        self.metric = problem.metric if problem.metric is not None else empty2
        self.offsets = (problem.offsets.reshape(problem.n_samples, -1) if problem.offsets is not None
                        else empty2)
        self.sxx = np.ascontiguousarray(problem.sxx)
        self.loss_min = float(problem.loss_min)
        self.label_noise = float(problem.label_noise)
        if problem.test_quadratic is not None:
            self.test_a, self.test_b, self.test_c = problem.test_quadratic
            self.test_b = self.test_b.ravel()
        else:
            self.test_a, self.test_b, self.test_c = empty2, np.zeros(0), 0.0
        self.ref = problem.w_min
        self.n_out = problem.n_outputs


def advance(model: Model, mode: int, n_batches: int, t0: int, u: np.ndarray, z: np.ndarray,
            w: np.ndarray, mom: np.ndarray | None, lr: np.ndarray, mu: np.ndarray, burn: np.ndarray,
            bound: np.ndarray, stride: np.ndarray, perm: np.ndarray, pos: np.ndarray,
            acc: dict[str, np.ndarray], omega: np.ndarray, want_loss: bool, want_test: bool,
            n_threads: int) -> np.ndarray:
    """Advance the working lanes by ``u.shape[1]`` steps starting at step ``t0``, in place.

    ``u`` (L, steps, S) are the lanes' uniforms and ``z`` (L, steps, S·n_out) their normals
    (label noise; empty otherwise); ``acc`` the working accumulators of
    :class:`sgdsweep.observables.Accumulators`. A lane that diverges gets ``diverged_step`` and
    stops advancing. Returns the mask of lanes that stopped.
    """
    n_lanes = w.shape[0]
    stopped = np.zeros(n_lanes, dtype=np.bool_)
    e1, e2, e3 = np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0, 0))
    k_lags = acc["loss_buf"].shape[1] if "loss_buf" in acc else 0
    # per-lane arrays (sliced per thread) and shared ones
    lanes = [u, z, w, mom if mom is not None else e2, lr, mu, burn, bound, stride, perm, pos,
             acc["n"], acc["sum_d"], acc.get("sum_dd", e3), acc.get("sum_d2", e2), acc.get("sketch", e3),
             acc.get("loss_count", np.zeros(0, np.int64)), acc.get("sum_loss", e1), acc.get("sum_test_loss", e1),
             acc["loss_buf"] if k_lags else e2, acc["loss_lag"] if k_lags else e2,
             acc["loss_head"] if k_lags else e2, acc["diverged_step"], stopped]
    shared = (model.x, model.y, model.metric, model.offsets, model.label_noise, mode, n_batches, model.ref,
              omega, want_loss, want_test, model.sxx, model.loss_min, model.test_a, model.test_b,
              model.test_c)

    def run(lo: int, hi: int) -> None:
        _advance(t0, *[a[lo:hi] if a.shape[0] else a for a in lanes], *shared)

    n_threads = max(1, min(n_threads, n_lanes))
    if n_threads == 1:
        run(0, n_lanes)
    else:  # the kernel releases the GIL: threads over contiguous lane ranges
        cuts = np.linspace(0, n_lanes, n_threads + 1).astype(int)
        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(run, cuts[:-1], cuts[1:]))
    return stopped


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _advance(t0, u, z, w, mom, lr, mu, burn, bound, stride, perm, pos,
             count, sum_d, sum_dd, sum_d2, sketch, loss_count, sum_loss, sum_test_loss,
             loss_buf, loss_lag, loss_head, diverged_step, stopped,
             x, y, metric, offsets, label_noise, mode, n_batches, ref,
             omega, want_loss, want_test, sxx, loss_min, test_a, test_b, test_c):  # pragma: no cover - compiled
    """The block loop of :func:`advance` over lanes ``[0, L)`` of the per-lane arrays."""
    n_lanes, n_steps, s = u.shape
    p, n_in = x.shape
    n_out = y.shape[1]
    d = n_in * n_out
    has_metric = metric.shape[0] > 0
    has_offsets = offsets.shape[0] > 0
    has_label = z.shape[2] > 0
    has_mom = mom.shape[0] > 0
    full = sum_dd.shape[0] > 0
    has_sketch = sketch.shape[0] > 0
    k_sketch = omega.shape[1]
    k_lags = loss_buf.shape[1]
    sample_losses = loss_count.shape[0] > 0
    nb = DELTA_BUFFER
    for lane in range(n_lanes):
        g = np.empty(d)
        r = np.empty(n_out)
        res = np.empty((s, n_out))  # per batch row: residual, then its metric-weighted share
        delta = np.empty(d)
        dbuf = np.empty((d, nb))  # δ of the last buffered measured steps, column per step
        nbuf = 0
        idx = np.empty(s, np.int64)
        inv_s = 1.0 / s
        wl = w[lane]
        pl = perm[lane] if mode != 1 else perm[0]
        for step in range(n_steps):
            t = t0 + step
            # -- sample selection (sgdsweep.noise.sample_indices) --
            if mode == 1:
                for k in range(s):
                    j = int(u[lane, step, k] * p)
                    idx[k] = j if j < p else p - 1
            else:
                base = pos[lane] * s if mode == 2 else 0
                for k in range(s):
                    a = base + k
                    j = a + int(u[lane, step, k] * (p - a))
                    if j >= p:
                        j = p - 1
                    pj = pl[j]
                    pl[j] = pl[a]
                    pl[a] = pj
                    idx[k] = pj
                if mode == 2:
                    pos[lane] = (pos[lane] + 1) % n_batches
            # -- minibatch gradient: mean over the batch of M (W x − y − ε) xᵀ − a, four rows at a
            # time (each weight and gradient element loaded once per four rows) --
            for k0 in range(0, s, 4):
                i0, i1, i2, i3 = idx[k0], idx[min(k0 + 1, s - 1)], idx[min(k0 + 2, s - 1)], idx[min(k0 + 3, s - 1)]
                for o in range(n_out):
                    off = o * n_in
                    a0 = a1 = a2 = a3 = 0.0
                    for i in range(n_in):
                        wi = wl[off + i]
                        a0 += wi * x[i0, i]
                        a1 += wi * x[i1, i]
                        a2 += wi * x[i2, i]
                        a3 += wi * x[i3, i]
                    res[k0, o] = a0
                    if k0 + 1 < s:
                        res[k0 + 1, o] = a1
                    if k0 + 2 < s:
                        res[k0 + 2, o] = a2
                    if k0 + 3 < s:
                        res[k0 + 3, o] = a3
            for k in range(s):
                row = idx[k]
                for o in range(n_out):
                    r[o] = res[k, o] - y[row, o]
                    if has_label:
                        r[o] -= label_noise * z[lane, step, k * n_out + o]
                for o in range(n_out):
                    if has_metric:
                        acc = 0.0
                        for q in range(n_out):
                            acc += metric[o, q] * r[q]
                        res[k, o] = acc * inv_s
                    else:
                        res[k, o] = r[o] * inv_s
            for i in range(d):
                g[i] = 0.0
            for k0 in range(0, s, 4):
                i0, i1, i2, i3 = idx[k0], idx[min(k0 + 1, s - 1)], idx[min(k0 + 2, s - 1)], idx[min(k0 + 3, s - 1)]
                for o in range(n_out):
                    off = o * n_in
                    e0 = res[k0, o]
                    e1 = res[k0 + 1, o] if k0 + 1 < s else 0.0
                    e2 = res[k0 + 2, o] if k0 + 2 < s else 0.0
                    e3 = res[k0 + 3, o] if k0 + 3 < s else 0.0
                    for i in range(n_in):
                        g[off + i] += e0 * x[i0, i] + e1 * x[i1, i] + e2 * x[i2, i] + e3 * x[i3, i]
            if has_offsets:
                for k in range(s):
                    row = idx[k]
                    for i in range(d):
                        g[i] -= offsets[row, i] * inv_s
            # -- heavy-ball update --
            lam = lr[lane]
            if has_mom:
                m = mom[lane]
                mul = mu[lane]
                for i in range(d):
                    m[i] = mul * m[i] + g[i]
                    wl[i] -= lam * m[i]
            else:
                for i in range(d):
                    wl[i] -= lam * g[i]
            d2 = 0.0
            for i in range(d):
                delta[i] = wl[i] - ref[i]
                d2 += delta[i] * delta[i]
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            if t < burn[lane]:
                continue
            # -- accumulators (sgdsweep.observables) --
            count[lane] += 1
            for i in range(d):
                sum_d[lane, i] += delta[i]
            if full:
                for i in range(d):
                    dbuf[i, nbuf] = delta[i]
                nbuf += 1
                if nbuf == nb:
                    _flush(dbuf, nbuf, sum_dd[lane])
                    nbuf = 0
            else:
                for i in range(d):
                    sum_d2[lane, i] += delta[i] * delta[i]
                if has_sketch:
                    for c in range(k_sketch):
                        proj = 0.0
                        for i in range(d):
                            proj += delta[i] * omega[i, c]
                        for i in range(d):
                            sketch[lane, i, c] += delta[i] * proj
            if sample_losses and t % stride[lane] == 0:
                if want_loss:
                    val = loss_min + 0.5 * _metric_form(delta, sxx, metric, n_out, n_in)
                    if k_lags > 0:
                        n = loss_count[lane]
                        at = n % k_lags
                        loss_buf[lane, at] = val
                        if n < k_lags:
                            loss_head[lane, n] = val
                        for lag in range(min(n + 1, k_lags)):
                            loss_lag[lane, lag] += val * loss_buf[lane, (at - lag) % k_lags]
                    sum_loss[lane] += val
                if want_test:
                    val = test_c
                    for o in range(n_out):
                        for i in range(n_in):
                            acc = 0.0
                            for j in range(n_in):
                                acc += test_a[i, j] * wl[o * n_in + j]
                            val += wl[o * n_in + i] * (0.5 * acc - test_b[o * n_in + i])
                    sum_test_loss[lane] += val
                loss_count[lane] += 1
        if full and nbuf > 0:
            _flush(dbuf, nbuf, sum_dd[lane])


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _flush(dbuf, nbuf, out):  # pragma: no cover - compiled
    """Lower triangle of out += Σ_b δ_b δ_bᵀ over the nbuf buffered columns of dbuf (d × nb)."""
    d = dbuf.shape[0]
    for i in range(d):
        for j in range(i + 1):
            acc = 0.0
            for b in range(nbuf):
                acc += dbuf[i, b] * dbuf[j, b]
            out[i, j] += acc


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _metric_form(delta, sxx, metric, n_out, n_in):  # pragma: no cover - compiled
    """tr(δᵀ M δ Σxx) for δ (n_out × n_in, flattened), M = metric (identity when empty)."""
    total = 0.0
    for o in range(n_out):
        for q in range(n_out):
            if metric.shape[0] > 0:
                m = metric[o, q]
            elif o == q:
                m = 1.0
            else:
                continue
            acc = 0.0
            for i in range(n_in):
                row = 0.0
                for j in range(n_in):
                    row += sxx[i, j] * delta[q * n_in + j]
                acc += delta[o * n_in + i] * row
            total += m * acc
    return total


