"""What every family's block loop shares: the lane state, the call's settings, the factory of
the compiled kernels, and the driver that runs them on chunks of lanes.

A family's block loop (``block`` in :mod:`.affine`, :mod:`.two_layer`, :mod:`.additive`,
:mod:`.thesis`) advances each lane of a chunk by a block of steps, lane by lane (a lane's
weights, momentum and moments stay in cache for the block), and every step has the same shape:
draw the step's samples from the lane's PCG64 state (:func:`.common.draw`), take the family's
noisy gradient, make the heavy-ball update (:func:`.common.heavy_ball`, step dt = λ·dt_over_lr),
check divergence and escape, and, once the lane is past its burn-in, feed the streaming
moments (:func:`.common.moments`) and every ``stride`` steps a loss sample
(:func:`.common.feed_loss`). A lane that diverges gets ``diverged_step``, one that escapes
``escape_step``; both stop. The loop unpacks :class:`Lanes`, :class:`Common` and the family's
named tuple of problem arrays into plain arrays once per block: inside the step loop Numba then
touches arrays and scalars only (reading a tuple's array there would take an atomic
reference-count update per read).

:func:`make_kernels` compiles a family's loop twice: keeping the full second moment Σδδᵀ, and
keeping Σδ² and the sketch (in each the other's accumulators are dead code). Numba keys a
cached closure by its cell contents as well as by its own source file, and each kernel's cells
hold :func:`sgdsweep.sim.kernels.digest.source_digest` of every source compiled into it, so an
edit anywhere in that code compiles the kernels again.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, NamedTuple

import numba
import numpy as np

from sgdsweep.sim.kernels.common import FAST
from sgdsweep.sim.kernels.compiling import ensure_compiled
from sgdsweep.sim.kernels.digest import source_digest
from sgdsweep.sim.noise import draw_normals

#: Environment variable: threads the kernels may use in one process (default 1: a sweep's
#: parallelism is its Dask workers, one per core; set it for in-process runs).
THREADS_ENV = "SGDSWEEP_THREADS"
#: Lanes whose normals are drawn and used together (a chunk's block stays in cache).
CHUNK_LANES = 32
#: Each compiled kernel → its family's source file (:func:`make_kernels`), the key of its lock
#: (:mod:`.compiling`).
_SOURCES: dict[Any, str] = {}
#: The kernels this process has compiled or loaded from Numba's cache (:func:`advance`).
_CALLED: set[Any] = set()


class Lanes(NamedTuple):
    """The state of the working lanes (L lanes, d parameters, one row each), advanced in place by
    the kernels. An array a lane does not need is empty (first dimension 0)."""

    ust: np.ndarray  #: (L, 4) uint64: PCG64 state and increment, (hi, lo) words (:mod:`sgdsweep.sim.pcg64`)
    w: np.ndarray  #: (L, d) weights
    mom: np.ndarray  #: (L, d) heavy-ball momentum (empty: no momentum)
    lr: np.ndarray  #: (L,) learning rate λ
    mu: np.ndarray  #: (L,) momentum μ
    burn: np.ndarray  #: (L,) int64: first measured step
    bound: np.ndarray  #: (L,) bound on the family's deviation (divergence beyond it)
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
    """The settings of a call that every family's loop reads besides its own data."""

    added: int  #: 0: sampled noise (S drawn samples); else the added-noise code (:data:`.ADDED_CODE`)
    noise_amp: float  #: amplitude of added noise (times the SDE's noise scale)
    mode: int  #: sample selection of sampled noise (:data:`sgdsweep.sim.noise.MODE`)
    n_batches: int  #: batches per epoch (mode 2)
    n_samples: int  #: P (0 without a data set)
    omega: np.ndarray  #: (d, k) the sketch's test matrix Ω (empty without a sketch)
    want_loss: bool  #: whether loss samples take the training loss
    dt_over_lr: float  #: the integrator's step dt over λ (1 for SGD)


