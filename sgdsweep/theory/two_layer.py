"""Stationary weight fluctuations of a two-layer linear network at a minimum (docs/physics.md §4).

Network ``f(x) = W2 W1 x`` with ``W1 ∈ R^{N_h×N_i}``, ``W2 ∈ R^{N_o×N_h}``, here ``N_o = 1``
(``W2`` a row of N_h numbers), loss ``L = 1/(2P) Σ_μ (y_μ − W2W1x_μ)²``, both layers trained by
SGD with learning rate ``λ = lr`` and batch size ``S = batch_size`` (Gross, Raulf, Räth 2024
Sec. III). θ = (W1, W2) stacked into ``N_h(N_i + 1)`` numbers.

Derivation (leading order; checked numerically in tests/theory/test_theory_two_layer.py). Let
``K: θ ↦ W2 δW1 + δW2 W1`` be the Jacobian of the end-to-end vector ``w = W2W1`` (1×N_i) and
``Σxx`` the (uncentred) input second moment. At a global minimum (``W2W1 = ŵ``, the least-squares
vector) the Hessian is exactly the Gauss–Newton ``H = KᵀΣxxK``: the residual term
``(1/P) Σ r_μ ∂²f/∂θ²`` is ``Xᵀr/P = 0`` by the normal equations, because with W2 ≠ 0 the product
can reach any w. If the residual ``r = y − ŵx`` is independent of x with constant variance
``σ_y²`` (pure-noise targets or teacher plus label noise, P → ∞), the per-sample gradient
``−r ∇θ f`` has covariance ``σ_y² KᵀΣxxK``, so with S samples drawn with replacement
``C = σ_y² H / S`` exactly. The continuous-time Lyapunov equation ``HΣ + ΣH = λC`` then gives,
on the range of H (the zero modes are the tangent space of the minimum manifold ``W2W1 = ŵ``,
where the linear theory fixes nothing),

    Σ = (λσ_y²/2S) Π,   Π = Kᵀ(KKᵀ)⁺K  the orthogonal projector onto range(H) = range(Kᵀ).

``KKᵀ = D2·I + W1ᵀW1`` with ``D2 = ‖W2‖²``, so the W2 block is
``Π_22 = W1 (D2 I + W1ᵀW1)⁺ W1ᵀ = A diag(D1_ii/(D1_ii + D2)) Aᵀ`` (``W1 = A S1 Bᵀ``,
``D1 = diag(S1S1ᵀ)``): Gross Eq. 3.34.

Findings beyond the paper (limits of validity):

- The result does not need whitened inputs: Π depends on K only, so any ``Σxx ≻ 0`` gives the
  same answer (Gross states this only as a numerical observation). It needs no balance between
  W1 and W2, only ``W2W1 = ŵ``.
- Joint spectrum: ``rank H = N_i`` nonzero eigenvalues ``λσ_y²/(2S)`` iff ``W2 ≠ 0`` (then K is
  onto). The remaining ``N_h(N_i + 1) − N_i`` eigenvalues of the full parameter covariance are 0;
  the "N_o·N_h zero modes" of Gross count only his reduced coordinates
  ``z1 = VᵀδW1, z2 = δW2A`` (size ``N_o(N_i + N_h)``); the components of δW1 along the null space
  of W2 are extra zero modes. With pure-noise targets and exact population moments ``ŵ = 0``:
  then either W2 = 0 (rank H = rank W1 ≤ N_h and W2's fluctuations are ``λσ_y²/(2S)`` on range W1,
  i.e. the formula with D2 = 0), or W2 ≠ 0 lies in the left null space of a rank-deficient W1.
- Finite P (Gross's own setting): ``C = KᵀGK/S`` with ``G = (1/P) Σ r_μ² x_μx_μᵀ`` is not ∝ H
  for one data set, detailed balance breaks as in the single-layer case, and the formula is the
  ``P/N_i → ∞`` limit. Its error shrinks only like ``√(N_i/P)``: the largest relative error of the
  W2 eigenvalues (continuous Lyapunov solution with the sample G, median of 20 data sets,
  N_i = 5, N_h = 3, σ_y² set to the mean squared residual) was 0.58, 0.33, 0.10, 0.04 at
  P/N_i = 2, 10, 100, 1000.
- Continuous time: needs ``λ ω_max ≪ 2`` with ``ω_max = λ_max(Σxx)(D1_max + D2)``. For additive
  noise in discrete time, C ∝ H still commutes with H and each H-mode of eigenvalue ω has variance
  ``λσ_y²/(S(2 − λω))`` instead, so the joint spectrum is no longer flat and the W2 eigenvalues
  grow by mode-dependent factors up to ``2/(2 − λω_max)`` (1.01–1.09 at λω_max = 0.17).
- Sampling without replacement multiplies C (and every result here) by ``(P − S)/(P − 1)``.
- W1, W2 are taken as fixed; real SGD drifts slowly along the minimum manifold (second order),
  so D1, D2 must be measured from the windowed mean weights (docs/physics.md §4).

Units: weights in their own units (products W2W1 in target/input units), σ_y² in target units²;
the covariances are in units of the weights squared.
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np
from numpy.typing import ArrayLike

#: One-line description of every formula, for the ``attrs`` of theory columns.
FORMULA: dict[str, str] = {
    "joint_eigenvalue": (
        "every nonzero eigenvalue of the joint (W1, W2) covariance = lr*sigma_y2/(2S) (isotropic on "
        "the range of the Hessian, rank N_i when W2 != 0); continuous-time Lyapunov solution with "
        "C = sigma_y2 H/S at a minimum (Gross 2024 Eq. 3.32; docs/physics.md §4)"
    ),
    "w2_covariance_eigenvalues": (
        "eigenvalues of cov(delta W2) = lr*sigma_y2/(2S) * D1_ii/(D1_ii + D2), D1 eigenvalues of "
        "W1 W1', D2 = |W2|^2, eigenvectors the left singular vectors of W1; N_o = 1, continuous "
        "time, residual independent of x, any input covariance (Gross 2024 Eq. 3.34)"
    ),
    "w2_covariance": (
        "cov(delta W2) = lr*sigma_y2/(2S) * W1 (|W2|^2 I + W1'W1)^+ W1' (N_h x N_h), the matrix "
        "form of Gross 2024 Eq. 3.34"
    ),
    "n_joint_modes": (
        "number of nonzero joint eigenvalues = rank of the Hessian: N_i if W2 != 0, else rank W1"
    ),
}


def _scalars(lr: float, batch_size: int, sigma_y2: float) -> tuple[float, int, float]:
    try:
        lam = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}") from None
    if not (math.isfinite(lam) and lam > 0.0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    try:
        s2 = float(sigma_y2)
    except (TypeError, ValueError):
        raise ValueError(f"sigma_y2 must be a finite number >= 0, got {sigma_y2!r}") from None
    if not (math.isfinite(s2) and s2 >= 0.0):
        raise ValueError(f"sigma_y2 must be a finite number >= 0, got {sigma_y2!r}")
    return lam, int(batch_size), s2


def _weights(w1: ArrayLike, w2: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """W1 as (N_h, N_i) and W2 as a length-N_h vector (N_o = 1)."""
    a = np.asarray(w1, dtype=float)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"w1 must be a non-empty 2-D array of shape (N_h, N_i), got shape "
                         f"{a.shape}")
    b = np.asarray(w2, dtype=float)
    n_h = a.shape[0]
    if b.shape == (n_h,):
        pass
    elif b.shape == (1, n_h):
        b = b[0]
    else:
        raise ValueError(f"w2 must have shape (1, N_h) = (1, {n_h}) or ({n_h},) for one output "
                         f"(N_o = 1; the formula is derived for N_o = 1 only), got shape {b.shape}")
    for name, arr in (("w1", a), ("w2", b)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must have finite entries, got "
                             f"{np.sum(~np.isfinite(arr))} non-finite ones")
    return a, b


def joint_eigenvalue(lr: float, batch_size: int, sigma_y2: float) -> float:
    """``λσ_y²/(2S)``: the common value of all nonzero eigenvalues of the joint covariance.

    Units: weights squared. Valid under the conditions of the module docstring (continuous time,
    minimum with W2 ≠ 0 for rank N_i, residual independent of x). The zero eigenvalues (the
    minimum manifold's tangent directions) are not fixed by the linear theory.
    """
    lam, s, s2 = _scalars(lr, batch_size, sigma_y2)
    return lam * s2 / (2.0 * s)


def _w1_spectrum(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """D1 (descending, length N_h, zero-padded) and A (columns: left singular vectors of W1)."""
    u, sv, _ = np.linalg.svd(a, full_matrices=True)
    d1 = np.zeros(a.shape[0])
    d1[: sv.size] = sv * sv
    return d1, u


def w2_covariance_eigenvalues(w1: ArrayLike, w2: ArrayLike, lr: float, batch_size: int,
                              sigma_y2: float) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of ``cov(δW2)`` (Gross Eq. 3.34), N_o = 1.

    Args:
        w1: W1 at the minimum, shape (N_h, N_i).
        w2: W2 at the minimum, shape (1, N_h) or (N_h,).
        lr: learning rate λ > 0.
        batch_size: S ≥ 1 (samples with replacement; multiply by (P − S)/(P − 1) without).
        sigma_y2: residual variance σ_y² ≥ 0 at the minimum (target units²).

    Returns:
        ``(values, vectors)``: ``values[i] = (λσ_y²/2S) · D1_ii/(D1_ii + D2)`` (weights²) with
        ``D1`` the eigenvalues of ``W1W1ᵀ`` in descending order (zero-padded to N_h when
        N_h > N_i) and ``D2 = ‖W2‖²``; ``vectors[:, i]`` the matching left singular vector of W1
        (shape (N_h, N_h), orthonormal columns). A mode with ``D1_ii + D2 = 0`` (W2 = 0 and W1
        singular there) gets 0: it is a zero mode of the Hessian. Sorted by D1, so the values
        are descending too.
    """
    a, b = _weights(w1, w2)
    scale = joint_eigenvalue(lr, batch_size, sigma_y2)
    d1, u = _w1_spectrum(a)
    d2 = float(b @ b)
    den = d1 + d2
    ratio = np.divide(d1, den, out=np.zeros_like(d1), where=den > 0.0)
    return scale * ratio, u


def w2_covariance(w1: ArrayLike, w2: ArrayLike, lr: float, batch_size: int,
                  sigma_y2: float) -> np.ndarray:
    """``cov(δW2) = (λσ_y²/2S) · W1 (D2 I + W1ᵀW1)⁺ W1ᵀ``, shape (N_h, N_h) (weights²).

    The matrix whose spectrum is :func:`w2_covariance_eigenvalues`, assembled from it.
    """
    values, vectors = w2_covariance_eigenvalues(w1, w2, lr, batch_size, sigma_y2)
    m = (vectors * values) @ vectors.T
    return 0.5 * (m + m.T)


def n_joint_modes(w1: ArrayLike, w2: ArrayLike, rtol: float = 1e-10) -> int:
    """Number of nonzero joint eigenvalues (rank of the Hessian at the minimum).

    ``N_i`` when W2 ≠ 0 (the end-to-end Jacobian is onto), else ``rank W1`` (singular values
    above ``rtol`` times the largest). The full parameter vector has ``N_h(N_i + 1)`` entries;
    the rest are zero modes.
    """
    a, b = _weights(w1, w2)
    if np.any(b != 0.0):
        return a.shape[1]
    sv = np.linalg.svd(a, compute_uv=False)
    return int(np.sum(sv > rtol * max(float(sv[0]), 1e-300))) if sv[0] > 0.0 else 0
