"""Leading-order theories of the stationary weight covariance on a quadratic loss (docs/physics.md §2).

Setting: SGD near a minimum of a quadratic loss with Hessian ``H`` (symmetric positive definite,
N×N) and per-step gradient-noise covariance ``C = Cov[g_B − ∇L]`` at the minimum (symmetric
positive semidefinite, need not commute with H), learning rate ``λ = lr``. The noise is taken
additive (evaluated at the minimum; the multiplicative part is dropped). ``M`` is the stationary
``E[(w − ŵ)(w − ŵ)ᵀ]``. In H's eigenbasis ``H = V diag(ω) Vᵀ`` write ``C̃ = VᵀCV``.

- Continuous time (SDE ``dw = −H(w − ŵ) dt + √(λC) dB``, ``t = λ·steps``; Gross, Raulf, Räth 2024
  Eq. 2.29): ``HM + MH = λC``, i.e. ``M̃_ij = λC̃_ij/(ω_i + ω_j)``. Leading order in λω.
- Discrete time, additive noise (the exact stationary covariance of ``δ' = (I − λH)δ + λξ``,
  ``Cov ξ = C``): ``HM + MH − λHMH = λC``, i.e. ``M̃_ij = λC̃_ij/(ω_i + ω_j − λω_iω_j)``; exists
  iff ``0 < λω < 2`` for every ω. (The same matrix as :func:`sgdsweep.theory.quadratic.
  stationary_covariance` at zero momentum, here in closed eigenbasis form.)
- Broken detailed balance (Gross Eq. 2.30–2.31): the continuous solution is exactly
  ``M = (λ/2) H⁻¹ (C + Q)`` with the antisymmetric ``Q = V Q̃ Vᵀ``,
  ``Q̃_ij = (ω_i − ω_j)/(ω_i + ω_j) C̃_ij``. ``Q = 0`` iff ``[H, C] = 0``.
- Detailed-balance approximation (Gross Eq. 2.33): ``M ≈ (λ/2) H⁻¹ C`` (Q dropped). Exact iff
  ``[H, C] = 0``; otherwise the matrix is not even symmetric, but its eigenvalues are real and
  positive (``H⁻¹C`` is similar to ``H^{-1/2} C H^{-1/2}``). Gross plots "the eigenvalues under
  the detailed balance assumption [Eq. (2.33)]" (Fig. 5b,c) and never mentions symmetrising, so
  this module follows Eq. 2.33 literally: :func:`detailed_balance_covariance` returns the
  unsymmetrised matrix by default and :func:`detailed_balance_eigenvalues` its (real) eigenvalues,
  the generalised eigenvalues of ``(C, H)``. The symmetric part is available (``symmetric=True``)
  but has different eigenvalues and need not even be positive semidefinite (the test problem in
  tests/theory/test_theory_lyapunov.py has one negative eigenvalue), so neither form is a covariance
  when ``[H, C] ≠ 0``.
- Normalisation (Gross Fig. 5b, Fig. 8): eigenvalues of M divided by the isotropic value
  ``λσ²/(2S)`` of Eq. 2.34 (the P/N → ∞ limit, where ``C → σ²H/S`` and ``M → λσ²/(2S) I``),
  ordered by magnitude. See :func:`normalised_eigenvalues`.

Units: w in parameter units, H in loss/w², C in (loss/w)², λ in w²/loss; M in w², Q in the units
of C. Validity: leading order in the noise (additive approximation, ``λσ_x²/S ≪ 1`` for linear
regression) and, for the continuous and detailed-balance forms, in ``λω``: the discrete answer is
larger by a factor ≈ ``2/(2 − λω)`` per mode. Functions that return a stationary quantity return
``inf`` (every entry) when no stationary state exists (discrete: some ``λω ≥ 2``); with H
positive definite the continuous-time state always exists.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import NamedTuple

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike

#: One-line description of every formula, for the ``attrs`` of theory columns.
FORMULA: dict[str, str] = {
    "continuous_covariance": (
        "continuous-time (SDE) stationary covariance: H M + M H = lr C with additive noise "
        "covariance C at the minimum; leading order in lr*omega (Gross 2024 Eq. 2.29; docs/physics.md §2)"
    ),
    "discrete_additive_covariance": (
        "discrete-time stationary covariance with additive noise: H M + M H - lr H M H = lr C, "
        "M_ij = lr C_ij/(w_i + w_j - lr w_i w_j) in H's eigenbasis; exact for additive noise, "
        "drops the multiplicative noise (docs/physics.md §2; Liu 2021 Thm 1)"
    ),
    "broken_balance_covariance": (
        "M = (lr/2) H^-1 (C + Q), Q antisymmetric, Q_ij = (w_i - w_j)/(w_i + w_j) C_ij in H's "
        "eigenbasis; identical to the continuous-time solution (Gross 2024 Eq. 2.30-2.31)"
    ),
    "detailed_balance_covariance": (
        "detailed-balance approximation M = (lr/2) H^-1 C (Q dropped; unsymmetrised, real "
        "eigenvalues); exact iff [H, C] = 0 (Gross 2024 Eq. 2.33)"
    ),
    "q_matrix": (
        "antisymmetric part Q of the broken-detailed-balance solution, Q_ij = (w_i - w_j)/"
        "(w_i + w_j) (V'CV)_ij in H's eigenbasis, returned in the original basis (Gross Eq. 2.31)"
    ),
    "q_eigenvalue_magnitudes": (
        "|eigenvalues| of the antisymmetric Q (eigenvalues +-i q), descending (Gross Fig. 5c)"
    ),
    "normalised_eigenvalues": (
        "eigenvalues of M divided by the isotropic lr*sigma2/(2S) of the P/N -> inf limit, "
        "descending (Gross 2024 Fig. 5b, Eq. 2.34)"
    ),
    "isotropic_variance": (
        "isotropic stationary variance lr*sigma2/(2S) for C = sigma2 H/S (Gross 2024 Eq. 2.34); "
        "continuous time"
    ),
}

#: Relative tolerance of the symmetry check (numerically assembled matrices are symmetric only
#: to rounding).
SYMMETRY_RTOL = 1e-10


def _square(a: ArrayLike, name: str) -> np.ndarray:
    """A finite, square, symmetric float matrix (a scalar becomes 1×1), symmetrised exactly."""
    m = np.asarray(a, dtype=float)
    if m.ndim == 0:
        m = m.reshape(1, 1)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty square 2-D matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name} must have finite entries, got {np.sum(~np.isfinite(m))} "
                         "non-finite ones")
    scale = float(np.max(np.abs(m)))
    asym = float(np.max(np.abs(m - m.T)))
    if asym > SYMMETRY_RTOL * scale:
        raise ValueError(f"{name} must be symmetric: max |{name} - {name}.T| = {asym:.3g} exceeds "
                         f"{SYMMETRY_RTOL:g} x max |{name}| = {SYMMETRY_RTOL * scale:.3g}")
    return 0.5 * (m + m.T)


def _hessian(h: ArrayLike, name: str = "h") -> np.ndarray:
    m = _square(h, name)
    lo = float(np.linalg.eigvalsh(m)[0])
    if not lo > 0.0:
        raise ValueError(f"{name} must be positive definite, got smallest eigenvalue {lo:.6g} "
                         "(flat or concave directions have no stationary state)")
    return m


def _noise(c: ArrayLike, n: int, name: str = "c") -> np.ndarray:
    m = _square(c, name)
    if m.shape != (n, n):
        raise ValueError(f"{name} must have the shape of h, ({n}, {n}), got shape {m.shape}")
    ev = np.linalg.eigvalsh(m)
    if ev[0] < -SYMMETRY_RTOL * max(float(np.max(np.abs(ev))), 1e-300):
        raise ValueError(f"{name} must be positive semidefinite (a covariance), got smallest "
                         f"eigenvalue {ev[0]:.6g}")
    return m


def _lr(lr: float) -> float:
    try:
        value = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}") from None
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    return value


def _inputs(h: ArrayLike, c: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    hh = _hessian(h)
    return hh, _noise(c, hh.shape[0])


def _eigenbasis(h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ω (ascending), V and C̃ = VᵀCV."""
    omega, v = np.linalg.eigh(h)
    return omega, v, v.T @ c @ v