def make_kernels(family: ModuleType, error_model: str = "python", cache: bool = True) -> tuple[Any, Any]:
    """The two cached kernels of ``family`` (a module with the block loop ``block(full, t0,
    n_steps, n_u, z, lanes, common, data)``, compiled inline): with Σδδᵀ (``full``) and with Σδ²
    and the sketch, each called as ``kernel(t0, n_steps, n_u, z, lanes, common, data)``.
    ``error_model``: Numba's (``"numpy"``: no division-by-zero branch, which stops a loop from
    vectorising); ``cache``: whether Numba caches them."""
    digest = source_digest(family)
    jit = numba.njit(cache=cache, nogil=True, fastmath=FAST, error_model=error_model)

    def full(t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
        digest  # noqa: B018 - in the closure: the cache key changes with the sources
        family.block(True, t0, n_steps, n_u, z, lanes, common, data)

    def diagonal(t0, n_steps, n_u, z, lanes, common, data):  # pragma: no cover - compiled
        digest  # noqa: B018 - in the closure: the cache key changes with the sources
        family.block(False, t0, n_steps, n_u, z, lanes, common, data)

    short = family.__name__.rsplit(".", 1)[-1]
    for kernel in (full, diagonal):  # Numba names a cache index after the function: one per family
        kernel.__name__ = f"{short}_{kernel.__name__}"
        kernel.__qualname__ = f"make_kernels.<locals>.{kernel.__name__}"
    pair = jit(full), jit(diagonal)
    for kernel in pair:
        _SOURCES[kernel] = family.__file__
    return pair


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


def advance(kernels: tuple[Any, Any], common: Common, data: tuple, t0: int, n_steps: int, lanes: Lanes,
            normals: list, n_u: int, n_z: int, n_threads: int) -> None:
    """Advance ``lanes`` by ``n_steps`` steps from step ``t0``, in place.

    ``kernels`` is the family's pair (with Σδδᵀ, with Σδ² and the sketch), ``common, data`` its
    arguments (:func:`sgdsweep.sim.kernels.prepare`). Each step of a lane takes ``n_u`` uniforms
    (sample selection) and ``n_z`` normals (label or added noise), in the order the numpy engine
    draws them. The uniforms are drawn inside the kernel from ``lanes.ust``, which it leaves
    advanced; the normals from ``normals[i]``, lane i's generator, for up to :data:`CHUNK_LANES`
    lanes at a time (fewer where that gives each of ``n_threads`` threads a chunk), used while
    they are still in cache. With ``n_threads`` > 1 chunks run in parallel (NumPy's generators
    and the kernels release the GIL). ``lanes.stopped`` marks the lanes that diverged or escaped.
    A process's first call of a kernel compiles it or loads it from Numba's cache under its lock
    (:func:`.compiling.ensure_compiled`), then runs the first chunk alone.
    """
    n_lanes = lanes.w.shape[0]
    kernel = kernels[0] if lanes.sum_dd.shape[0] > 0 else kernels[1]
    chunk = max(1, min(CHUNK_LANES, -(-n_lanes // max(1, n_threads))))

    def args(lo: int) -> tuple:
        hi = min(lo + chunk, n_lanes)
        z = np.empty((hi - lo, n_steps, n_z))
        if n_z:
            for i in range(lo, hi):
                draw_normals(normals[i], z[i - lo])
        return t0, n_steps, n_u, z, Lanes._make(a[lo:hi] if a.shape[0] else a for a in lanes), common, data

    def run(lo: int) -> None:
        kernel(*args(lo))

    starts = range(0, n_lanes, chunk)
    if n_lanes and kernel not in _CALLED:
        first = args(0)
        if kernel in _SOURCES:  # compiled or loaded once per machine at a time (.compiling)
            ensure_compiled(kernel, _SOURCES[kernel], first)
        kernel(*first)
        _CALLED.add(kernel)
        starts = starts[1:]
    if n_threads <= 1 or len(starts) <= 1:
        for lo in starts:
            run(lo)
    else:
        with ThreadPoolExecutor(min(n_threads, len(starts))) as pool:
            list(pool.map(run, starts))
