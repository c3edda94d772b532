"""Exact mean escape time of the discrete-time SGD chain at any learning rate (docs/physics.md §6).

With step noise of a known law, SGD without momentum is a Markov chain: one update maps w to
``w′ = w − λ(∇L(w) + ξ)``, so its one-step kernel ``K(w, w′)`` is the density of that w′. The
mean number of updates until the chain first satisfies the escape criterion, started at w,
solves

    τ(w) = 1 + ∫_{w′ not escaped} K(w, w′) τ(w′) dw′,

exactly, with no continuous-time limit. This module solves it on a grid and returns τ at the
starting point, in *updates of the chain* (for the SDE integrator, substeps).

**Which τ:** the escape criterion the measurement uses (sgdsweep.models.landscape), checked
after every update, so τ counts the update that crosses: the double well has escaped when
``w ≥`` its second minimum; the thesis landscape when ``(w − saddle)·n > 0`` (n the saddle's
unstable direction, pointing to the other basin).

**1-D (double well).** Cells of width h on ``[lo, threshold)``; ``K_ij`` is the probability
that w′ lands in cell j from the centre of cell i (differences of the noise's CDF: Gaussian, or
Student-t with ν = 4 scaled to the same variance, as :mod:`sgdsweep.sim.noise` draws it); the mass
below ``lo`` is put in the first cell, the mass at or above the threshold escapes. Dense solve.

**2-D (thesis landscape).** Coordinates u = (w − saddle)·n ≤ 0 and v along the separatrix; a
tensor grid of cell centres (the boundary u = 0 is a cell edge); ``K_ij`` = the Gaussian density
of w′ at node j times the cell area, each row scaled so that it sums to the exact probability of
*not* escaping, ``Φ(−μ_u/σ_u)`` (the projection of a Gaussian on n is Gaussian), so the leak
over the separatrix — which sets τ — is exact per node and only its distribution over the
remaining nodes is discretised (the scaling is done in log space, so a node whose kernel lands
far outside the box keeps a finite row, its mass on the nearest nodes). The covariance is
state-dependent for ``gaussian_matched`` (the minibatch covariance of the per-sample gradients
at w). Sparse solve (scipy.sparse).

**Resolution.** Each problem is solved on a grid and on one refined by a factor r per axis
(2 in 1-D, √2 in 2-D), refining until ``|τ_fine − τ_coarse|/τ_fine`` is below ``rtol``
(default 1 %). The scheme is second order in h, so the error of τ_fine is ``Δ/(r² − 1)`` — a
third of the difference in 1-D, equal to it in 2-D. In 1-D the returned τ is Richardson's
extrapolation ``τ_fine + Δ/3`` (at λ = 0.1 on a double well, 0.01 % from a solve refined to
0.1 %, where τ_fine was 0.23 % low); in 2-D τ_fine is returned.

**The 2-D box.** The box (:func:`box_2d`) comes from the local quadratic approximation at the
start, which can miss how far a state-dependent noise carries the chain. On the first grid it is
grown :data:`BOX_GROWTH` times per axis, away from the separatrix, until growing it once more changes τ by less than
a quarter of ``rtol``; that change is reported with the result.

**Precision.** A solve whose rounding could change τ by more than :data:`MAX_ROUNDING_ERROR`
(:func:`_check_precision`: about τ > 2·10¹² updates, or nodes that nearly keep all their
probability), or that gives any τ below 1, raises :class:`ResolutionError` rather than return a
number LU cannot vouch for.

Momentum makes the chain 2-D per parameter (w and the velocity); it is not solved here (the
caller records why).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import scipy.special

from sgdsweep.core.noise_types import MINIBATCH_NOISE, NOISE

#: Degrees of freedom of ``student_t`` noise (the registry's).
STUDENT_NU: int = NOISE["student_t"].nu

FORMULA = (
    "mean first-passage time of the discrete SGD chain itself, tau(w) = 1 + int_{not escaped} "
    "K(w,w') tau(w') dw' with the one-step kernel K of w' = w - lr (grad L(w) + xi), solved on a grid "
    "(exact at any lr; no continuous-time limit), in steps, from the start point to the escape "
    "criterion the measurement uses")
#: what the approximation column for sampled noise on the thesis landscape is
MATCHED_FORMULA = (
    "approximation: the exact discrete-chain escape time of the Gaussian-matched chain (step noise "
    "N(0, C(w)), C(w) the minibatch covariance of the per-sample gradients at w) standing in for "
    "the sampled minibatch noise, which has the same covariance but not the same law")
#: largest grid (cells) of one solve
MAX_CELLS_1D = 4096
MAX_NODES_2D = 9000
#: the 2-D box grows by this factor per axis until growing changes τ by less than BOX_SHARE × rtol
BOX_GROWTH, BOX_SHARE = 1.3, 0.25
#: kernel fill (nonzeros over N²) above which the 2-D system is solved dense
DENSE_FILL = 0.1


#: Largest bound on the relative error of τ that rounding in the linear solve may cause
#: (:func:`_check_precision`): a tenth of the default grid tolerance (1 %).
MAX_ROUNDING_ERROR = 1e-3


class ResolutionError(RuntimeError):
    """No escape time to the requested accuracy: the grid needed exceeds the node budget, or the
    linear system cannot be solved to that accuracy in double precision."""


def _check_precision(a_norm: float, tau: np.ndarray, tau_start: float, grid: str) -> None:
    """Refuse a τ that rounding in the solve of ``(I − K) τ = 1`` may have spoiled.

    I − K is an M-matrix (K ≥ 0, rows summing to at most 1, up to rounding where the chance of
    escaping rounds to 0), so its inverse is non-negative and ``‖(I − K)⁻¹‖∞ = max τ``: the
    condition number is ``κ = ‖I − K‖∞ · max τ`` (to rounding). A
    backward-stable solve then bounds the error of any node's τ by ``ε κ max τ``; relative to the
    start's τ that is ``ε ‖I − K‖∞ (max τ)² / τ_start``. Above :data:`MAX_ROUNDING_ERROR` the
    computed τ is refused: the chain leaves its basin too slowly (or some nodes nearly keep their
    probability) for an exact value in double precision. So is any τ below 1 or not finite, which
    the exact solution never has (each τ counts at least the update that escapes): a solve of a
    system singular to working precision can return one, even a negative one. ``a_norm`` is ‖I − K‖∞;
    ``tau`` the nodes' τ; ``grid`` names the grid for the message."""
    why = ("the chain escapes far more slowly than any run could measure, or some of its nodes nearly keep all "
           "their probability: no exact escape time")
    if not (tau_start >= 1.0 and np.all(tau >= 1.0)):
        raise ResolutionError(f"on a {grid} grid the linear system is singular to working precision (its solve "
                              f"gave escape times below one update, the least possible): {why}")
    top = float(np.max(tau))
    bound = np.finfo(float).eps * a_norm * top * top / tau_start
    if not bound <= MAX_ROUNDING_ERROR:
        raise ResolutionError(
            f"on a {grid} grid the linear system is too close to singular for double precision (escape times "
            f"of some nodes near {top:.1g} updates, where rounding could change the start's by a relative "
            f"{bound:.2g}, above {MAX_ROUNDING_ERROR:g}): {why}")