def continuous_covariance(h: ArrayLike, c: ArrayLike, lr: float) -> np.ndarray:
    """Continuous-time stationary covariance M (w²), the solution of ``HM + MH = λC``, shape (N, N).

    Solved with ``scipy.linalg.solve_continuous_lyapunov`` (Bartels–Stewart). Symmetric; exists
    and is unique for every positive definite H. Leading order in λω: the exact additive-noise
    discrete answer is :func:`discrete_additive_covariance`.
    """
    hh, cc = _inputs(h, c)
    m = scipy.linalg.solve_continuous_lyapunov(hh, _lr(lr) * cc)
    return 0.5 * (m + m.T)


def discrete_additive_covariance(h: ArrayLike, c: ArrayLike, lr: float) -> np.ndarray:
    """Stationary covariance (w²) of ``δ' = (I − λH)δ + λξ``, ``Cov ξ = C``: ``HM + MH − λHMH = λC``.

    Computed in H's eigenbasis, ``M̃_ij = λC̃_ij/(ω_i + ω_j − λω_iω_j)``. Exact for additive
    noise in discrete time; drops the multiplicative noise of real minibatch SGD (for that see
    :mod:`sgdsweep.theory.linear`). Returns an N×N matrix of ``inf`` when some ``λω ≥ 2`` (the
    iteration is not contracting and has no stationary state).
    """
    hh, cc = _inputs(h, c)
    lam = _lr(lr)
    omega, v, ct = _eigenbasis(hh, cc)
    n = hh.shape[0]
    if np.any(lam * omega >= 2.0):
        return np.full((n, n), np.inf)
    denom = omega[:, None] + omega[None, :] - lam * omega[:, None] * omega[None, :]
    m = v @ (lam * ct / denom) @ v.T
    return 0.5 * (m + m.T)


