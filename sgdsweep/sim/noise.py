"""Gradient noise (docs/physics.md §7): which random numbers a step needs and how they become noise.

Every lane owns two random streams (see :func:`lane_streams`): *uniforms* choose samples
(``minibatch``, ``minibatch_replace``, ``epoch``, ``label``) and *normals* make added noise
(``gaussian``, ``gaussian_matched``, ``student_t``, and the fresh labels of ``label``). Streams
are drawn in blocks of steps; a lane's numbers do not depend on the block size or on the other
lanes of a call, so results are bitwise independent of batching and chunking.

Sample selection per step, with ``perm`` a per-lane permutation of the P samples:

- ``minibatch``: S distinct samples by a partial Fisher–Yates shuffle of ``perm`` restarted at
  position 0 every step (a fresh uniform S-subset each step; the (P−S)/(P−1) factor);
- ``minibatch_replace``: S independent uniform indices;
- ``epoch``: the same partial shuffle continued from where the last batch ended, so the
  batches of one epoch partition a random permutation (⌊P/S⌋ batches per epoch; the P mod S
  samples left over sit out that epoch).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from sgdsweep.core.noise_types import ADDED_NOISE, MODE, NOISE

#: Student-t degrees of freedom of ``student_t`` (its ``nu``, :mod:`sgdsweep.core.noise_types`):
#: a module constant, which compiled code reads as a compile-time constant.
STUDENT_NU: int = NOISE["student_t"].nu
#: Parameters up to which noise matched to a data set's per-sample gradients
#: (``gaussian_matched``, and ``student_t`` on a data set) is drawn from their d × d covariance
#: — d normals times its Cholesky factor — instead of as a weighted sum of all P per-sample
#: gradients with P normals: the same Gaussian, and for such d forming the covariance (P·d²
#: multiply-adds) costs less than P normals (the thesis landscape: d = 2, P = 600).
MATCHED_COV_MAX_DIM = 4


def lane_streams(seed_sequence: np.random.SeedSequence,
                 needed: tuple[bool, bool, bool] = (True, True, True)) -> tuple[np.random.Generator | None, ...]:
    """The (uniforms, normals, initialisation) generators of one lane: on the children 0, 1 and 2
    of ``seed_sequence``, the sequences its ``spawn(3)`` gives, made without spawning
    (:func:`child_streams`); None for a generator not ``needed``."""
    return child_streams(seed_sequence.entropy, seed_sequence.spawn_key, seed_sequence.pool_size, needed)


def child_streams(entropy: Any, spawn_key: tuple[int, ...] = (), pool_size: int | None = None,
                  needed: tuple[bool, bool, bool] = (True, True, True)) -> tuple[np.random.Generator | None, ...]:
    """:func:`lane_streams` of ``SeedSequence(entropy, spawn_key=spawn_key, pool_size=pool_size)``
    without making that sequence: child i is ``SeedSequence(entropy, spawn_key=(*spawn_key, i),
    pool_size=pool_size)``, what its ``spawn`` makes. A lane whose noise draws no uniforms or no
    normals, or whose start is not random, does not need that generator and skips making it
    (each costs a seed sequence and a generator, ~20 µs)."""
    pool = _POOL_SIZE if pool_size is None else pool_size
    return tuple(np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(*spawn_key, i), pool_size=pool))
                 if need else None for i, need in enumerate(needed))


_POOL_SIZE = np.random.SeedSequence(0).pool_size  # NumPy's default


#: Numbers from which :func:`draw_normals` runs the compiled ziggurat: handing a generator to
#: Numba costs ~12 µs a call, repaid from ~2,000 numbers (3.3 against ~10 ns each here).
COMPILED_NORMALS_MIN = 4096


def draw_normals(gen: np.random.Generator, out: np.ndarray) -> None:
    """Fill ``out`` (C-contiguous, any shape) with ``gen``'s next standard normals: the same
    numbers, in the same order, as ``gen.standard_normal(out=out)``. From
    :data:`COMPILED_NORMALS_MIN` numbers on they come from Numba's port of NumPy's ziggurat, 3×
    faster than NumPy's own here (``tests/sim/test_engine_statistics.py`` checks the identity).
    Releases the GIL."""
    if out.size < COMPILED_NORMALS_MIN:
        gen.standard_normal(out=out)
    else:
        _fill_normals(gen, out.reshape(-1))


@numba.njit(cache=True, nogil=True)
def _fill_normals(gen, out):  # pragma: no cover - compiled
    for i in range(out.shape[0]):
        out[i] = gen.standard_normal()


def uniforms_per_step(noise: str, batch_size: int) -> int:
    return batch_size if noise in MODE else 0


def normals_per_step(noise: str, problem, batch_size: int) -> int:
    """How many standard normals one step of one lane consumes."""
    if noise == "label":
        return batch_size * problem.n_outputs
    if noise == "gaussian":
        return problem.dim
    if noise == "gaussian_matched":
        return problem.dim if matched_by_covariance(problem) else problem.n_samples
    if noise == "student_t":  # its Gaussian (as in added_noise), then the ν normals of its χ²
        base = "gaussian" if problem.n_samples is None else "gaussian_matched"
        return normals_per_step(base, problem, batch_size) + STUDENT_NU
    return 0


def matched_by_covariance(problem) -> bool:
    """Whether matched noise on ``problem``'s data set is drawn from the d × d covariance of its
    per-sample gradients (:data:`MATCHED_COV_MAX_DIM`) rather than as a sum over its samples."""
    return problem.n_samples is not None and problem.dim <= MATCHED_COV_MAX_DIM


@numba.njit(cache=True, nogil=True)
def cholesky_psd(c, out):  # pragma: no cover - compiled
    """The lower-triangular L with L Lᵀ = c of a symmetric positive semi-definite c (d × d), into
    ``out``: Cholesky–Banachiewicz with each pivot clamped at 0 and a zero pivot giving a zero
    column, so that a singular covariance (fewer distinct gradients than parameters) factors too."""
    d = c.shape[0]
    for j in range(d):
        s = c[j, j]
        for k in range(j):
            s -= out[j, k] * out[j, k]
        ljj = np.sqrt(s) if s > 0.0 else 0.0
        out[j, j] = ljj
        for i in range(j + 1, d):
            s = c[i, j]
            for k in range(j):
                s -= out[i, k] * out[j, k]
            out[i, j] = s / ljj if ljj > 0.0 else 0.0
        for i in range(j):
            out[i, j] = 0.0


@numba.njit(cache=True, nogil=True)
def sample_indices(u, perm, pos, mode, n_batches):  # pragma: no cover - compiled
    """Sample indices (L, steps, S) from uniforms ``u`` of the same shape; updates ``perm``
    (L, P) and the epoch position ``pos`` (L,) in place."""
    n_lanes, n_steps, s = u.shape
    p = perm.shape[1]
    idx = np.empty((n_lanes, n_steps, s), dtype=np.int64)
    for lane in range(n_lanes):
        for step in range(n_steps):
            if mode == 1:
                for k in range(s):
                    j = int(u[lane, step, k] * p)
                    idx[lane, step, k] = j if j < p else p - 1
                continue
            base = pos[lane] * s if mode == 2 else 0
            for k in range(s):
                a = base + k
                j = a + int(u[lane, step, k] * (p - a))
                if j >= p:
                    j = p - 1
                tmp = perm[lane, a]
                perm[lane, a] = perm[lane, j]
                perm[lane, j] = tmp
                idx[lane, step, k] = perm[lane, a]
            if mode == 2:
                pos[lane] = (pos[lane] + 1) % n_batches
    return idx


def added_noise(noise: str, problem, w: np.ndarray, z: np.ndarray, batch_size: int,
                gaussian_var: float) -> np.ndarray:
    """Noise added to the full gradient for the ``ADDED_NOISE`` types, shape (L, d).

    ``z`` are the step's standard normals (L, k). ``gaussian``: N(0, C/S) with the model's
    additive C, or isotropic N(0, gaussian_var·I) for data models. ``gaussian_matched``: N(0, C(w))
    with the minibatch (without replacement) covariance of the per-sample gradients at w,
    drawn as √(f/P) Σ_μ z_μ (g_μ − ḡ), f = (P−S)/(S(P−1)). ``student_t``: the Gaussian of the
    same covariance times √((ν−2)/V), V ~ χ²_ν: multivariate Student-t, same covariance.
    Where :func:`matched_by_covariance`, the matched Gaussian is drawn as √(f/P) L z with
    L Lᵀ = Σ_μ (g_μ − ḡ)(g_μ − ḡ)ᵀ and d normals z: the same distribution.
    """
    if noise == "student_t":
        v = np.sum(z[:, -STUDENT_NU:] ** 2, axis=1)
        base = "gaussian" if problem.n_samples is None else "gaussian_matched"
        return added_noise(base, problem, w, z[:, :-STUDENT_NU], batch_size, gaussian_var) * np.sqrt(
            (STUDENT_NU - 2) / v)[:, None]
    if noise == "gaussian":
        if problem.noise_cov is not None:
            return (z @ problem.noise_chol.T) / np.sqrt(batch_size)
        return np.sqrt(gaussian_var) * z
    if noise == "gaussian_matched":
        p = problem.n_samples
        g = problem.sample_grads(w)
        g -= g.mean(axis=1, keepdims=True)
        f = (p - batch_size) / (batch_size * (p - 1))
        if matched_by_covariance(problem):  # L z, L Lᵀ = Σ_μ (g_μ − ḡ)(g_μ − ḡ)ᵀ
            cov = np.einsum("lpd,lpe->lde", g, g)
            chol = np.zeros_like(cov)
            for lane in range(cov.shape[0]):
                cholesky_psd(cov[lane], chol[lane])
            return np.sqrt(f / p) * np.einsum("lde,le->ld", chol, z)
        return np.sqrt(f / p) * np.einsum("lp,lpd->ld", z, g)
    raise ValueError(f"noise {noise!r} is not an added-noise type ({', '.join(ADDED_NOISE)})")
