"""Exact discrete-time stationary statistics of SGD on finite-data linear regression.

docs/physics.md §2. Write δ = w − ŵ, A_B = X_BᵀX_B/S and b_B = X_Bᵀr_B/S for a minibatch B. Then
exactly (heavy-ball momentum μ, learning rate λ)::

    δ_{t+1} = ((1 + μ) I − λ A_t) δ_t − μ δ_{t−1} + λ b_t

With the state z_t = (δ_t, δ_{t−1}), Z = E[z zᵀ] = [[M, K], [Kᵀ, M]] and
B̄ = [[(1 + μ) I − λH, −μ I], [I, 0]], stationarity reads::

    Z = B̄ Z B̄ᵀ + λ² [[E[A M A] − H M H + C, 0], [0, 0]]

(cross terms vanish because E[δ] = 0 and z_t is independent of batch t). The batch moments are
``F(M) = (1/P) Σ x xᵀ M x xᵀ`` and

- with replacement (``minibatch_replace``): E[AMA] = F/S + (1 − 1/S) HMH, C = G/S;
- without replacement (``minibatch``): E[AMA] = F/S + (1 − 1/S)(P·HMH − F)/(P − 1),
  C = G (P − S)/(S (P − 1));

where G = (1/P) Σ r² x xᵀ. For μ = 0 the system reduces to the N×N equation
``M = (I − λH) M (I − λH) + λ² (E[AMA] − HMH + C)``. It includes the multiplicative noise and
the discreteness; the continuous-time λC/(2H) and the isotropic λσ_ε²/(2S) are its limits.

K = E[δ_t δ_{t−1}ᵀ] is eliminated (:func:`stationary_second_moment`), leaving an equation for
M alone, solved directly (dense, on its symmetric half) up to ``DIRECT_MAX_UNKNOWNS`` entries
of M and matrix-free with GMRES beyond.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import scipy.sparse.linalg as spla

from sgdsweep.core.noise_types import NOISE, select

#: Largest number of entries of M (N²) solved with a dense factorisation (2500: 50 MB a matrix).
DIRECT_MAX_UNKNOWNS = 2500

#: Name of the formula, stored in the ``attrs`` of theory columns.
FORMULA = (
    "exact discrete-time stationary second moment of w - w_hat for minibatch SGD on finite-data "
    "linear regression with heavy-ball momentum: the linear system Z = B Z B^T + lr^2 "
    "[[E(AMA) - HMH + C, 0], [0, 0]] (sgdsweep.theory.linear, docs/physics.md §2)"
)


#: Noise types whose stationary second moment this module gives exactly. ``gaussian_matched``
#: and ``student_t`` draw noise of the minibatch covariance at the current weights, and for a
#: quadratic loss E[C(w)] = E[AMA] − HMH + C exactly: they share ``minibatch``'s answer.
#: They are the types whose steps are independent (every type but ``epoch``).
NOISE_TYPES = select(independent_steps=True)


class LinearData(Protocol):
    """What the exact theory reads of a finite linear-regression data set: P samples ``x``
    (P × N), their uncentred moment ``sxx`` = XᵀX/P (N × N), the residuals at the minimiser
    (P × outputs), the loss there, the label noise σ_ε, and the isotropic noise variance matched
    to a batch size. :class:`sgdsweep.models.affine.LinearData` is one; the theory supports one
    output without metric or offsets (``None``)."""

    n_samples: int
    n_inputs: int
    n_outputs: int
    x: np.ndarray
    sxx: np.ndarray
    residual: np.ndarray
    loss_min: float
    label_noise: float
    metric: np.ndarray | None
    offsets: np.ndarray | None

    def gaussian_noise_var(self, batch_size: int) -> float:
        """Per-coordinate variance of ``gaussian`` noise matched to the minibatch trace."""


def _scheme(noise: str) -> str:
    """How the multiplicative term E[AMA] arises: 'without', 'with' (replacement) or 'none'
    (noise not matched to the per-sample gradients: isotropic ``gaussian``)."""
    if noise in NOISE_TYPES:
        kind = NOISE[noise]
        return "none" if not kind.matched else "with" if kind.replacement else "without"
    raise ValueError(f"noise {noise!r}: no exact linear-regression theory (it covers "
                     + ", ".join(NOISE_TYPES) + ")")


def _single_output(data: LinearData) -> None:
    if data.n_outputs != 1 or data.metric is not None or data.offsets is not None:
        raise ValueError("the exact theory is implemented for one output without metric or offsets")


def noise_covariance(data: LinearData, batch_size: int, noise: str) -> np.ndarray:
    """Per-step gradient-noise covariance C = Cov[g_B − ∇L] at the minimiser, shape (N, N).

    ``label``: σ_ε² H / S (fresh label noise on a noiseless teacher); ``gaussian``: the isotropic
    per-coordinate variance matched to the minibatch trace, times I.
    """
    _single_output(data)
    scheme = _scheme(noise)
    p, s = data.n_samples, batch_size
    if noise == "label":
        return data.label_noise**2 * data.sxx / s
    if noise == "gaussian":
        return data.gaussian_noise_var(s) * np.eye(data.n_inputs)
    r = data.residual[:, 0]
    g = (data.x * r[:, None] ** 2).T @ data.x / p
    return g * (p - s) / (s * (p - 1)) if scheme == "without" else g / s


def _fluctuation_op(data: LinearData, batch_size: int, noise: str):
    """The map M ↦ E[(A − H) M (A − H)] = E[AMA] − HMH (matrix-free)."""
    scheme = _scheme(noise)
    without = scheme == "without"
    x, h, p, s = data.x, data.sxx, data.n_samples, batch_size

    def apply(m: np.ndarray) -> np.ndarray:
        q = np.einsum("pi,ij,pj->p", x, m, x)
        f = (x * q[:, None]).T @ x / p
        hmh = h @ m @ h
        if scheme == "none":
            return np.zeros_like(m)
        if without:
            eama = f / s + (1.0 - 1.0 / s) * (p * hmh - f) / (p - 1)
        else:
            eama = f / s + (1.0 - 1.0 / s) * hmh
        return eama - hmh

    return apply


def batch_product(data: LinearData, m: np.ndarray, batch_size: int, noise: str = "minibatch") -> np.ndarray:
    """E[A M A] over the minibatch second moments A = X_BᵀX_B/S of one step (N × N): the term
    the papers' fluctuation–dissipation relation drops (theory.fdr)."""
    h = data.sxx
    return _fluctuation_op(data, batch_size, noise)(m) + h @ m @ h


