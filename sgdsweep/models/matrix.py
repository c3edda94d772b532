"""``matrix``: teacher–student ``f(x) = Z W x`` with fixed Z, only W learnt (docs/physics.md §5,
Park, Favoni, Lucini & Aarts 2024).

W and the target ``W_t = O diag(targets) Oᵀ`` are N × N (N = len(targets), O a fixed random
rotation: equal targets make a degenerate pair). Inputs x ~ N(0, I), P = round(N ·
samples_per_param) samples, labels ``y = W_t x``. Each sample carries a fixed symmetric noise
matrix a_μ (off-diagonal entries N(0, n_s²), diagonal N(0, 2n_s²), n_s = ``injected_noise``),
so the per-sample gradient is ``g_μ = ZᵀZ (W − W_t) x_μ x_μᵀ − a_μ`` and the noise a batch sees
is averaged over its S samples (σ² ∝ 1/S). ``z_matrix``: identity (the authors' code) or a
fixed random Gaussian matrix. The weights' singular values (their squares are the eigenvalues
of WᵀW) are what the random-matrix analysis histograms.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.core.noise_types import UNLABELLED_NOISE
from sgdsweep.errors import PointName
from sgdsweep.models.affine import AffineProblem
from sgdsweep.models.base import data_rng
from sgdsweep.models.linear import check_data
from sgdsweep.models.linear import n_samples as _n_samples

AXES = ("lr", "batch_size", "momentum", "samples_per_param", "noise")
OPTIONS: dict[str, Any] = {"targets": [2.0, 2.0], "z_matrix": "identity", "injected_noise": 0.1}
#: every type but fresh label noise (the labels have no noise to redraw)
NOISE_TYPES = UNLABELLED_NOISE
#: The fluctuation–dissipation observables of sampled batches (``dynamics.observe.gradient_noise``).
OBSERVES = frozenset({"gradient_noise"})
#: standard deviation of the entries of the random initial W (the authors' N(0, 0.1²))
INIT_STD = 0.1


class MatrixProblem(AffineProblem):
    """An :class:`AffineProblem` whose ``auto`` initialisation is random (see module docstring)."""

    auto_init = "random"

    def initial(self, how, rng):
        if how == "random":
            return INIT_STD * rng.standard_normal(self.dim)
        return super().initial(how, rng)


def n_samples(params: Mapping[str, Any]) -> int:
    return _n_samples({"n_inputs": len(params["targets"]), "samples_per_param": params["samples_per_param"]})


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "matrix", "seed": params["seed"], "targets": [float(t) for t in params["targets"]],
            "z_matrix": params["z_matrix"], "injected_noise": params["injected_noise"],
            "n_samples": n_samples(params)}


def check_point(params: Mapping[str, Any], where: PointName) -> None:
    check_data(params, n_samples(params), len(params["targets"]), where)


@functools.lru_cache(maxsize=8)
def _make(targets: tuple[float, ...], z_matrix: str, injected: float, p: int, seed: int) -> MatrixProblem:
    n = len(targets)
    rng = data_rng({"model": "matrix", "targets": list(targets), "z_matrix": z_matrix,
                    "injected_noise": injected, "n_samples": p, "seed": seed})
    o, _ = np.linalg.qr(rng.standard_normal((n, n)))
    w_t = o @ np.diag(targets) @ o.T
    z = np.eye(n) if z_matrix == "identity" else rng.standard_normal((n, n))
    x = rng.standard_normal((p, n))
    a = rng.standard_normal((p, n, n)) * injected
    a = (a + a.transpose(0, 2, 1)) / np.sqrt(2.0)  # symmetric: off-diagonal var n_s², diagonal 2n_s²
    problem = MatrixProblem("matrix", x, x @ w_t.T, metric=z.T @ z, offsets=a, noise_types=NOISE_TYPES)
    problem.target = w_t
    return problem


def make_problem(d: Mapping[str, Any]) -> MatrixProblem:
    return _make(tuple(d["targets"]), d["z_matrix"], float(d["injected_noise"]), int(d["n_samples"]),
                 int(d["seed"]))
