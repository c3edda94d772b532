"""``quadratic``: L = ½ wᵀKw with additive gradient noise (docs/physics.md §1, Liu, Ziyin & Ueda 2021).

Options: ``curvatures`` — the eigenvalues of the Hessian K (K = diag(curvatures), units
1/step-size); ``noise_cov`` — the per-sample gradient-noise covariance C, either a list (its
diagonal) or a full symmetric positive-definite matrix (which need not commute with K). A step
adds noise ξ with Cov ξ = C / batch_size to the gradient: ``gaussian`` draws it Gaussian,
``student_t`` Student-t with ν = 4 scaled to the same covariance. The minimum is w = 0.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.core.noise_types import DATA_FREE_NOISE
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models.base import Layer, Problem

if TYPE_CHECKING:
    from sgdsweep.models.predict import Prediction

AXES = ("lr", "batch_size", "momentum", "noise")
OPTIONS: dict[str, Any] = {"curvatures": [1.0], "noise_cov": [1.0]}
#: no data set: the noise types drawn with the model's own covariance C/S
NOISE_TYPES = DATA_FREE_NOISE


class QuadraticProblem(Problem):
    """See the module docstring."""

    kind = "quadratic"
    noise_types = NOISE_TYPES
    kernel = "additive"

    def __init__(self, curvatures: tuple[float, ...], noise_cov: np.ndarray) -> None:
        self.k = np.asarray(curvatures, dtype=np.float64)
        self.dim = self.k.size
        self.hessian = np.diag(self.k)
        self.noise_cov = noise_cov
        self.noise_chol = np.linalg.cholesky(noise_cov)
        self.w_min = np.zeros(self.dim)
        self.layers = (Layer("w", 0, 1, self.dim),)
        #: the gradient k·w as per-coordinate polynomial coefficients (w, w², w³): sgdsweep.sim.kernels.additive
        self.polynomial = (self.k, np.zeros(self.dim), np.zeros(self.dim))

    def grad(self, w, idx=None, label_eps=None):
        return w * self.k

    def loss(self, w):
        return 0.5 * np.einsum("ld,d,ld->l", w, self.k, w)

    def curvatures(self):
        return np.sort(self.k)

    def describe(self) -> dict[str, Any]:
        return {"loss_min": 0.0, "curvature_min": float(self.k.min()), "curvature_max": float(self.k.max())}


def noise_matrix(value: Any, dim: int) -> np.ndarray:
    """``noise_cov`` as a d × d matrix (a list is its diagonal)."""
    arr = np.asarray(value, dtype=np.float64)
    return np.diag(arr) if arr.ndim == 1 else arr


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "quadratic", "curvatures": list(params["curvatures"]),
            "noise_cov": params["noise_cov"]}


def check_point(params: Mapping[str, Any], where: PointName) -> None:
    k = np.asarray(params["curvatures"], dtype=float)
    if k.ndim != 1 or k.size == 0 or np.any(k <= 0):
        raise ConfigError("model.curvatures", params["curvatures"], "a non-empty list of positive numbers",
                          "These are the Hessian's eigenvalues k; the minimum must be strict.")
    try:
        c = np.asarray(params["noise_cov"], dtype=float)
    except ValueError:  # rows of different lengths, or numbers mixed with rows
        c = np.zeros(0)
    shape_ok = (c.ndim == 1 and c.size == k.size) or (c.ndim == 2 and c.shape == (k.size, k.size))
    if not shape_ok:
        raise ConfigError("model.noise_cov", params["noise_cov"],
                          f"a list of {k.size} variances or a {k.size}×{k.size} symmetric matrix",
                          "It must match model.curvatures in size.")
    m = noise_matrix(params["noise_cov"], k.size)
    if not np.allclose(m, m.T) or np.linalg.eigvalsh(0.5 * (m + m.T)).min() <= 0:
        raise ConfigError("model.noise_cov", params["noise_cov"], "a symmetric positive-definite matrix",
                          "A covariance needs positive eigenvalues (Cholesky factor for the noise).")


@functools.lru_cache(maxsize=16)
def _make(curvatures: tuple[float, ...], noise_cov: tuple) -> QuadraticProblem:
    return QuadraticProblem(curvatures, noise_matrix(np.array(noise_cov), len(curvatures)))


def _as_tuple(value: Any) -> tuple:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else float(value)


def make_problem(dparams: Mapping[str, Any]) -> QuadraticProblem:
    return _make(_as_tuple(dparams["curvatures"]), _as_tuple(dparams["noise_cov"]))


def theory(problem: QuadraticProblem, params: Mapping[str, Any], pred: Prediction, step: float,
           gain: float) -> None:
    """The exact discrete-time stationary covariance (discrete Lyapunov equation with momentum)
    and loss for the per-step noise covariance C/S (times ``gain`` under the SDE, whose step is
    ``step``); H and C/S for the approximations."""
    from sgdsweep.theory import quadratic as quadratic_theory

    s, mu = params["batch_size"], params["momentum"]
    c = problem.noise_cov / s * gain
    pred.weight_cov = quadratic_theory.stationary_covariance(problem.hessian, c, step, mu)
    pred.loss = quadratic_theory.training_loss(problem.hessian, c, step, mu)
    pred.formulas["weight_cov"] = quadratic_theory.FORMULA["stationary_covariance"]
    pred.formulas["loss"] = quadratic_theory.FORMULA["training_loss"]
    pred.hessian, pred.noise_cov = problem.hessian, problem.noise_cov / s


def stability_edge(problem: QuadraticProblem, params: Mapping[str, Any], axis: str) -> dict[str, Any] | None:
    """The exact edge along ``axis`` (``lr`` or ``momentum``): the additive noise leaves the mean
    dynamics in charge, 0 < λk < 2(1 + μ) for every curvature k (Liu et al. Cor. 1;
    :func:`sgdsweep.theory.edge.quadratic_edge`). Plain SGD steps only (None for the SDE)."""
    from sgdsweep.theory import edge

    if params.get("method", "sgd") != "sgd":
        return None
    return edge.quadratic_edge(problem.k, axis, params["lr"], params["momentum"])
