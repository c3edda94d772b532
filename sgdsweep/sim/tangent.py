"""The top Lyapunov exponent of SGD linearised about the minimum, per replica: what the
stability-edge search decides from (``search:``, :mod:`sgdsweep.sweep.search`, docs/precision.md).

A replica's step is a random map ``w_{t+1} = U_t(w_t)`` (with momentum, of the state (w, m)),
random through the step's batch and drawn noise. Its linearisation about the minimiser w*,

    z_{t+1} = J_t z_t,   J_t = ∂U_t/∂(w, m) at (w*, 0),

drops every additive part of the noise. For a loss that is exactly quadratic (the single linear
layer of ``linear``, ``digits`` and ``matrix``; the ``quadratic`` model) it is the dynamics of the
deviation δ = w − w* itself, exact at every size of δ: the random products T_t of
:mod:`sgdsweep.theory.edge` (docs/physics.md §9), and the replica's own dynamics less its additive noise.
For a loss that is not quadratic (the ``landscape`` models) it is the linear stability of the
minimum. The top Lyapunov exponent

    γ = lim (1/T) log ‖J_{T−1} ⋯ J_0 z_0‖   (per SGD step, almost surely)

decides what a single replica does: γ < 0, the replica has a stationary law (heavy-tailed near
γ = 0: it may cross any fixed bound and come back); γ > 0, ‖δ‖ grows as e^{γt}. The almost-sure
edge is where γ crosses 0. By Jensen's inequality γ ≤ ½ log ρ (ρ the radius of the second-moment
map), so it lies at or above the mean-square edge of :mod:`sgdsweep.theory.edge`; the two coincide
when J_t is not random (additive noise: ``gaussian``, ``student_t`` on a model's own C, ``label``'s
fresh labels only add).

Estimator (the standard renormalisation, or one-vector QR, method): per replica r a tangent
state z = (v, λm) (just v without momentum) starts as a random unit vector, is advanced by J_t
each step and renormalised to unit length, and

    γ_r = Σ_{b ≤ t < T} log ‖J_t z_t‖ / (T − b)

over the steps after the burn-in b (:func:`tangent_burn_in`: the point's, but at least a tenth of
the run, so that z has turned towards the growing direction). J_t z is computed as the central
difference of the step's gradient at w* ± εz (exact for an affine gradient, ε = 1e-4 (1 + ‖w*‖)),
with the step's own random numbers:

- sampled batches (``minibatch``, ``minibatch_replace``, ``epoch``, ``label``): drawn from replica
  r's uniform stream exactly as :mod:`sgdsweep.sim.engine` draws them, so J_t is the linearisation
  of replica r's own steps (its run may stop at divergence; its tangent runs every step);
- matched noise (``gaussian_matched``, ``student_t`` on a data set): the sum form
  √(f/P) Σ_μ z_μ (g_μ − ḡ) of :func:`sgdsweep.sim.noise.added_noise`, which is affine in w, with
  P normals a step from replica r's normal stream (the engine's own numbers on more than
  :data:`sgdsweep.sim.noise.MATCHED_COV_MAX_DIM` parameters; on fewer the engine draws the same
  law from the covariance's Cholesky factor, with other numbers); ``student_t`` scales it by
  √((ν − 2)/V) from the step's next ν normals, as the engine does;
- additive noise does not enter J_t.

The initial direction comes from a fourth stream of the replica's seed sequence (the engine uses
three). The SDE integrator (``method: sde``) is linearised the same way, step dt = λ·dt_over_lr;
γ is then per SGD-equivalent step (``1/dt_over_lr`` integrator steps).

Units: γ in 1/step (per SGD step), dimensionless per step; λ as ``lr``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sgdsweep.core.identity import LYAPUNOV, hash_words
from sgdsweep.core.noise_types import MATCHED_ADDED_NOISE, NOISE
from sgdsweep.models.base import Problem
from sgdsweep.sim import noise as noisemod
from sgdsweep.sim.engine import BLOCK_RANDOM_NUMBERS, BLOCK_STEPS, Dynamics

#: Relative size of the central difference: ε = FD_STEP · (1 + ‖w*‖). Exact for an affine
#: gradient (rounding ~1e-12 relative); O(ε²) for a smooth one.
FD_STEP = 1e-4
#: Shortest tangent burn-in, as a fraction of the run.
MIN_BURN_FRACTION = 0.1
#: The parameter that asks a point's simulation for its replicas' exponents (set on every point
#: of a sweep with ``search:``).
PARAM = LYAPUNOV
#: Noise types whose random numbers enter J_t through the normal stream (matched added noise).
MATCHED: tuple[str, ...] = MATCHED_ADDED_NOISE


def supports(problem: Problem) -> str | None:
    """Why the exponent is not defined for ``problem`` (None when it is): it needs a unique
    minimiser to linearise about."""
    if problem.w_min is None:
        return (f"model.kind {problem.kind} has no unique minimiser (its minima form a manifold) to linearise "
                "SGD about")
    return None


def tangent_burn_in(burn_in: int, steps: int) -> int:
    """Steps before the tangent's growth is measured: the point's ``burn_in``, but at least
    :data:`MIN_BURN_FRACTION` of ``steps`` (both in the same units, integrator steps)."""
    return max(int(burn_in), int(MIN_BURN_FRACTION * steps))


def tangent_streams(seed: int, stream_key: str, replicas: int) -> list[tuple[np.random.Generator, ...]]:
    """Per replica 0 … ``replicas`` − 1 of a point its (uniforms, normals, tangent direction)
    generators: the first two are the replica's own (:func:`sgdsweep.sim.replicas.replica_streams`,
    :func:`sgdsweep.sim.noise.lane_streams`), the third a fourth child of its seed sequence."""
    words = hash_words(stream_key)
    out = []
    for r in range(replicas):
        kids = np.random.SeedSequence([seed, *words, r]).spawn(4)
        out.append((np.random.default_rng(kids[0]), np.random.default_rng(kids[1]), np.random.default_rng(kids[3])))
    return out


def _matched_normals(noise: str, problem: Problem) -> int:
    """Normals a step of the tangent draws (0 when J_t does not depend on them)."""
    if noise not in MATCHED or problem.n_samples is None:
        return 0
    return problem.n_samples + (NOISE[noise].nu or 0)


def lyapunov_exponents(problem: Problem, *, noise: str, batch_size: int, steps: int, lr: np.ndarray,
                       momentum: np.ndarray, burn_in: np.ndarray,
                       streams: Sequence[tuple[np.random.Generator, ...]],
                       dynamics: Dynamics | None = None) -> np.ndarray:
    """Each lane's estimate γ_r of the top Lyapunov exponent (module docstring).

    Args:
        problem: the shared problem; must have a unique minimiser (:func:`supports`).
        noise: noise type; batch_size: S.
        steps: integrator steps (SGD steps, or SDE steps of size dt).
        lr, momentum: per-lane λ and μ, shapes (L,).
        burn_in: per-lane steps (integrator steps) before the growth is measured; each must be
            below ``steps``.
        streams: per lane (uniforms, normals, tangent direction) generators
            (:func:`tangent_streams`); advanced in place.
        dynamics: sgd (default) or sde.

    Returns:
        γ_r per lane, shape (L,), in 1/(SGD step); −inf where the tangent vanished exactly (a
        singular step annihilated it).

    Raises:
        ValueError: a problem without a unique minimiser, or a burn-in not below ``steps``.
    """
    dynamics = dynamics or Dynamics()
    why = supports(problem)
    if why is not None:
        raise ValueError(f"no Lyapunov exponent: {why}")
    n = len(streams)
    burn = np.asarray(burn_in, dtype=np.int64)
    if n and int(burn.max()) >= steps:
        raise ValueError(f"burn-in {int(burn.max())} is not below steps = {steps}: nothing to measure")
    d = problem.dim
    lr = np.asarray(lr, dtype=np.float64)
    mu = np.asarray(momentum, dtype=np.float64)
    dt = (lr * (dynamics.dt_over_lr if dynamics.kind == "sde" else 1.0))[:, None]
    noise_scale = float(np.sqrt(1.0 / dynamics.dt_over_lr)) if dynamics.kind == "sde" else 1.0
    use_mom = bool(np.any(mu != 0.0))
    w_star = np.asarray(problem.w_min, dtype=np.float64)
    eps = FD_STEP * (1.0 + float(np.linalg.norm(w_star)))

    v = np.empty((n, d))
    for i, s in enumerate(streams):
        s[2].standard_normal(out=v[i])
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.finfo(float).tiny)
    m = np.zeros_like(v) if use_mom else None
    log_sum = np.zeros(n)

    sampled = noise in noisemod.MODE
    n_u = noisemod.uniforms_per_step(noise, batch_size)
    n_z = _matched_normals(noise, problem)
    if sampled:
        perm = np.tile(np.arange(problem.n_samples, dtype=np.int64), (n, 1))
        pos = np.zeros(n, np.int64)
        n_batches = max(1, problem.n_samples // batch_size)
    p = problem.n_samples
    f_matched = (p - batch_size) / (batch_size * (p - 1)) if n_z and p > 1 else 0.0
    per_step = max(1, n_u + n_z)
    t0 = 0
    while t0 < steps and n:
        nb = int(max(1, min(steps - t0, BLOCK_STEPS, BLOCK_RANDOM_NUMBERS // (n * per_step))))
        idx_block = z_block = None
        if n_u:
            u = np.empty((n, nb, n_u))
            for i, s in enumerate(streams):
                s[0].random(out=u[i])
            idx_block = noisemod.sample_indices(u, perm, pos, noisemod.MODE[noise], n_batches)
        if n_z:
            z_block = np.empty((n, nb, n_z))
            for i, s in enumerate(streams):
                noisemod.draw_normals(s[1], z_block[i])
        for k in range(nb):
            w2 = np.concatenate([w_star + eps * v, w_star - eps * v])
            if sampled:
                idx = idx_block[:, k]
                g2 = problem.grad(w2, np.concatenate([idx, idx]))
            else:
                g2 = problem.grad(w2)
            gdiff = (g2[:n] - g2[n:]) / (2.0 * eps)
            if n_z:
                gdiff += noise_scale * _matched_difference(noise, problem, w2, z_block[:, k], f_matched, eps)
            if m is not None:
                m *= mu[:, None]
                m += gdiff
                v -= dt * m
                norm = np.sqrt(np.einsum("ld,ld->l", v, v) + np.einsum("ld,ld->l", dt * m, dt * m))
            else:
                v -= dt * gdiff
                norm = np.sqrt(np.einsum("ld,ld->l", v, v))
            with np.errstate(divide="ignore"):
                log_norm = np.log(norm)
            measuring = t0 + k >= burn
            log_sum[measuring] += log_norm[measuring]
            scale = 1.0 / np.where(norm > 0.0, norm, 1.0)
            v *= scale[:, None]
            if m is not None:
                m *= scale[:, None]
        t0 += nb
    measured = (steps - burn).astype(np.float64) / dynamics.substeps
    return log_sum / measured if n else np.zeros(0)


def _matched_difference(noise: str, problem: Problem, w2: np.ndarray, z: np.ndarray, f: float,
                        eps: float) -> np.ndarray:
    """The matched noise's part of J_t z: the central difference of √(f/P) Σ_μ z_μ (g_μ − ḡ)
    between the first and second half of ``w2``, times √((ν − 2)/V) for heavy-tailed noise (``student_t``)."""
    n = z.shape[0]
    p = problem.n_samples
    g = problem.sample_grads(w2)
    g = g[:n] - g[n:]
    g -= g.mean(axis=1, keepdims=True)
    out = np.sqrt(f / p) * np.einsum("lp,lpd->ld", z[:, :p], g) / (2.0 * eps)
    nu = NOISE[noise].nu
    if nu is not None:
        chi2 = np.sum(z[:, p:] ** 2, axis=1)
        out *= np.sqrt((nu - 2) / chi2)[:, None]
    return out


def exponent_summary(gammas: np.ndarray) -> tuple[float | None, float | None]:
    """Mean and standard error (spread of the replicas' γ_r over √R) of per-replica exponents;
    None where undefined (no replica, or SE with one replica). A replica whose tangent vanished
    (γ_r = −inf) makes the mean −inf (reported as None)."""
    g = np.asarray(gammas, dtype=np.float64)
    if g.size == 0:
        return None, None
    if not np.all(np.isfinite(g)):
        return None, None
    mean = float(g.mean())
    se = float(g.std(ddof=1) / np.sqrt(g.size)) if g.size > 1 else None
    return mean, se