@dataclasses.dataclass(frozen=True)
class ExactEscape:
    """Result of one exact escape-time computation.

    Attributes:
        steps: mean number of chain updates from the start until escape (≥ 1).
        nodes: grid nodes per axis of the returned (finer) solve.
        spacing: cell widths per axis (the model's weight units).
        error: ``|τ_fine − τ_coarse|/τ_fine`` of the last refinement (the estimated relative
            discretisation error; see the module docstring).
        box_change: 2-D only, the relative change of τ (on the first grid) in a box
            :data:`BOX_GROWTH` times longer per axis: the estimated error from cutting the plane to a box
            (None in 1-D).
    """

    steps: float
    nodes: tuple[int, ...]
    spacing: tuple[float, ...]
    error: float
    box_change: float | None = None

    def describe(self) -> str:
        grid = " x ".join(str(n) for n in self.nodes)
        width = ", ".join(f"{h:.3g}" for h in self.spacing)
        box = "" if self.box_change is None else (
            f", a box {BOX_GROWTH:g} times longer per axis by {100 * self.box_change:.2f} %")
        return (f"grid {grid} cells of width {width}; refinement changed tau by "
                f"{100 * self.error:.2f} %{box}")


# ---------------------------------------------------------------------------------------------
# one dimension
# ---------------------------------------------------------------------------------------------

