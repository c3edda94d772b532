"""The block loop every problem family runs, and its driver :func:`advance`.

:func:`block_loop` advances each lane of a chunk by a block of steps, lane by lane (a lane's
weights, momentum and moments stay in cache for the block): draw the step's samples from the
lane's PCG64 state, take the family's noisy gradient, make the heavy-ball update, check
divergence and escape, and feed the streaming accumulators of :mod:`sgdsweep.observables`.
A family (:mod:`.affine`, :mod:`.two_layer`, :mod:`.landscape`) supplies seven hooks, compiled
functions that :func:`block_loop` receives as arguments and Numba inlines into it:

- ``begin(lanes, data, common, lane, n_u) -> (wl, g, delta, idx, weight, work)``: the lane's
  weights (a view, or a padded copy), scratch for the gradient and δ, the step's sample indices
  and weights, and the family's own scratch ``work`` (a tuple);
- ``gradient(lanes, data, common, lane, step, wl, idx, weight, g, work)``: the noisy gradient
  into ``g``;
- ``deviation(lanes, data, lane, t, wl, delta) -> |δ|²``: δ = w − reference into ``delta``, and
  the quantity bounded by ``lanes.bound``;
- ``escaped(data, wl) -> bool``; ``observe(lanes, data, common, lane, step, idx, weight,
  delta, work)``: extra per-step observables (the gradient noise of D(m)); ``losses(lanes,
  data, common, lane, wl, delta, work)``: one loss sample; ``finish(lanes, lane, wl)``.

Each family's compiled kernels (:mod:`.entries`) call :func:`block_loop` with its hooks, so Numba
compiles one specialised loop per family (a jitted function passed as an argument is a
compile-time constant, not a function pointer). The lane state travels as :class:`Lanes`, the
problem's arrays as the family's named tuple, both Numba named tuples.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numba
import numpy as np

from ..noise import draw_normals
from .common import DELTA_BUFFER, FAST, draw, flush, heavy_ball, moments

#: Environment variable: threads the kernels may use in one process (default 1: a sweep's
#: parallelism is its Dask workers, one per core; set it for in-process runs).
THREADS_ENV = "SGDSWEEP_THREADS"
#: Lanes whose normals are drawn and used together (a chunk's block stays in cache).
CHUNK_LANES = 32


class Lanes(NamedTuple):
    """The state of the working lanes of a chunk (L lanes, d parameters, one row each), advanced
    in place by the kernels. An array a lane does not need is empty (first dimension 0)."""

    ust: np.ndarray  #: (L, 4) uint64: PCG64 state and increment, (hi, lo) words (:mod:`sgdsweep.pcg64`)
    z: np.ndarray  #: (L, steps, n_z): the block's normals
    w: np.ndarray  #: (L, d) weights
    mom: np.ndarray  #: (L, d) heavy-ball momentum (empty: plain SGD)
    dt: np.ndarray  #: (L,) step of the update: λ for SGD, dt for the SDE
    mu: np.ndarray  #: (L,) momentum μ
    burn: np.ndarray  #: (L,) int64: first measured step
    bound: np.ndarray  #: (L,) bound on |δ|² (divergence)
    stride: np.ndarray  #: (L,) int64: steps between loss samples
    perm: np.ndarray  #: (L, P) int64: the sample permutation of the shuffled noise types
    pos: np.ndarray  #: (L,) int64: the next batch of an epoch
    count: np.ndarray  #: (L,) int64: measured steps n
    sum_d: np.ndarray  #: (L, d) Σδ
    sum_dd: np.ndarray  #: (L, d, d) Σδδᵀ, lower triangle (empty: not kept)
    sum_d2: np.ndarray  #: (L, d) Σδ² (where Σδδᵀ is not kept)
    sketch: np.ndarray  #: (L, d, k) Nyström sketch Σ δ (δᵀΩ)
    loss_count: np.ndarray  #: (L,) int64: loss samples
    sum_loss: np.ndarray  #: (L,) Σ L(w) over the loss samples
    sum_test_loss: np.ndarray  #: (L,) Σ L_test(w)
    loss_buf: np.ndarray  #: (L, K) ring buffer of the last K loss samples
    loss_lag: np.ndarray  #: (L, K) Σ L_t L_{t−m}
    loss_head: np.ndarray  #: (L, K) the first K loss samples
    diverged_step: np.ndarray  #: (L,) int64: step of divergence, −1 if none
    escape_step: np.ndarray  #: (L,) int64: step of escape, −1 if none
    reference: np.ndarray  #: (L, d) per-lane reference (models without a unique minimum)
    noise_buf: np.ndarray  #: (L, m, n_out, n_in) gradient-noise ring buffer of D(m)
    noise_lag: np.ndarray  #: (L, lags, n_in, n_in) Σ b_tᵀ b_{t−m}
    sum_gram: np.ndarray  #: (L, n_in, n_in) Σ δᵀδ
    stopped: np.ndarray  #: (L,) bool: diverged or escaped in this block


class Common(NamedTuple):
    """What every family's loop reads besides its own data."""

    added: int  #: 0: sampled noise (S drawn samples); else the added-noise code (:data:`.ADDED_CODE`)
    noise_amp: float  #: amplitude of added noise (times the SDE's noise scale)
    mode: int  #: sample selection of sampled noise (:data:`sgdsweep.noise.MODE`)
    n_batches: int  #: batches per epoch (mode 2)
    n_samples: int  #: P (0 without a data set)
    omega: np.ndarray  #: (d, k) the sketch's test matrix Ω (empty without a sketch)
    want_loss: bool  #: whether loss samples take the training loss