def q_matrix(h: ArrayLike, c: ArrayLike) -> np.ndarray:
    """Antisymmetric Q of Gross Eq. 2.30–2.31 (units of C), in the original basis, shape (N, N).

    ``Q = V Q̃ Vᵀ`` with ``Q̃_ij = (ω_i − ω_j)/(ω_i + ω_j) (VᵀCV)_ij``, so that the continuous-time
    solution is ``M = (λ/2) H⁻¹ (C + Q)``. It sets the stationary probability current
    ``J = −Q M⁻¹ δw p``; ``Q = 0`` iff ``[H, C] = 0`` (detailed balance). Independent of λ.
    """
    hh, cc = _inputs(h, c)
    omega, v, ct = _eigenbasis(hh, cc)
    q = v @ _q_eigenbasis(omega, ct) @ v.T
    return 0.5 * (q - q.T)


def _q_eigenbasis(omega: np.ndarray, ct: np.ndarray) -> np.ndarray:
    """``Q̃_ij = (ω_i − ω_j)/(ω_i + ω_j) C̃_ij``: Q in H's eigenbasis (units of C)."""
    return (omega[:, None] - omega[None, :]) / (omega[:, None] + omega[None, :]) * ct


def q_eigenvalue_magnitudes(h: ArrayLike, c: ArrayLike) -> np.ndarray:
    """``|eig Q|`` sorted descending, shape (N,) (units of C).

    Q is real antisymmetric, so its eigenvalues come in pairs ``±i q`` (plus a 0 when N is odd);
    each magnitude appears twice. Computed as the singular values of Q, which equal the
    eigenvalue magnitudes for a normal matrix and are real by construction. Gross Fig. 5(c) plots
    the smallest and largest of these.
    """
    return np.linalg.svd(q_matrix(h, c), compute_uv=False)


def broken_balance_covariance(h: ArrayLike, c: ArrayLike, lr: float) -> np.ndarray:
    """``M = (λ/2) H⁻¹ (C + Q)`` of Gross Eq. 2.30 (w²), shape (N, N).

    Algebraically identical to :func:`continuous_covariance`; this is the paper's form, kept so
    the decomposition into a detailed-balance part and the Q correction can be inspected.
    """
    hh, cc = _inputs(h, c)
    m = 0.5 * _lr(lr) * np.linalg.solve(hh, cc + q_matrix(hh, cc))
    return 0.5 * (m + m.T)


def detailed_balance_covariance(h: ArrayLike, c: ArrayLike, lr: float,
                                symmetric: bool = False) -> np.ndarray:
    """Detailed-balance approximation ``M ≈ (λ/2) H⁻¹ C`` (Gross Eq. 2.33) (w²), shape (N, N).

    Exact (and symmetric) iff ``[H, C] = 0``. Otherwise the returned matrix is NOT symmetric
    (default, as Eq. 2.33 is written; its eigenvalues are real, see
    :func:`detailed_balance_eigenvalues`). ``symmetric=True`` returns the symmetric part
    ``(λ/4)(H⁻¹C + CH⁻¹)`` instead: symmetric, but its eigenvalues differ from Eq. 2.33's and can
    be negative.
    Gross finds the approximation adequate for P ≳ 2N in linear regression.
    """
    hh, cc = _inputs(h, c)
    m = 0.5 * _lr(lr) * np.linalg.solve(hh, cc)
    return 0.5 * (m + m.T) if symmetric else m


def detailed_balance_eigenvalues(h: ArrayLike, c: ArrayLike, lr: float) -> np.ndarray:
    """Eigenvalues of ``(λ/2) H⁻¹ C`` (w²), sorted descending, shape (N,).

    Real and ≥ 0: they are ``λ/2`` times the generalised eigenvalues of ``C v = μ H v`` (solved
    with ``scipy.linalg.eigh(c, h)``, no complex round-off). These are the "detailed balance"
    eigenvalues of Gross Fig. 5(b,c) under our reading of Eq. 2.33 (module docstring).
    """
    hh, cc = _inputs(h, c)
    mu = scipy.linalg.eigh(cc, hh, eigvals_only=True)
    return np.sort(0.5 * _lr(lr) * mu)[::-1]