def _noise_cdf(noise: str) -> Callable[[np.ndarray], np.ndarray]:
    """CDF of the standardised step noise (unit variance)."""
    if noise == "gaussian":
        return scipy.special.ndtr
    if noise == "student_t":
        c = math.sqrt((STUDENT_NU - 2) / STUDENT_NU)  # z·√((ν−2)/χ²_ν) = c·t_ν
        return lambda x: scipy.special.stdtr(STUDENT_NU, x / c)
    raise ValueError(f"noise must be 'gaussian' or 'student_t' for the 1-D chain, got {noise!r}")


def solve_1d(drift: Callable[[np.ndarray], np.ndarray], step: float, noise_std: float, noise: str,
             lo: float, threshold: float, start: float, cells: int) -> float:
    """τ(start) of ``w′ = w − step·(drift(w) + noise_std·ξ)`` on ``cells`` cells of ``[lo, threshold)``.

    ``drift`` is the gradient (vectorised), ``ξ`` has unit variance (``noise``: gaussian or
    student_t). Escape: ``w′ ≥ threshold``. Mass below ``lo`` goes to the first cell.
    """
    cdf = _noise_cdf(noise)
    width = step * noise_std
    edges = np.linspace(lo, threshold, cells + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])

    def row(w: np.ndarray) -> np.ndarray:
        mean = w - step * drift(w)
        f = cdf((edges[None, :] - mean[:, None]) / width)
        k = np.diff(f, axis=1)
        k[:, 0] += f[:, 0]
        return k

    k = row(centres)
    a = -k
    a[np.diag_indices_from(a)] += 1.0
    tau = np.linalg.solve(a, np.ones(cells))
    tau_start = float(1.0 + row(np.array([float(start)]))[0] @ tau)
    _check_precision(float(np.abs(a).sum(axis=1).max()), tau, tau_start, f"{cells}-cell")
    return tau_start


def double_well(problem, step: float, noise_var: float, noise: str = "gaussian", start: float = 0.0,
                rtol: float = 0.01, lo: float | None = None) -> ExactEscape:
    """Exact escape time (in updates) of the double well (sgdsweep.models.landscape.DoubleWell).

    ``step``: the update's step size λ (dt for the SDE); ``noise_var``: the variance of the noise
    added to the gradient per update (σ²/S, times the SDE's gain); ``noise``: gaussian or
    student_t; escape at ``w ≥ problem.escape_threshold``. ``lo`` (default: far enough left
    that the chain never gets there, from the discrete stationary variance at the minimum)
    is the left end of the grid. Raises :class:`ResolutionError` when ``rtol`` needs more than
    :data:`MAX_CELLS_1D` cells.
    """
    threshold = float(problem.escape_threshold)
    std = math.sqrt(noise_var)
    width = step * std
    lk = step * problem.k_min
    if not 0.0 < lk < 2.0:
        raise ValueError(f"lr * curvature_min = {lk:.3g}: the minimum is unstable (needs 0 < λk_a < 2)")
    sd_stat = width / math.sqrt(lk * (2.0 - lk))
    if lo is None:
        tails = 4.0 if noise == "gaussian" else 25.0  # Student-t (ν = 4) jumps are heavy-tailed
        lo = start - 8.0 * sd_stat - tails * width
        lo = min(lo, start - problem.saddle)
    cells = max(200, math.ceil((threshold - lo) / (0.5 * width)))
    previous = None
    while cells <= MAX_CELLS_1D:
        tau = solve_1d(problem.grad, step, std, noise, lo, threshold, start, cells)
        if previous is not None:
            error = abs(tau - previous) / tau
            if error < rtol:  # second order in the cell width: Richardson's extrapolation adds Δ/3
                return ExactEscape(tau + (tau - previous) / 3.0, (cells,), ((threshold - lo) / cells,), error)
        previous = tau
        cells *= 2
    raise ResolutionError(f"the double well needs more than {MAX_CELLS_1D} cells for a "
                          f"{100 * rtol:g} % error at step {step:g}")