@numba.njit(nogil=True, fastmath=FAST, inline="always")
def block_loop(full, t0, n_steps, n_u, lanes, common, data,
               begin, gradient, deviation, escaped, observe, losses, finish):  # pragma: no cover
    """Advance every lane of ``lanes`` by ``n_steps`` steps from step ``t0`` (``n_u`` uniforms
    a step with sampled noise) with a family's hooks (module docstring). A lane that diverges
    gets ``diverged_step``, one that escapes ``escape_step``; both stop. ``full``: whether Σδδᵀ
    is kept (else Σδ² and the sketch), a constant of each compiled kernel."""
    sample_losses = lanes.loss_count.shape[0] > 0
    sampled = common.added == 0
    for lane in range(lanes.w.shape[0]):
        wl, g, delta, idx, weight, work = begin(lanes, data, common, lane, n_u)
        dbuf = np.empty((DELTA_BUFFER, delta.shape[0]))  # δ of the buffered measured steps
        nbuf = 0
        pl = idx if not sampled else (lanes.perm[lane] if common.mode != 1 else lanes.perm[0])
        st_hi, st_lo = lanes.ust[lane, 0], lanes.ust[lane, 1]
        inc_hi, inc_lo = lanes.ust[lane, 2], lanes.ust[lane, 3]
        for step in range(n_steps):
            t = t0 + step
            if sampled:
                st_hi, st_lo = draw(st_hi, st_lo, inc_hi, inc_lo, pl, lanes.pos, lane, common.mode,
                                    common.n_batches, common.n_samples, idx)
            gradient(lanes, data, common, lane, step, wl, idx, weight, g, work)
            heavy_ball(wl, g, lanes.mom, lane, lanes.mu[lane], lanes.dt[lane])
            d2 = deviation(lanes, data, lane, t, wl, delta)
            if not d2 <= lanes.bound[lane]:
                lanes.diverged_step[lane] = t
                lanes.stopped[lane] = True
                break
            out = escaped(data, wl)
            if t >= lanes.burn[lane]:
                nbuf = moments(full, lane, delta, lanes.count, lanes.sum_d, lanes.sum_dd, dbuf, nbuf,
                               lanes.sum_d2, lanes.sketch, common.omega)
                observe(lanes, data, common, lane, step, idx, weight, delta, work)
                if sample_losses and t % lanes.stride[lane] == 0:
                    losses(lanes, data, common, lane, wl, delta, work)
                    lanes.loss_count[lane] += 1
            if out:
                lanes.escape_step[lane] = t
                lanes.stopped[lane] = True
                break
        finish(lanes, lane, wl)
        lanes.ust[lane, 0] = st_hi  # the lane's generator continues from here
        lanes.ust[lane, 1] = st_lo
        if nbuf > 0:
            flush(dbuf, nbuf, lanes.sum_dd, lane)


@numba.njit(nogil=True, inline="always")
def no_escape(data, wl) -> bool:  # pragma: no cover - compiled
    """``escaped`` hook of the families without escape."""
    return False


@numba.njit(nogil=True, inline="always")
def no_observe(lanes, data, common, lane, step, idx, weight, delta, work) -> None:  # pragma: no cover
    """``observe`` hook of the families with nothing beyond the moments and losses."""


@numba.njit(nogil=True, inline="always")
def no_finish(lanes, lane, wl) -> None:  # pragma: no cover - compiled
    """``finish`` hook of the families that advance ``lanes.w`` in place."""


def threads() -> int:
    """Threads the kernels use: ``$SGDSWEEP_THREADS`` (default 1)."""
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads") from None
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads")
    return n


def advance(kernel: tuple[Any, Any], common: Common, data: tuple, t0: int, n_steps: int, lanes: Lanes,
            normals: list, n_u: int, n_z: int, n_threads: int) -> None:
    """Advance ``lanes`` by ``n_steps`` steps from step ``t0``, in place.

    ``kernel`` is the family's pair (with Σδδᵀ, with Σδ² and the sketch) of compiled kernels,
    ``common, data`` its arguments (:func:`sgdsweep.kernels.prepare`). Each step of a lane takes
    ``n_u`` uniforms (sample selection) and ``n_z`` normals (label or added noise), in the order
    the numpy engine draws them. The uniforms are drawn inside the kernel from ``lanes.ust``,
    which it leaves advanced; the normals from ``normals[i]``, lane i's generator, for up to
    :data:`CHUNK_LANES` lanes at a time (fewer where that gives each of ``n_threads`` threads a
    chunk), used while they are still in cache. With ``n_threads`` > 1 chunks run in parallel
    (NumPy's generators and the kernels release the GIL). ``lanes.stopped`` marks the lanes that
    diverged or escaped.
    """
    n_lanes = lanes.w.shape[0]
    run_kernel = kernel[0] if lanes.sum_dd.shape[0] > 0 else kernel[1]
    chunk = max(1, min(CHUNK_LANES, -(-n_lanes // max(1, n_threads))))

    def run(lo: int) -> None:
        hi = min(lo + chunk, n_lanes)
        z = np.empty((hi - lo, n_steps, n_z))
        if n_z:
            for i in range(lo, hi):
                draw_normals(normals[i], z[i - lo])
        part = Lanes._make(a[lo:hi] if a.shape[0] else a for a in lanes)._replace(z=z)
        run_kernel(t0, n_steps, n_u, part, common, data)

    starts = range(0, n_lanes, chunk)
    if n_threads <= 1 or len(starts) == 1:
        for lo in starts:
            run(lo)
    else:
        with ThreadPoolExecutor(min(n_threads, len(starts))) as pool:
            list(pool.map(run, starts))
