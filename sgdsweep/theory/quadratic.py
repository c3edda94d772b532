"""Exact discrete-time theory of SGD on a quadratic loss with additive noise (docs/physics.md §1).

Model (Liu, Ziyin, Ueda 2021): loss ``L(w) = ½ wᵀKw`` with a symmetric d×d Hessian ``K`` and
heavy-ball SGD with additive gradient noise ξ_t, independent across steps, ``E ξ = 0``,
``Cov ξ = C`` (symmetric positive semidefinite, need not commute with K)::

    m_{t+1} = μ m_t + (K w_t + ξ_t)
    w_{t+1} = w_t − λ m_{t+1}

with learning rate ``λ = lr > 0`` and momentum ``μ = momentum`` (μ = 0 is plain SGD). Units: w
in the units of the parameters, K in loss/w², C in (loss/w)² (the units of a gradient, squared),
λ in w²/loss; covariances Σ in w², losses in the units of L. "Time" is the step count.

Eliminating m (λ m_t = w_{t−1} − w_t) gives the second-order recursion::

    w_{t+1} = ((1 + μ) I − λK) w_t − μ w_{t−1} − λ ξ_t

which is linear in the state z_t = (w_t, w_{t−1}); its stationary covariance solves a discrete
Lyapunov equation. Per eigenvalue k of K the characteristic polynomial is
``z² − (1 + μ − λk) z + μ``; both roots lie inside the unit circle (the iteration is
asymptotically stable and has a stationary law) iff ``|μ| < 1`` and ``0 < λk < 2(1 + μ)``.
Every function that returns a stationary quantity returns ``inf`` (all entries, for a matrix)
when any eigenvalue violates this, even if C has no component along the offending mode, and
also for k ≤ 0 (a flat or concave direction never becomes stationary).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike

#: One-line description of every formula, for the ``attrs`` of theory columns.
FORMULA: dict[str, str] = {
    "stationary_covariance": (
        "exact stationary Cov w of heavy-ball SGD m=mu*m+(Kw+xi), w-=lr*m on L=w'Kw/2 with "
        "additive noise Cov xi=C (any C): discrete Lyapunov equation of the state (w_t, w_t-1); "
        "no approximation (Liu, Ziyin, Ueda 2021 Thm 1-2; docs/physics.md §1)"
    ),
    "variance_1d": (
        "exact 1-D stationary Var w = lr*sigma2/[(1-mu) k (2 - lr k/(1+mu))] for L=k w^2/2 with "
        "additive noise of variance sigma2 per step; no approximation (Liu 2021 Cor. 1)"
    ),
    "training_loss": (
        "exact stationary E[L] = Tr(K Sigma)/2 with Sigma from the discrete Lyapunov solve; "
        "no approximation"
    ),
    "training_loss_closed_form": (
        "exact stationary E[L] = lr/(4(1-mu)) Tr[(I - lr K/(2(1+mu)))^-1 C], valid for any "
        "symmetric C (commuting with K or not) and any stable momentum (Liu 2021 Thm 5)"
    ),
    "transient_loss": (
        "exact E[L(w_t)] from w_0=0 without momentum: lr/4 Tr[(I - lr K/2)^-1 "
        "(I - (I - lr K)^(2t)) C], any symmetric C (Liu 2021 Thm 7)"
    ),
    "continuous_variance_1d": (
        "continuous-time (SDE) approximation Var w = lr*sigma2/(2k); misses the discrete "
        "factor 2/(2 - lr k) (and the momentum factors)"
    ),
}


def _matrix(a: ArrayLike, name: str) -> np.ndarray:
    """A finite, square, symmetric float matrix (a scalar becomes 1×1)."""
    m = np.atleast_2d(np.asarray(a, dtype=float))
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} must be a square matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} has non-finite entries")
    scale = float(np.max(np.abs(m))) if m.size else 0.0
    if not np.allclose(m, m.T, rtol=0.0, atol=1e-12 * max(scale, 1e-300)):
        raise ValueError(f"{name} must be symmetric")
    return 0.5 * (m + m.T)


def _inputs(K: ArrayLike, C: ArrayLike, lr: float, momentum: float):
    k, c = _matrix(K, "K"), _matrix(C, "C")
    if k.shape != c.shape:
        raise ValueError(f"K {k.shape} and C {c.shape} must have the same shape")
    _scalars(lr, momentum)
    return k, c


def _scalars(lr: float, momentum: float) -> None:
    if not (math.isfinite(lr) and lr > 0.0):
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    if not math.isfinite(momentum):
        raise ValueError(f"momentum must be finite, got {momentum}")


def is_stable(eigenvalues: ArrayLike, lr: float, momentum: float = 0.0) -> bool:
    """True iff heavy-ball SGD is asymptotically stable for these Hessian eigenvalues.

    The condition is ``|μ| < 1`` and ``0 < λk < 2(1 + μ)`` for every eigenvalue k (equivalent to
    spectral radius < 1 of the state-space matrix). Dimensionless.
    """
    _scalars(lr, momentum)
    lk = lr * np.asarray(eigenvalues, dtype=float)
    return bool(abs(momentum) < 1.0 and np.all(lk > 0.0) and np.all(lk < 2.0 * (1.0 + momentum)))


def stationary_covariance(K: ArrayLike, C: ArrayLike, lr: float,
                          momentum: float = 0.0) -> np.ndarray:
    """Exact stationary covariance Σ = Cov w (units w²), shape (d, d).

    Solves ``Z = A Z Aᵀ + B C Bᵀ`` for the state z = (w_t, w_{t−1}) with
    ``A = [[(1+μ)I − λK, −μI], [I, 0]]`` and ``B = [−λI; 0]`` (for μ = 0 the d×d equation
    ``Σ = (I − λK) Σ (I − λK) + λ²C``) using ``scipy.linalg.solve_discrete_lyapunov`` and returns
    the w-block. Exact for any symmetric K, C (commuting or not). Returns a d×d matrix of ``inf``
    when the iteration is not asymptotically stable (see :func:`is_stable`).
    """
    k, c = _inputs(K, C, lr, momentum)
    d = k.shape[0]
    if not is_stable(np.linalg.eigvalsh(k), lr, momentum):
        return np.full((d, d), np.inf)
    eye = np.eye(d)
    if momentum == 0.0:
        a = eye - lr * k
        sigma = scipy.linalg.solve_discrete_lyapunov(a, lr * lr * c)
    else:
        a = np.block([[(1.0 + momentum) * eye - lr * k, -momentum * eye],
                      [eye, np.zeros((d, d))]])
        q = np.zeros((2 * d, 2 * d))
        q[:d, :d] = lr * lr * c
        sigma = scipy.linalg.solve_discrete_lyapunov(a, q)[:d, :d]
    return 0.5 * (sigma + sigma.T)


def variance_1d(k: float, sigma2: float, lr: float, momentum: float = 0.0) -> float:
    """Exact 1-D stationary variance ``λσ²/[(1−μ) k (2 − λk/(1+μ))]`` (units w²).

    ``k`` is the curvature of L = ½ k w², ``sigma2`` the per-step variance of the additive
    gradient noise. ``inf`` outside the stability region ``0 < λk < 2(1+μ)``, ``|μ| < 1``.
    """
    _scalars(lr, momentum)
    if not (math.isfinite(k) and math.isfinite(sigma2) and sigma2 >= 0.0):
        raise ValueError(f"k must be finite and sigma2 finite and >= 0, got {k}, {sigma2}")
    if not is_stable([k], lr, momentum):
        return math.inf
    mu = momentum
    return lr * sigma2 / ((1.0 - mu) * k * (2.0 - lr * k / (1.0 + mu)))


def training_loss(K: ArrayLike, C: ArrayLike, lr: float, momentum: float = 0.0) -> float:
    """Exact stationary training loss ``E[L] = ½ Tr(KΣ)`` (units of L), Σ from the Lyapunov solve.

    ``inf`` when the iteration is not asymptotically stable.
    """
    k = _matrix(K, "K")
    sigma = stationary_covariance(k, C, lr, momentum)
    if not np.all(np.isfinite(sigma)):
        return math.inf
    return 0.5 * float(np.sum(k * sigma))


def training_loss_closed_form(K: ArrayLike, C: ArrayLike, lr: float,
                              momentum: float = 0.0) -> float:
    """Liu's Thm 5: ``E[L] = λ/(4(1−μ)) · Tr[(I − λK/(2(1+μ)))⁻¹ C]`` (units of L).

    Exact for every symmetric C, commuting with K or not, and every stable μ: take the trace of
    Thm 2's stationarity equation against f(K) = [(1−μ)λ(2 − λK/(1+μ))]⁻¹; only functions of K
    and Tr(f(K)·C) survive, so no commutation is needed. (Σ itself does depend on the part of C
    that does not commute with K; the loss does not.) ``inf`` outside stability.
    """
    k, c = _inputs(K, C, lr, momentum)
    if not is_stable(np.linalg.eigvalsh(k), lr, momentum):
        return math.inf
    mu = momentum
    r = np.eye(k.shape[0]) - lr * k / (2.0 * (1.0 + mu))
    return lr / (4.0 * (1.0 - mu)) * float(np.trace(np.linalg.solve(r, c)))


def transient_loss(K: ArrayLike, C: ArrayLike, lr: float, steps: int) -> np.ndarray:
    """Exact mean loss ``E[L(w_t)]`` for t = 0..steps from w₀ = 0 without momentum (units of L).

    Liu's Thm 7, ``λ/4 · Tr[(I − λK/2)⁻¹ (I − (I − λK)^{2t}) C]``, evaluated per eigenmode of K
    (K = V diag(k) Vᵀ, c_i = (VᵀCV)_ii) as ``½ λ² Σ_i k_i c_i Σ_{s<t} (1 − λk_i)^{2s}`` so that it
    stays finite at λk = 2 and accurate for small λk. Exact for any symmetric C and any λ > 0
    (unstable modes simply grow; no stationarity is assumed). Returns shape (steps + 1,).
    """
    k, c = _inputs(K, C, lr, 0.0)
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps}")
    kk, v = np.linalg.eigh(k)
    cc = np.einsum("ij,ik,kj->j", v, c, v)  # diagonal of VᵀCV
    lk = lr * kk
    a = 1.0 - lk
    t = np.arange(int(steps) + 1, dtype=float)[:, None]
    # geometric sum g_i(t) = Σ_{s<t} a_i^{2s} = (1 − a^{2t})/(1 − a²), 1 − a² = λk(2 − λk)
    one_minus_a2 = lk * (2.0 - lk)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_abs_a = np.where(a > 0.0, np.log1p(-lk), np.log(np.abs(a)))  # log1p: small λk
        one_minus_a2t = np.where(a == 0.0, (t > 0).astype(float), -np.expm1(2.0 * t * log_abs_a))
        g = np.where(one_minus_a2 == 0.0, t, one_minus_a2t / one_minus_a2)
    return 0.5 * lr * lr * (g * (kk * cc)).sum(axis=1)


def continuous_variance_1d(k: float, sigma2: float, lr: float) -> float:
    """Continuous-time (SDE) approximation ``λσ²/(2k)`` of the 1-D variance (units w²).

    For comparison only: the exact discrete answer (:func:`variance_1d`, μ = 0) is larger by
    ``2/(2 − λk)``. ``inf`` for k ≤ 0.
    """
    _scalars(lr, 0.0)
    if not (math.isfinite(k) and math.isfinite(sigma2) and sigma2 >= 0.0):
        raise ValueError(f"k must be finite and sigma2 finite and >= 0, got {k}, {sigma2}")
    if k <= 0.0:
        return math.inf
    return lr * sigma2 / (2.0 * k)