def _fluctuation_matrix(data: LinearData, batch_size: int, noise: str) -> np.ndarray:
    """Dense N²×N² matrix of :func:`_fluctuation_op` acting on row-major vec(M)."""
    scheme = _scheme(noise)
    without = scheme == "without"
    x, h, p, s = data.x, data.sxx, data.n_samples, batch_size
    n = data.n_inputs
    if scheme == "none":
        return np.zeros((n * n, n * n))
    xx = (x[:, :, None] * x[:, None, :]).reshape(p, n * n)
    f4 = xx.T @ xx / p
    hh = np.kron(h, h)
    if without:
        eama = f4 / s + (1.0 - 1.0 / s) * (p * hh - f4) / (p - 1)
    else:
        eama = f4 / s + (1.0 - 1.0 / s) * hh
    return eama - hh


def _deterministic_terms(data: LinearData, lr: float,
                         momentum: float) -> tuple[float, list[tuple[float, np.ndarray, np.ndarray]]]:
    """The noiseless part of the stationarity equation for M alone, L₀(M) = g M + Σ c X M Yᵀ,
    as (g, [(c, X, Y), …]) (see :func:`stationary_second_moment`)."""
    n = data.n_inputs
    eye = np.eye(n)
    a = (1.0 + momentum) * eye - lr * data.sxx
    if momentum == 0.0:
        return 1.0, [(-1.0, a, a)]
    g = 1.0 - momentum * momentum
    a2 = a @ a
    return g, [(-(1.0 + momentum * momentum) / g, a, a), (momentum / g, a2, eye), (momentum / g, eye, a2)]


def _solve_symmetric(g: float, terms: list[tuple[float, np.ndarray, np.ndarray]], fl: np.ndarray,
                     rhs: np.ndarray) -> np.ndarray:
    """The symmetric solution M (n × n) of ``g M + Σ c X M Yᵀ − F(M) = R`` for the ``terms``
    (c, X, Y), F the n²×n² matrix ``fl`` acting on row-major vec(M), R = ``rhs`` symmetric (the
    left side maps symmetric M to symmetric matrices).

    Solved densely on the n(n+1)/2 entries i ≥ j, never forming the n²×n² system: the unknown
    (c, e) stands for M_ce = M_ec, so its coefficient in equation (a, b) from X M Yᵀ is
    X_ac Y_be + X_ae Y_bc (once on the diagonal c = e), and likewise for F
    (tests/theory/test_theory_linear.py checks M against brute force).
    """
    n = rhs.shape[0]
    i, j = np.tril_indices(n)
    off = (i != j).astype(float)
    # built in place from F on, with two scratch arrays: at N = 50 each (unknowns)² array is
    # 13 MB, and the shard's peak RSS (4,096 replicas) was 24 MB higher with temporaries
    vec, swap = i * n + j, j * n + i
    op = fl[np.ix_(vec, swap)]
    op *= off
    op += fl[np.ix_(vec, vec)]
    op *= -1.0
    op[np.diag_indices_from(op)] += g
    first, second = np.empty_like(op), np.empty_like(op)  # reused by every term
    for c, x, y in terms:
        xi, yj = x[i], y[j]
        for cols_x, cols_y, weight in ((i, j, c), (j, i, c * off)):  # X_ac Y_be, then X_ae Y_bc
            np.take(xi, cols_x, axis=1, out=first)
            np.take(yj, cols_y, axis=1, out=second)
            first *= second
            first *= weight
            op += first
    del first, second
    m = np.empty((n, n))
    m[i, j] = m[j, i] = np.linalg.solve(op, rhs[i, j])
    return m