# ---------------------------------------------------------------------------------------------
# two dimensions (thesis landscape)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Chain2D:
    """A 2-D chain ``w′ ~ N(w − step·grad(w), cov(w))`` with escape at ``(w − origin)·normal > 0``.

    ``grad(w)``: (N, 2) → (N, 2); ``cov(w)``: (N, 2) → (N, 2, 2), the covariance of w′ (already
    including step²); ``start``: (2,).
    """

    grad: Callable[[np.ndarray], np.ndarray]
    cov: Callable[[np.ndarray], np.ndarray]
    step: float
    origin: np.ndarray
    normal: np.ndarray
    start: np.ndarray

    @property
    def tangent(self) -> np.ndarray:
        return np.array([-self.normal[1], self.normal[0]])

    def to_uv(self, w: np.ndarray) -> np.ndarray:
        d = w - self.origin
        return np.stack([d @ self.normal, d @ self.tangent], axis=-1)

    def from_uv(self, uv: np.ndarray) -> np.ndarray:
        return self.origin + uv[..., :1] * self.normal + uv[..., 1:] * self.tangent


def _rows(chain: Chain2D, points: np.ndarray, nodes_uv: np.ndarray,
          cutoff: float = 1e-13) -> scipy.sparse.csr_matrix:
    """Kernel rows (sparse) from ``points`` (w coordinates) to the grid nodes (u, v).

    Each row is the Gaussian density of w′ at the nodes normalised to the exact probability of
    not escaping, so the density's constant factor (and the cell area) cancels: it is taken in
    log space relative to the row's largest value, which keeps a kernel centred far outside the
    box (all densities below the smallest float) finite — its mass then goes to the nodes
    nearest its mean in the kernel's own metric. Entries below ``cutoff`` times the row's sum
    are dropped and the rest rescaled to the probability of not escaping: the dropped mass stays
    in the basin, on the kept nodes, rather than leaking as a spurious escape (which would cap τ
    near 1/(dropped mass), about 10¹² updates).
    """
    mean = chain.to_uv(points - chain.step * chain.grad(points))
    rot = np.stack([chain.normal, chain.tangent])
    cov = np.einsum("ij,njk,lk->nil", rot, chain.cov(points), rot)
    cov = cov + 1e-12 * np.trace(cov, axis1=1, axis2=2)[:, None, None] * np.eye(2)
    det = cov[:, 0, 0] * cov[:, 1, 1] - cov[:, 0, 1] ** 2
    if not np.all(det > 0):  # NaN too
        raise ResolutionError("the step noise is zero at some nodes (with batch_size equal to the number of "
                              "samples every update is the full gradient): the chain never escapes by noise, "
                              "so it has no escape time")
    i00, i01, i11 = cov[:, 1, 1] / det, -cov[:, 0, 1] / det, cov[:, 0, 0] / det  # the inverse covariance
    stay = scipy.special.ndtr(-mean[:, 0] / np.sqrt(cov[:, 0, 0]))
    rows, cols, vals = [], [], []
    for start in range(0, len(points), 256):
        sl = slice(start, start + 256)
        d0 = nodes_uv[None, :, 0] - mean[sl, 0:1]
        d1 = nodes_uv[None, :, 1] - mean[sl, 1:2]
        q = i00[sl, None] * d0 * d0 + 2.0 * i01[sl, None] * d0 * d1 + i11[sl, None] * d1 * d1
        dens = np.exp(-0.5 * (q - q.min(axis=1, keepdims=True)))  # largest entry of each row: 1
        r, c = np.nonzero(dens > cutoff * dens.sum(axis=1)[:, None])  # row by row, as csr_matrix wants
        kept = dens[r, c]
        kept_sum = np.bincount(r, weights=kept, minlength=dens.shape[0])
        rows.append(start + r)
        cols.append(c)
        vals.append(kept * (stay[start + r] / kept_sum[r]))
    return scipy.sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                   shape=(len(points), len(nodes_uv)))


