"""Random-matrix theory of weight-matrix eigenvalues under SGD (docs/physics.md §5).

Source: Park, Favoni, Lucini, Aarts 2024 (Eqs. 7, 9, 11, 12 and the spacing result below
Fig. 3). The eigenvalues ``x_i`` of ``X = WᵀW`` follow a discrete Langevin equation with a
Coulomb repulsion (Dyson index β = 1); near a minimum ``x_m`` of the potential the stationary
law of a *doubly degenerate pair* is the 2-eigenvalue Coulomb gas::

    P(x1, x2) = |x1 − x2| exp(−(δx1² + δx2²)/(2σ²)) / (4√π σ³),   δx = x − x_m,

with ``σ² = (α/|B|) g̃²/Ω`` (Eq. 9, linear scaling rule). This is the eigenvalue law of the
2×2 GOE: a real symmetric matrix with independent Gaussian entries, diagonal variance σ² and
off-diagonal variance σ²/2 (twice as large on the diagonal), since then
``density ∝ exp(−Tr H²/(2σ²))``. So σ is the width each eigenvalue would have *without* the
repulsion; with it, one eigenvalue has variance 1.5σ².

Units: x, x_m, δx, σ and spacings S are eigenvalues of WᵀW, i.e. weight²; densities are in
1/weight²; the normalised spacing ``s = S/⟨S⟩``, the Binder cumulant and the KS statistic are
dimensionless.

Consistency of the constants (derived here, all agree with docs/physics.md §5 and the paper): with
``c = (x1 + x2)/2`` and ``S = x1 − x2`` the joint law factorises, ``x1² + x2² = 2c² + S²/2``, so
``c ~ N(x_m, σ²/2)`` and |S| is Rayleigh with scale √2 σ: ``P(S) = S/(2σ²) e^{−S²/(4σ²)}``,
``⟨S⟩ = √π σ``, ``⟨S²⟩ = 4σ²``, ``⟨S⁴⟩ = 32σ⁴``. One eigenvalue is ``c ± S/2``, hence
``⟨δx²⟩ = σ²/2 + σ² = 1.5σ²`` and ``⟨δx⁴⟩ = 3σ⁴/4 + 3σ⁴ + 2σ⁴ = 23σ⁴/4``, so
``U₄ = (23/4)/(3·9/4) − 1 = −4/27``; and ``s = S/(√π σ)`` has the Wigner surmise
``(π/2) s e^{−πs²/4}``. The same σ (the Gaussian width in the Coulomb-gas weight) is meant in
every formula. (The paper calls Eq. 11 the "Wigner semi-circle"; for N = 2 it is not a
semicircle, just the one-eigenvalue marginal of the law above.)
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
from numpy.typing import ArrayLike

#: One-line description of every formula, for the ``attrs`` of theory columns.
FORMULA: dict[str, str] = {
    "pair_density": (
        "one-eigenvalue (pooled) density of a degenerate pair of eigenvalues of W'W, "
        "rho = exp(-u^2/2)/(4 sqrt(pi) sigma) [2 exp(-u^2/2) + sqrt(2 pi) u erf(u/sqrt2)], "
        "u = (x - x_m)/sigma: marginal of the 2-eigenvalue Coulomb gas / 2x2 GOE, beta=1 "
        "(Park et al. 2024 Eq. 11; docs/physics.md §5)"
    ),
    "pair_variance": (
        "Var x = 1.5 sigma^2 for one eigenvalue of a degenerate pair, sigma^2 = (lr/|B|) g^2/Omega "
        "the Gaussian width without repulsion (Eq. 9, 11)"
    ),
    "binder_pair": (
        "Binder cumulant U4 = <dx^4>/(3<dx^2>^2) - 1 = -4/27 of the pair density (Eq. 12); "
        "0 for a Gaussian"
    ),
    "wigner_surmise": (
        "nearest-neighbour spacing of the pair, s = S/<S>: P(s) = (pi/2) s exp(-pi s^2/4), "
        "CDF 1 - exp(-pi s^2/4) (beta = 1 Wigner surmise, exact for N = 2)"
    ),
    "mean_spacing": (
        "mean spacing <S> = <|x1 - x2|> = sqrt(pi) sigma of a degenerate pair, "
        "proportional to sqrt(lr/|B|) (Park et al. 2024, below Fig. 3)"
    ),
}

#: Binder cumulant ⟨δx⁴⟩/(3⟨δx²⟩²) − 1 of :func:`pair_density` (dimensionless), Eq. 12.
BINDER_PAIR: float = -4.0 / 27.0


def _sigma(sigma: float) -> float:
    try:
        s = float(sigma)
    except (TypeError, ValueError):
        raise ValueError(f"sigma must be a finite real number > 0, got {sigma!r}") from None
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"sigma must be finite and > 0, got {sigma!r}")
    return s


def _real_array(a: ArrayLike, name: str) -> np.ndarray:
    try:
        arr = np.asarray(a, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of real numbers, got {a!r}") from None
    return arr


def pair_density(dx: ArrayLike, sigma: float) -> np.ndarray:
    """One-eigenvalue density ρ(δx) of a degenerate pair (Eq. 11), in 1/weight².

    ``dx`` is ``δx = x − x_m`` (weight², any shape, broadcasting), ``sigma`` > 0 the Gaussian width
    σ of the Coulomb-gas weight (weight²; *not* the standard deviation, which is √1.5 σ). The
    density is ``(1/2)Σ_i ⟨δ(x − x_i)⟩`` of the pair, normalised to 1 over the real line, even in
    δx, with variance 1.5σ² and Binder cumulant −4/27. Non-finite ``dx`` gives nan (±inf gives 0).
    """
    s = _sigma(sigma)
    u = _real_array(dx, "dx") / s
    g = np.exp(-0.5 * u * u)
    with np.errstate(invalid="ignore"):
        bracket = 2.0 * g + math.sqrt(2.0 * math.pi) * u * scipy.special.erf(u / math.sqrt(2.0))
        rho = g * bracket / (4.0 * math.sqrt(math.pi) * s)
    rho = np.where(np.isinf(u), 0.0, rho)
    return rho


def pair_variance(sigma: float) -> float:
    """Variance ⟨δx²⟩ = 1.5σ² of one eigenvalue of a degenerate pair, in weight⁴.

    ``sigma`` > 0 in weight², as in :func:`pair_density`.
    """
    s = _sigma(sigma)
    return 1.5 * s * s


def binder_cumulant(samples: ArrayLike) -> float:
    """Sample Binder cumulant ``m4/(3 m2²) − 1`` (dimensionless) of a 1-D sample.

    ``m_k = mean((x − x̄)^k)`` are central moments about the *sample* mean x̄ (divisor n, no bias
    correction), so the estimator is consistent, with O(1/n) bias; it is 0 for a Gaussian and
    −4/27 for :func:`pair_density`. Any array is flattened; non-finite values are an error. At
    least 2 values, not all equal, are required. Its standard error must be estimated with the
    dependence of the sample in mind (the two eigenvalues of one replica are correlated:
    resample replicas, not values).
    """
    x = _real_array(samples, "samples").ravel()
    if x.size < 2:
        raise ValueError(f"samples must hold at least 2 values, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"samples must be finite, got {int(np.sum(~np.isfinite(x)))} non-finite value(s)")
    d = x - x.mean()
    m2 = float(np.mean(d * d))
    if m2 <= 0.0:
        raise ValueError("samples must not all be equal (zero variance), got a constant sample")
    m4 = float(np.mean(d**4))
    return m4 / (3.0 * m2 * m2) - 1.0


def wigner_surmise_pdf(s: ArrayLike) -> np.ndarray:
    """β = 1 Wigner surmise ``P(s) = (π/2) s e^{−πs²/4}`` for s ≥ 0, 0 for s < 0.

    ``s`` is the spacing normalised to unit mean (dimensionless); the density integrates to 1
    and has mean 1. Exact (not a surmise) for a 2×2 GOE pair.
    """
    x = _real_array(s, "s")
    with np.errstate(invalid="ignore"):
        p = 0.5 * math.pi * x * np.exp(-0.25 * math.pi * x * x)
    return np.where(x < 0.0, 0.0, np.where(np.isinf(x), 0.0, p))


def wigner_surmise_cdf(s: ArrayLike) -> np.ndarray:
    """CDF ``1 − e^{−πs²/4}`` of :func:`wigner_surmise_pdf` for s ≥ 0, 0 for s < 0 (dimensionless)."""
    x = _real_array(s, "s")
    c = -np.expm1(-0.25 * math.pi * x * x)
    return np.where(x < 0.0, 0.0, c)


def mean_spacing(sigma: float) -> float:
    """Mean spacing ``⟨S⟩ = ⟨|x1 − x2|⟩ = √π σ`` of a degenerate pair, in weight².

    ``sigma`` > 0 in weight², as in :func:`pair_density`.
    """
    return math.sqrt(math.pi) * _sigma(sigma)


def pair_statistics(eigenvalues: ArrayLike) -> dict[str, float | int]:
    """RMT statistics of a degenerate pair measured over replicas.

    ``eigenvalues`` has shape (replicas, 2): the two eigenvalues of WᵀW (weight²) that belong to
    one degenerate pair, one row per independent replica (run/seed), in either order. Rows with a
    non-finite entry are dropped; at least 2 usable rows are needed, with non-zero spread and
    not all spacings zero. Returns (units in brackets):

    - ``n_replicas``: rows used (int);
    - ``centre``: pooled mean of both eigenvalues, the estimate of x_m (weight²);
    - ``pooled_variance``: mean of (x − centre)² over the pooled 2n values (weight⁴);
    - ``binder``: :func:`binder_cumulant` of the pooled δx = x − centre (theory −4/27);
    - ``sigma``: σ from the pooled spread, ``sqrt(Σ(x − centre)²/(3n − 1))`` (weight²). This is
      pooled_variance/1.5 up to a factor 2n/(3n − 1)·1.5 = 1 + O(1/n), chosen because under the
      2-eigenvalue law ``E Σ(x − centre)² = (3n − 1)σ²`` exactly (centre = mean of the n pair
      centres, each of variance σ²/2), so σ² is unbiased;
    - ``mean_spacing``: mean of |x1 − x2| (weight², theory √π σ);
    - ``sigma_from_spacing``: mean_spacing/√π, an independent estimate of σ (weight²);
    - ``ks_statistic``, ``ks_pvalue``: one-sample Kolmogorov–Smirnov test
      (``scipy.stats.kstest``) of s = |x1 − x2|/mean_spacing against :func:`wigner_surmise_cdf`.
      The scale ⟨S⟩ is estimated from the same data, so the p-value is approximate: the
      tabulated KS distribution assumes a fully specified null and here is conservative
      (p-values too large, rejections too rare, Lilliefors-type effect).
    """
    ev = _real_array(eigenvalues, "eigenvalues")
    if ev.ndim != 2 or ev.shape[1] != 2:
        raise ValueError(f"eigenvalues must have shape (replicas, 2), got shape {ev.shape}")
    ev = ev[np.all(np.isfinite(ev), axis=1)]
    n = ev.shape[0]
    if n < 2:
        raise ValueError(f"eigenvalues must have at least 2 rows with finite entries, got {n}")
    pooled = ev.ravel()
    centre = float(pooled.mean())
    d = pooled - centre
    ss = float(np.sum(d * d))
    if ss <= 0.0:
        raise ValueError("eigenvalues must not all be equal (zero spread), got a constant array")
    spacing = np.abs(ev[:, 0] - ev[:, 1])
    mean_s = float(spacing.mean())
    if mean_s <= 0.0:
        raise ValueError("eigenvalues must have a non-zero spacing in some row, got all pairs equal")
    import scipy.stats  # here: importing it costs 0.6 s, most of a fit job's time on a small sweep

    ks = scipy.stats.kstest(spacing / mean_s, wigner_surmise_cdf)
    return {
        "n_replicas": int(n),
        "centre": centre,
        "pooled_variance": ss / pooled.size,
        "binder": binder_cumulant(d),
        "sigma": math.sqrt(ss / (3.0 * n - 1.0)),
        "mean_spacing": mean_s,
        "sigma_from_spacing": mean_s / math.sqrt(math.pi),
        "ks_statistic": float(ks.statistic),
        "ks_pvalue": float(ks.pvalue),
    }