class LeadingOrder(NamedTuple):
    """The leading-order theories of one (H, C, λ), as :func:`leading_order` returns them."""

    #: :func:`continuous_covariance` (w²), shape (N, N).
    continuous_covariance: np.ndarray
    #: :func:`detailed_balance_eigenvalues` (w²), descending, shape (N,).
    detailed_balance_eigenvalues: np.ndarray
    #: :func:`q_eigenvalue_magnitudes` (units of C), descending, shape (N,).
    q_eigenvalue_magnitudes: np.ndarray


def leading_order(h: ArrayLike, c: ArrayLike, lr: float) -> LeadingOrder:
    """:func:`continuous_covariance`, :func:`detailed_balance_eigenvalues` and
    :func:`q_eigenvalue_magnitudes` of the same inputs from one validation and one
    eigendecomposition of H (what a point's theory reports next to the exact answer; the three
    calls validate H and C three times, most of their cost at small N).

    In H's eigenbasis: ``M̃_ij = λC̃_ij/(ω_i + ω_j)``; the generalised eigenvalues of (C, H) are
    the eigenvalues of ``Ω^{-1/2} C̃ Ω^{-1/2}``; ``|eig Q|`` are the singular values of ``Q̃``
    (V is orthogonal). Equal to the three functions to rounding. Raises ``ValueError`` for the
    inputs they refuse.
    """
    hh, cc = _inputs(h, c)
    lam = _lr(lr)
    omega, v, ct = _eigenbasis(hh, cc)
    m = v @ (lam * ct / (omega[:, None] + omega[None, :])) @ v.T
    scale = 1.0 / np.sqrt(omega)
    balanced = np.linalg.eigvalsh(scale[:, None] * ct * scale[None, :])
    q = _q_eigenbasis(omega, ct)
    return LeadingOrder(0.5 * (m + m.T), np.sort(0.5 * lam * balanced)[::-1],
                        np.linalg.svd(0.5 * (q - q.T), compute_uv=False))


def isotropic_variance(lr: float, batch_size: int, noise_var: float) -> float:
    """``λσ²/(2S)`` (w²): Gross Eq. 2.34, the continuous-time M for ``C = σ²H/S``.

    ``noise_var`` is the residual (label-noise) variance σ² in target units squared; the result
    is in w² when the inputs are in target-per-w units. This is the normalisation of Gross
    Fig. 5(b) and Fig. 8.
    """
    lam = _lr(lr)
    if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    s2 = float(noise_var)
    if not (math.isfinite(s2) and s2 > 0.0):
        raise ValueError(f"noise_var must be a finite number > 0 (it normalises), got {noise_var!r}")
    return lam * s2 / (2.0 * int(batch_size))


def normalised_eigenvalues(m: ArrayLike, lr: float, batch_size: int,
                           noise_var: float) -> np.ndarray:
    """Eigenvalues of M divided by ``λσ²/(2S)``, sorted descending, shape (N,) (dimensionless).

    Gross Fig. 5(b) plots the eigenvalues of the weight covariance "ordered by their magnitude and
    normalized by λσ_ε²/(2S) [Eq. (2.34)]" (Fig. 8 likewise with σ_y²), so the isotropic
    large-P/N limit is 1 for every mode; this is that normalisation, not a division by the mean.
    ``m`` may be the unsymmetrised detailed-balance matrix: a non-symmetric ``m`` must have a real
    spectrum (imaginary parts ≤ 1e-8 of the largest magnitude), whose real parts are used. An
    ``m`` with any ``inf`` entry (no stationary state) gives all ``inf``.
    """
    scale = isotropic_variance(lr, batch_size, noise_var)
    a = np.asarray(m, dtype=float)
    if a.ndim == 0:
        a = a.reshape(1, 1)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"m must be a non-empty square 2-D matrix, got shape {a.shape}")
    if np.any(np.isinf(a)):
        return np.full(a.shape[0], np.inf)
    if np.any(np.isnan(a)):
        raise ValueError("m must not contain NaN")
    big = max(float(np.max(np.abs(a))), 1e-300)
    if np.max(np.abs(a - a.T)) <= SYMMETRY_RTOL * big:
        ev = np.linalg.eigvalsh(0.5 * (a + a.T))
    else:
        ev_c = np.linalg.eigvals(a)
        top = max(float(np.max(np.abs(ev_c))), 1e-300)
        if np.max(np.abs(ev_c.imag)) > 1e-8 * top:
            raise ValueError("m must have a real spectrum (a covariance or (lr/2) H^-1 C), got "
                             f"eigenvalues with imaginary parts up to {np.max(np.abs(ev_c.imag)):.3g}")
        ev = ev_c.real
    return np.sort(ev)[::-1] / scale