def _trapped_nodes(a: scipy.sparse.csc_matrix) -> int:
    """How many nodes the chain cannot leave in one step as the grid resolves its kernel: zero rows
    of ``a`` = I − K, nodes whose one kernel entry is themselves at probability 1 in floating point
    (the kernel is far narrower than a cell there, and the chance of escaping underflows). Each
    makes the system singular."""
    return int(np.count_nonzero(np.bincount(a.indices[a.data != 0], minlength=a.shape[0]) == 0))


def solve_2d(chain: Chain2D, box: tuple[float, float, float], n_u: int, n_v: int) -> float:
    """τ(start) of ``chain`` on the box ``u ∈ [u_lo, 0]``, ``v ∈ [v_lo, v_hi]`` (``box`` =
    (u_lo, v_lo, v_hi)) with ``n_u × n_v`` cells, nodes at the cell centres."""
    u_lo, v_lo, v_hi = box
    hu, hv = -u_lo / n_u, (v_hi - v_lo) / n_v
    u = u_lo + (np.arange(n_u) + 0.5) * hu
    v = v_lo + (np.arange(n_v) + 0.5) * hv
    uv = np.stack(np.meshgrid(u, v, indexing="ij"), -1).reshape(-1, 2)
    k = _rows(chain, chain.from_uv(uv), uv)
    a = scipy.sparse.identity(len(uv), format="csc") - k.tocsc()
    trapped = _trapped_nodes(a)
    if trapped:  # I − K has zero rows: singular, and LAPACK or SuperLU would be handed it
        raise ResolutionError(f"the chain on a {n_u} × {n_v} grid cannot leave {trapped} of its nodes (its step "
                              "kernel there is far narrower than a cell, so each keeps all its probability; the "
                              "linear system is singular): no escape time on this grid")
    if k.nnz > DENSE_FILL * len(uv) ** 2:  # a wide kernel: LU of the dense matrix is faster
        tau = np.linalg.solve(a.toarray(), np.ones(len(uv)))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.sparse.linalg.MatrixRankWarning)  # checked below
            try:
                tau = scipy.sparse.linalg.spsolve(a, np.ones(len(uv)))
            except RuntimeError:  # SuperLU gives up on some wide kernels: LU of the dense matrix
                tau = np.linalg.solve(a.toarray(), np.ones(len(uv)))
    k0 = _rows(chain, chain.start[None, :], uv)
    tau_start = float(1.0 + (k0 @ tau)[0])
    _check_precision(float(abs(a).sum(axis=1).max()), tau, tau_start, f"{n_u} × {n_v}")
    return tau_start


def box_2d(chain: Chain2D, hessian: np.ndarray, width: float = 9.0) -> tuple[float, float, float]:
    """A box (u_lo, v_lo, v_hi) that holds the start's basin: ``width`` stationary standard
    deviations (discrete chain, local quadratic approximation at the start) around the start,
    and the saddle (u = v = 0) with the kernel's width around it."""
    from sgdsweep.theory.quadratic import stationary_covariance

    c0 = chain.cov(chain.start[None, :])[0] / chain.step**2
    sigma = stationary_covariance(hessian, c0, chain.step, 0.0)
    if not np.all(np.isfinite(sigma)):
        top = float(np.linalg.eigvalsh(hessian)[-1])
        raise ValueError(f"the step λ = {chain.step:g} is unstable at the start's minimum (λ times the "
                         f"Hessian's largest eigenvalue there, {top:.4g}, is {chain.step * top:.3g}, at least 2): "
                         "the chain leaves at once, with no basin to escape from")
    rot = np.stack([chain.normal, chain.tangent])
    s_uv = np.sqrt(np.diag(rot @ sigma @ rot.T))
    k_uv = np.sqrt(np.diag(rot @ chain.cov(chain.origin[None, :])[0] @ rot.T))
    u0, v0 = chain.to_uv(chain.start)
    u_lo = min(u0 - width * s_uv[0], -width * k_uv[0])
    v_lo = min(v0 - width * s_uv[1], -width * k_uv[1])
    v_hi = max(v0 + width * s_uv[1], width * k_uv[1])
    return float(u_lo), float(v_lo), float(v_hi)


