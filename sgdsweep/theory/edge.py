"""The exact stability edge of SGD: where the second moment stops having a stationary value.

docs/physics.md §9. For a loss that is exactly quadratic around its minimiser ŵ, heavy-ball SGD with
momentum μ and learning rate λ moves the state z_t = (δ_t, δ_{t−1}), δ = w − ŵ, by an affine
random map ``z_{t+1} = T_t z_t + λ e_t`` with, for the step's minibatch moment A_t = X_BᵀX_B/S,

    T_t = [[(1 + μ) I − λ A_t, −μ I], [I, 0]]      (μ = 0: the state is δ_t and T_t = I − λ A_t)

Its second moment Z = E[z zᵀ] (2N×2N, or N×N without momentum) obeys ``Z' = 𝓛(Z) + const`` with
the linear *second-moment map*

    𝓛(Z) = B̄ Z B̄ᵀ + λ² [[E[(A − H) Z₁₁ (A − H)], 0], [0, 0]],   B̄ = E[T_t]

(the cross terms vanish because E[A − H] = 0 and the batch is independent of z_t). 𝓛 maps
positive semidefinite matrices to positive semidefinite matrices, so its spectral radius ρ is
one of its eigenvalues, with a positive semidefinite eigenvector, and ρ ≥ ρ(B̄)² (the mean
dynamics). The second moment converges to a stationary value from every start iff ρ < 1, and
grows without bound iff ρ ≥ 1 (the noise excites every direction: C or the label noise has full
rank on the data's span). :func:`sgdsweep.theory.linear.stationary_second_moment` solves
``Z = 𝓛(Z) + const``; this module gives ρ and the edge, the parameter value where ρ = 1.

Noise types (:mod:`sgdsweep.core.noise_types`):

- sampled batches, with replacement (``minibatch_replace``) or without (``minibatch``, and
  ``label``, whose fresh label noise is additive and leaves 𝓛 unchanged): the multiplicative
  term uses the scheme's E[(A − H) M (A − H)] (theory.linear ``_fluctuation_matrix``);
- ``gaussian_matched`` and ``student_t``: noise with the minibatch covariance at the current
  weights, whose mean over the state is the same multiplicative term: the map of ``minibatch``;
- ``gaussian``: isotropic noise of fixed size, additive: 𝓛(Z) = B̄ Z B̄ᵀ, ρ = ρ(B̄)²;
- additive noise never changes 𝓛 (it only enters the constant term): for the quadratic model
  (docs/physics.md §1) the edge is that of the mean dynamics, per curvature k the 2×2 companion
  ``[[1 + μ − λk, −μ], [1, 0]]``, which reproduces Liu et al.'s Cor. 1 condition
  ``0 < λk < 2(1 + μ)`` (:func:`liu_edge`).

``epoch`` noise (batches correlated within an epoch) has no such one-step map and no edge here.

This is the edge of the second moment (the mean-square edge). A single trajectory grows at the
top Lyapunov exponent γ of the random products of T_t, and γ <= ½ log ρ (Jensen), so the
almost-sure edge, where γ crosses 0, lies at or above this one; between the two the stationary
law exists but has tails too heavy for a second moment, and near the almost-sure edge so heavy
that a replica crosses any fixed divergence bound and comes back. The two meet when T_t is not
random (S = P without replacement, or additive ``gaussian`` noise). This module does not compute
the almost-sure edge where they differ; the edge search measures it from the replicas'
exponents (:mod:`sgdsweep.sim.tangent`, :mod:`sgdsweep.sweep.search`).

Units: λ in the units of ``lr`` (w²/loss; for linear regression with σ_x² = 1/N, λ‖x‖² is
dimensionless), μ dimensionless in [0, 1); ρ is dimensionless (per step).

The edge along an axis (:func:`find_edge`): for ``lr`` the largest λ > 0 below which the radius
is < 1; for ``momentum`` the largest μ in [0, 1) below which it is < 1, the other parameters
fixed. Both are located by scanning the axis from its unstable end for the first stable value,
then refined by :func:`scipy.optimize.brentq` on ρ − 1 to a relative tolerance of
:data:`RTOL`. A stable island narrower than the scan's step would be missed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse.linalg as spla

from sgdsweep.theory.linear import LinearData, _fluctuation_matrix, _fluctuation_op, _scheme, _single_output

#: The axes an edge can be searched along.
AXES = ("lr", "momentum")
#: Relative tolerance of the edge (brentq's ``rtol``; its absolute ``xtol`` is RTOL × the edge's scale).
RTOL = 1e-12
#: Largest number of unknowns of the symmetric second moment (N(N+1)/2, or N(2N+1) with
#: momentum) whose map's eigenvalues are computed densely; beyond it ARPACK finds the radius
#: matrix-free.
DENSE_MAX_UNKNOWNS = 1500
#: Momentum values scanned for the first stable one, from the top: ``1 − 10^(−k/4)`` down to 0.9,
#: then steps of 0.025 to 0. The scan's top, 1 − 1e-8, is where "stable up to 1" is decided.
MOMENTUM_SCAN = tuple(sorted({*(1.0 - 10.0 ** (-k / 4.0) for k in range(4, 33)),
                              *(round(0.025 * j, 3) for j in range(37))}, reverse=True))
#: Ratio between successive learning rates scanned downward from the mean-dynamics bound.
LR_SCAN_RATIO = 2.0 ** -0.25
#: How far below the mean-dynamics bound the learning-rate scan gives up (relative).
LR_SCAN_FLOOR = 1e-12

FORMULA = {
    "linear": ("lr or momentum where the spectral radius of the exact second-moment map of SGD on "
               "finite-data linear regression (both sampling schemes, heavy-ball momentum) reaches 1 "
               "(sgdsweep.theory.edge, docs/physics.md §9)"),
    "quadratic": ("lr or momentum where the spectral radius of the quadratic's second-moment map (the "
                  "mean dynamics' 2x2 companion per curvature, squared) reaches 1; equals Liu et al. Cor. 1, "
                  "0 < lr k < 2(1 + mu) (sgdsweep.theory.edge, docs/physics.md §1)"),
}


# ---- the second-moment map -----------------------------------------------------------------


def _mean_matrix(h: np.ndarray, lr: float, momentum: float) -> np.ndarray:
    """B̄ = E[T]: I − λH without momentum, the 2N×2N companion with it."""
    n = h.shape[0]
    a = (1.0 + momentum) * np.eye(n) - lr * h
    if momentum == 0.0:
        return a
    return np.block([[a, -momentum * np.eye(n)], [np.eye(n), np.zeros((n, n))]])


def _symmetric_restriction(full: np.ndarray, d: int) -> np.ndarray:
    """The d²×d² map ``full`` (row-major vec) restricted to symmetric d×d matrices, in the
    coordinates Z_ce, c ≥ e (the map preserves symmetry, so the spectrum on this subspace is
    the part of the full spectrum that a second moment can excite, ρ included)."""
    i, j = np.tril_indices(d)
    rows = i * d + j
    out = full[np.ix_(rows, rows)]
    out += full[np.ix_(rows, j * d + i)] * (i != j)
    return out


def map_radius(h: np.ndarray, fl: np.ndarray | Callable[[np.ndarray], np.ndarray] | None, lr: float,
               momentum: float = 0.0) -> float:
    """Spectral radius of 𝓛(Z) = B̄ Z B̄ᵀ + λ² [[FL(Z₁₁), 0], [0, 0]] (module docstring).

    Args:
        h: the Hessian H (N × N, symmetric).
        fl: the multiplicative-noise term M ↦ E[(A − H) M (A − H)]: an N²×N² matrix on row-major
            vec(M), a function of M (used matrix-free), or None (additive noise only).
        lr: λ >= 0.
        momentum: μ in [0, 1).

    Returns:
        ρ(𝓛) >= 0, dimensionless.
    """
    n = h.shape[0]
    bbar = _mean_matrix(h, lr, momentum)
    d = bbar.shape[0]
    if fl is None:
        return float(np.max(np.abs(np.linalg.eigvals(bbar)))) ** 2
    if d * (d + 1) // 2 <= DENSE_MAX_UNKNOWNS:
        fl_mat = fl if isinstance(fl, np.ndarray) else _dense(fl, n)
        full = np.kron(bbar, bbar)
        full.reshape(d, d, d, d)[:n, :n, :n, :n] += lr * lr * fl_mat.reshape(n, n, n, n)
        return float(np.max(np.abs(np.linalg.eigvals(_symmetric_restriction(full, d)))))
    return _radius_matrix_free(bbar, fl, n, lr)


def _dense(fl: Callable[[np.ndarray], np.ndarray], n: int) -> np.ndarray:
    cols = [fl(np.eye(n * n)[k].reshape(n, n)).ravel() for k in range(n * n)]
    return np.array(cols).T


def _radius_matrix_free(bbar: np.ndarray, fl: np.ndarray | Callable[[np.ndarray], np.ndarray], n: int,
                        lr: float) -> float:
    """ρ(𝓛) by ARPACK on the full d² space: ρ is the eigenvalue of largest real part (every
    eigenvalue has modulus <= ρ, and ρ is one of them)."""
    d = bbar.shape[0]
    apply = fl if callable(fl) else (lambda m: (fl @ m.ravel()).reshape(n, n))

    def matvec(v: np.ndarray) -> np.ndarray:
        z = v.reshape(d, d)
        out = bbar @ z @ bbar.T
        out[:n, :n] += lr * lr * apply(z[:n, :n])
        return out.ravel()

    op = spla.LinearOperator((d * d, d * d), matvec=matvec, dtype=float)
    vals = spla.eigs(op, k=min(6, d * d - 2), which="LR", tol=1e-14, maxiter=20000, return_eigenvectors=False)
    return float(np.max(np.abs(vals)))


def second_moment_radius(data: LinearData, lr: float, batch_size: int, momentum: float = 0.0,
                         noise: str = "minibatch") -> float:
    """ρ of the exact second-moment map of SGD on finite-data linear regression (one output).

    Args:
        data: the data set (:class:`~sgdsweep.theory.linear.LinearData`, one output).
        lr: learning rate λ > 0.
        batch_size: minibatch size S (1 <= S <= P).
        momentum: heavy-ball μ in [0, 1).
        noise: one of :data:`sgdsweep.theory.linear.NOISE_TYPES`.

    Returns:
        The radius; the stationary second moment exists iff it is < 1.
    """
    _single_output(data)
    if _scheme(noise) == "none":
        return map_radius(data.sxx, None, lr, momentum)
    n = data.n_inputs
    d = n if momentum == 0.0 else 2 * n
    if d * (d + 1) // 2 <= DENSE_MAX_UNKNOWNS:
        return map_radius(data.sxx, _fluctuation_matrix(data, batch_size, noise), lr, momentum)
    return map_radius(data.sxx, _fluctuation_op(data, batch_size, noise), lr, momentum)


def quadratic_radius(curvatures: np.ndarray | list[float], lr: float, momentum: float = 0.0) -> float:
    """ρ of the second-moment map of SGD on L = ½ wᵀKw with additive noise: the mean dynamics'
    radius squared, per curvature k the largest root modulus of ``z² − (1 + μ − λk) z + μ``
    (the 2×2 companion [[1 + μ − λk, −μ], [1, 0]]), maximised over k."""
    worst = 0.0
    for k in np.asarray(curvatures, dtype=float).ravel():
        roots = np.roots([1.0, -(1.0 + momentum - lr * k), momentum])
        worst = max(worst, float(np.max(np.abs(roots))))
    return worst * worst


def liu_edge(curvatures: np.ndarray | list[float], axis: str, lr: float = 0.0, momentum: float = 0.0) -> float:
    """Liu, Ziyin & Ueda (2021) Cor. 1 in closed form: stable iff 0 < λk < 2(1 + μ) for every k.

    ``axis="lr"``: λ_edge = 2(1 + μ)/k_max (``momentum`` fixed). ``axis="momentum"``:
    μ_edge = λ k_max/2 − 1 (``lr`` fixed), the momentum *below* which the quadratic diverges
    (it is stable for every μ in (μ_edge, 1); a value < 0 means stable at every μ >= 0, one
    >= 1 stable at none). Curvatures must be positive.
    """
    k_max = float(np.max(np.asarray(curvatures, dtype=float)))
    if k_max <= 0:
        raise ValueError(f"curvatures {curvatures!r}: the edge needs a positive curvature")
    if axis == "lr":
        return 2.0 * (1.0 + momentum) / k_max
    if axis == "momentum":
        return lr * k_max / 2.0 - 1.0
    raise ValueError(f"axis {axis!r}: allowed are {', '.join(AXES)}")


# ---- the edge along an axis ----------------------------------------------------------------


def _refine(radius: Callable[[float], float], stable: float, unstable: float) -> float:
    """brentq on ρ − 1 between a stable and an unstable value."""
    scale = max(abs(stable), abs(unstable))
    return float(scipy.optimize.brentq(lambda v: radius(v) - 1.0, stable, unstable,
                                       xtol=RTOL * scale, rtol=RTOL, maxiter=500))


def find_edge(radius: Callable[[float], float], axis: str, upper: float | None = None) -> dict[str, Any]:
    """The edge of ``radius(value) < 1`` along ``axis`` (module docstring).

    Args:
        radius: ρ as a function of the axis' value, the other parameters fixed.
        axis: ``lr`` or ``momentum``.
        upper: for ``lr``, a learning rate at which ρ >= 1 is known (the mean-dynamics bound
            2(1 + μ)/h_max); the scan starts just above it.

    Returns:
        ``{"value": edge, "stable": side}``. ``lr``: ``value`` the largest stable λ (ρ < 1 just
        below it, >= 1 at it), ``stable`` ``"below"``. ``momentum``: ``value`` the largest μ in
        [0, 1) with ρ < 1 just below it, ``math.inf`` when stable up to 1 (``stable``
        ``"below"``); when stable only on (μ_lo, ...) the dict also has ``lower`` = μ_lo, the
        momentum below which it diverges (Liu's μ_edge for the quadratic); when no scanned μ
        is stable, ``value`` is ``math.nan`` and ``stable`` ``"nowhere"``.
    """
    if axis == "lr":
        if upper is None or not upper > 0:
            raise ValueError(f"upper={upper!r}: the lr scan needs a positive unstable learning rate")
        hi = upper * (1.0 + 1e-9)
        if radius(hi) < 1.0:
            raise ValueError(f"radius {radius(hi)} < 1 at lr={hi}, which was given as unstable")
        lo = hi * LR_SCAN_RATIO
        while radius(lo) >= 1.0:
            hi, lo = lo, lo * LR_SCAN_RATIO
            if lo < upper * LR_SCAN_FLOOR:
                raise ValueError(f"no stable learning rate above {lo:g}: the problem has no stable minimum")
        return {"value": _refine(radius, lo, hi), "stable": "below"}
    if axis != "momentum":
        raise ValueError(f"axis {axis!r}: allowed are {', '.join(AXES)}")
    # the first stable value from the top of the (decreasing) scan, then from its bottom
    top = next((k for k, mu in enumerate(MOMENTUM_SCAN) if radius(mu) < 1.0), None)
    if top is None:
        return {"value": math.nan, "stable": "nowhere"}
    bottom = next(k for k in range(len(MOMENTUM_SCAN) - 1, top - 1, -1) if radius(MOMENTUM_SCAN[k]) < 1.0)
    out: dict[str, Any] = {"stable": "below"}
    out["value"] = math.inf if top == 0 else _refine(radius, MOMENTUM_SCAN[top], MOMENTUM_SCAN[top - 1])
    if bottom < len(MOMENTUM_SCAN) - 1:
        out["lower"] = _refine(radius, MOMENTUM_SCAN[bottom], MOMENTUM_SCAN[bottom + 1])
    return out


def linear_edge(data: LinearData, axis: str, lr: float, batch_size: int, momentum: float = 0.0,
                noise: str = "minibatch") -> dict[str, Any]:
    """The edge of finite-data linear regression along ``axis`` (the other values fixed), by
    :func:`find_edge` on :func:`second_moment_radius`; ``method`` names the formula."""
    if axis == "lr":
        h_max = float(np.max(np.linalg.eigvalsh(data.sxx)))
        out = find_edge(lambda v: second_moment_radius(data, v, batch_size, momentum, noise), axis,
                        upper=2.0 * (1.0 + momentum) / h_max)
    else:
        out = find_edge(lambda v: second_moment_radius(data, lr, batch_size, v, noise), axis)
    return {**out, "method": FORMULA["linear"]}


def quadratic_edge(curvatures: np.ndarray | list[float], axis: str, lr: float,
                   momentum: float = 0.0) -> dict[str, Any]:
    """The edge of the quadratic model along ``axis`` by :func:`find_edge` on
    :func:`quadratic_radius` (equal to :func:`liu_edge` where that lies in range)."""
    if axis == "lr":
        k_max = float(np.max(np.asarray(curvatures, dtype=float)))
        out = find_edge(lambda v: quadratic_radius(curvatures, v, momentum), axis, upper=2.0 * (1.0 + momentum) / k_max)
    else:
        out = find_edge(lambda v: quadratic_radius(curvatures, lr, v), axis)
    return {**out, "method": FORMULA["quadratic"]}