def stationary_second_moment(data: LinearData, lr: float, batch_size: int, momentum: float = 0.0,
                             noise: str = "minibatch", noise_gain: float = 1.0) -> np.ndarray:
    """Exact stationary E[(w − ŵ)(w − ŵ)ᵀ] of SGD, shape (N, N).

    The 2N×2N stationarity equation of the module docstring is solved for M alone. With
    Ā = (1 + μ) I − λH (symmetric), its off-diagonal block reads K + μKᵀ = Ā M, so
    K = (Ā M − μ M Ā)/(1 − μ²) and its top-left block becomes, with g = 1 − μ²,

        g M − ((1 + μ²)/g) Ā M Ā + (μ/g)(Ā² M + M Ā²) − λ² (E[AMA] − HMH) = λ² C,

    N(N+1)/2 unknowns instead of N(2N+1) (at N = 10 with momentum 55 against 210; μ = 0 gives
    M − Ā M Ā − λ²(E[AMA] − HMH) = λ² C as before).

    Args:
        data: the data set.
        lr: learning rate λ (> 0).
        batch_size: minibatch size S (1 <= S <= P).
        momentum: heavy-ball μ in [0, 1).
        noise: one of :data:`NOISE_TYPES`.
        noise_gain: multiplies the noise terms λ²(E[AMA] − HMH + C). 1 for SGD; λ_sgd/dt for
            the Euler–Maruyama SDE with step dt (then pass lr = dt), whose noise is √(dt λ_sgd) ξ.

    Returns:
        M, symmetric. All entries are ``inf`` when no stationary state exists (the second
        moment diverges: λ beyond the stability limit of the noisy dynamics).
    """
    n = data.n_inputs
    scale = lr * lr * noise_gain
    rhs = scale * noise_covariance(data, batch_size, noise)
    g, terms = _deterministic_terms(data, lr, momentum)
    if n * n <= DIRECT_MAX_UNKNOWNS:
        m = _solve_symmetric(g, terms, scale * _fluctuation_matrix(data, batch_size, noise), rhs)
    else:
        fl_op = _fluctuation_op(data, batch_size, noise)

        def matvec(v: np.ndarray) -> np.ndarray:
            mm = v.reshape(n, n)
            out = g * mm + sum(c * x @ mm @ y.T for c, x, y in terms) - scale * fl_op(mm)
            return out.ravel()

        lin = spla.LinearOperator((n * n, n * n), matvec=matvec, dtype=float)
        sol, info = spla.gmres(lin, rhs.ravel(), rtol=1e-12, atol=0.0, restart=200, maxiter=2000)
        if info != 0:
            raise RuntimeError(f"GMRES did not converge (info={info}) for lr={lr}, "
                               f"batch_size={batch_size}, momentum={momentum}")
        m = sol.reshape(n, n)
    m = 0.5 * (m + m.T)
    if not np.all(np.isfinite(m)) or np.any(np.linalg.eigvalsh(m) < -1e-12 * abs(np.trace(m))):
        # a negative "second moment" means the linear system has no stationary solution
        return np.full((n, n), np.inf)
    return m


def weight_var(m: np.ndarray) -> float:
    """Mean per-coordinate variance Tr(M)/N."""
    return float(np.trace(m) / m.shape[0])


def training_loss(data: LinearData, m: np.ndarray) -> float:
    """Stationary E[L(w)] = L(ŵ) + ½ Tr(H M) (exact for the quadratic loss); inf without a stationary state."""
    if not np.all(np.isfinite(m)):
        return float("inf")
    return float(data.loss_min + 0.5 * np.sum(data.sxx * m))