def _grid(box: tuple[float, float, float], hu: float, hv: float) -> tuple[int, int]:
    """Cells per axis of ``box`` with cells of about ``hu × hv`` (at least 8 per axis)."""
    u_lo, v_lo, v_hi = box
    return max(8, round(-u_lo / hu)), max(8, round((v_hi - v_lo) / hv))


def _settle_box(chain: Chain2D, box: tuple[float, float, float], n_u: int, n_v: int,
                tol: float) -> tuple[tuple[float, float, float], float, float]:
    """(box, τ on it, change): the first of ``box`` (``n_u × n_v`` cells) and boxes grown by
    :data:`BOX_GROWTH` per axis in whole cells of the same size (so that only the added region
    changes τ, not the discretisation) whose τ one more growth changes by less than ``tol``,
    and that relative change. The separatrix side (u = 0) stays."""
    hu, hv = -box[0] / n_u, (box[2] - box[1]) / n_v
    if n_u * n_v > MAX_NODES_2D:
        raise ResolutionError(f"the 2-D chain's first grid needs more than {MAX_NODES_2D} nodes")
    tau = solve_2d(chain, box, n_u, n_v)
    while True:
        add_u, add_v = max(1, round((BOX_GROWTH - 1) * n_u)), max(1, round((BOX_GROWTH - 1) * n_v / 2))
        wider = (box[0] - add_u * hu, box[1] - add_v * hv, box[2] + add_v * hv)
        if (n_u + add_u) * (n_v + 2 * add_v) > MAX_NODES_2D:
            raise ResolutionError(f"the start's basin and the way out of it do not fit a box of {MAX_NODES_2D} "
                                  f"nodes at the first grid's cells ({hu:.3g} x {hv:.3g}): a box "
                                  f"{BOX_GROWTH:g} times longer per axis still changed tau by more than "
                                  f"{100 * tol:g} %")
        tau_wide = solve_2d(chain, wider, n_u + add_u, n_v + 2 * add_v)
        change = abs(tau_wide - tau) / tau_wide
        if change < tol:
            return box, tau, change
        box, tau, n_u, n_v = wider, tau_wide, n_u + add_u, n_v + 2 * add_v


def chain_escape(chain: Chain2D, box: tuple[float, float, float], rtol: float = 0.01,
                 first: int = 1200) -> ExactEscape:
    """τ of ``chain`` to a relative error of about ``rtol``.

    On a first grid of about ``first`` nodes with cells of ``box``'s aspect ratio, the box is
    grown :data:`BOX_GROWTH` times per axis (:func:`_settle_box`) until growing it once more changes τ by less
    than :data:`BOX_SHARE` times ``rtol`` (the quadratic approximation that sets ``box`` misses a
    state-dependent noise's reach: on the thesis landscape with Gaussian-matched noise the box
    from it put τ 2.9 % high). Then the grid is refined by √2 per axis until two successive τ
    differ by less than ``rtol``."""
    u_lo, v_lo, v_hi = box
    aspect = (v_hi - v_lo) / -u_lo
    n_u = max(8, round(math.sqrt(first / aspect)))
    n_v = max(8, round(n_u * aspect))
    hu, hv = -u_lo / n_u, (v_hi - v_lo) / n_v
    box, previous, box_change = _settle_box(chain, box, n_u, n_v, BOX_SHARE * rtol)
    while True:
        hu, hv = hu / math.sqrt(2.0), hv / math.sqrt(2.0)
        n_u, n_v = _grid(box, hu, hv)
        if n_u * n_v > MAX_NODES_2D:
            raise ResolutionError(f"the 2-D chain needs more than {MAX_NODES_2D} nodes for a "
                                  f"{100 * rtol:g} % error")
        tau = solve_2d(chain, box, n_u, n_v)
        error = abs(tau - previous) / tau
        if error < rtol:
            return ExactEscape(tau, (n_u, n_v), (-box[0] / n_u, (box[2] - box[1]) / n_v), error, box_change)
        previous = tau


def thesis_chain(problem, step: float, batch_size: int, noise: str, gain: float = 1.0,
                 replace: bool = False) -> Chain2D:
    """The thesis landscape's chain (sgdsweep.models.landscape.Thesis): ``noise`` ``gaussian`` —
    isotropic N(0, v I) per update, v = problem.gaussian_noise_var(S) (the minibatch trace at the
    minimum over d) — or ``matched``: N(0, C(w)), C(w) = f·Σ_μ(g_μ − ḡ)(g_μ − ḡ)ᵀ/P the minibatch
    covariance at w (f = (P−S)/(S(P−1)), or 1/S with ``replace``). ``gain`` multiplies the noise
    variance (the SDE's λ/dt)."""
    p = problem.n_samples
    if noise == "gaussian":
        var = problem.gaussian_noise_var(batch_size) * gain

        def cov(w: np.ndarray) -> np.ndarray:
            return np.broadcast_to(step**2 * var * np.eye(2), (len(w), 2, 2))
    elif noise == "matched":
        f = 1.0 / batch_size if replace else (p - batch_size) / (batch_size * (p - 1))

        def cov(w: np.ndarray) -> np.ndarray:
            g = problem.sample_grads(w)
            g = g - g.mean(axis=1, keepdims=True)
            return step**2 * gain * f * np.einsum("npd,npe->nde", g, g) / p
    else:
        raise ValueError(f"noise must be 'gaussian' or 'matched', got {noise!r}")
    return Chain2D(problem.grad, cov, step, np.asarray(problem.saddle_point, float),
                   np.asarray(problem.normal, float), np.asarray(problem.w_min, float))


# ---------------------------------------------------------------------------------------------
# a point of a sweep
# ---------------------------------------------------------------------------------------------

#: sampled noise types whose Gaussian-matched chain is the approximation column
SAMPLED = MINIBATCH_NOISE


def for_point(params: Mapping[str, Any], column: str, solve: Callable[[float, float], ExactEscape],
              unsupported: str | None = None) -> tuple[str, ExactEscape | None, str]:
    """(column, result, note) for a landscape point whose model solves its own chain: ``solve(step,
    gain)`` returns the escape time in updates of the integrator (step λ, noise gain 1 for SGD; for
    the SDE its substep dt and gain λ/dt). ``column`` is ``exact``, or ``matched`` for the
    approximation standing in for sampled noise; ``unsupported`` says why the model has no kernel
    for the point's noise (None where it has one). The result is None when there is no prediction
    (momentum, ``unsupported``, or the solver failed), ``note`` then says why (else the formula and
    the grid). τ is returned in SGD steps (for the SDE, its substeps divided by their number per
    step)."""
    if params["momentum"] != 0:
        return column, None, ("with momentum the chain is 2-D per parameter (w and the velocity); "
                              "the exact escape time is computed for momentum 0 only")
    if unsupported is not None:
        return column, None, unsupported
    lr = float(params["lr"])
    if params["method"] == "sde":
        step = lr * float(params["dt_over_lr"])
        gain, substeps = lr / step, round(1.0 / float(params["dt_over_lr"]))
    else:
        step, gain, substeps = lr, 1.0, 1
    try:
        res = solve(step, gain)
    except (ResolutionError, ValueError, np.linalg.LinAlgError, MemoryError) as exc:
        return column, None, f"{type(exc).__name__}: {exc}"
    res = dataclasses.replace(res, steps=res.steps / substeps)
    head = MATCHED_FORMULA if column == "matched" else FORMULA
    return column, res, f"{head}; {res.describe()}"
