"""``linear``: finite-data teacher–student regression (physics.md §2).

Inputs ``x ~ N(0, Σ_x)`` with ``Σ_x = I/N`` (``inputs: isotropic``, σ_x² = 1/N) or a fixed
Wishart matrix ``Σ_x = GᵀG/(m N)``, ``G`` an m × N standard Gaussian matrix with
``m = round(wishart_ratio · N)`` (``inputs: wishart``: correlated inputs with a Marchenko–Pastur
spectrum around 1/N). ``n_outputs`` outputs. Labels (``labels``):

- ``teacher``: ``y = U x + ε``, teacher ``U`` (n_outputs × N) with N(0, 1) entries and
  ``ε ~ N(0, σ_ε² I)``, σ_ε = ``label_noise``;
- ``noise``: pure-noise targets ``y = ε`` (random labels, no teacher).

P = round(N · samples_per_param) samples. Loss ``L(W) = 1/(2P) Σ ‖W x − y‖²`` (label² units),
Hessian ``H = XᵀX/P``; stationary moments are measured around the least-squares minimiser ŵ.
With ``noise: label`` the data set's labels are noiseless (``y = U x``) and every step draws fresh
label noise of standard deviation σ_ε on its batch (the online-learning view).

The test loss is the exact expectation over fresh samples,
``½ tr((W − U) Σ_x (W − U)ᵀ) + n_outputs σ_ε²/2``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.errors import ConfigError
from sgdsweep.models.affine import AFFINE_NOISE, AffineProblem
from sgdsweep.models.base import data_rng

#: Axes this model uses.
AXES = ("lr", "batch_size", "momentum", "samples_per_param", "noise")
#: ``model.*`` options and their defaults.
OPTIONS: dict[str, Any] = {"n_inputs": 20, "n_outputs": 1, "label_noise": 0.5, "inputs": "isotropic",
                           "wishart_ratio": 2.0, "labels": "teacher"}
NOISE_TYPES = AFFINE_NOISE


def n_samples(params: Mapping[str, Any]) -> int:
    """P = round(N · samples_per_param), halves rounded up."""
    return int(math.floor(params["n_inputs"] * params["samples_per_param"] + 0.5))


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters that determine the data set (points sharing them share data)."""
    return {"model": "linear", "seed": params["seed"], "n_inputs": params["n_inputs"],
            "n_outputs": params["n_outputs"], "n_samples": n_samples(params),
            "label_noise": params["label_noise"], "inputs": params["inputs"],
            "wishart_ratio": params["wishart_ratio"] if params["inputs"] == "wishart" else None,
            "labels": params["labels"], "noiseless": params["noise"] == "label"}


def check_data(params: Mapping[str, Any], p: int, n: int, where: str) -> None:
    """Raise :class:`ConfigError` unless P > N (a unique minimiser with stationary fluctuations),
    S <= P, and label noise has a teacher. Shared by the models trained on a finite data set."""
    if p <= n:
        raise ConfigError(
            "grid.samples_per_param", params["samples_per_param"],
            f"a value with P = round(N·samples_per_param) > N = {n} (got P = {p})",
            "With P <= N the data are interpolated: the minimiser is not unique and there are "
            f"no stationary fluctuations. At {where}.")
    if params["batch_size"] > p:
        raise ConfigError("grid.batch_size", params["batch_size"],
                          f"at most the number of samples P = {p}", f"At {where}.")
    if params["noise"] == "label" and params.get("labels", "teacher") != "teacher":
        raise ConfigError("grid.noise", "label", "label noise only with model.labels: teacher",
                          f"Fresh label noise needs a teacher to add it to. At {where}.")


def check_point(params: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` if the point cannot be simulated by this model."""
    check_data(params, n_samples(params), params["n_inputs"], where)


@functools.lru_cache(maxsize=16)
def _make(n_inputs: int, n_outputs: int, p: int, label_noise: float, inputs: str,
          wishart_ratio: float | None, labels: str, noiseless: bool, seed: int) -> AffineProblem:
    key = {"model": "linear", "n_inputs": n_inputs, "n_outputs": n_outputs, "n_samples": p,
           "label_noise": label_noise, "inputs": inputs, "wishart_ratio": wishart_ratio,
           "labels": labels, "seed": seed}  # 'noiseless' only drops ε: same x, U, ε draws
    rng = data_rng(key)
    if inputs == "wishart":
        m = max(1, int(round(wishart_ratio * n_inputs)))
        g = rng.standard_normal((m, n_inputs))
        cov = g.T @ g / (m * n_inputs)
    else:
        cov = np.eye(n_inputs) / n_inputs
    root = np.linalg.cholesky(cov)
    x = rng.standard_normal((p, n_inputs)) @ root.T
    teacher = rng.standard_normal((n_outputs, n_inputs)) if labels == "teacher" else np.zeros((n_outputs, n_inputs))
    eps = label_noise * rng.standard_normal((p, n_outputs))
    y = x @ teacher.T + (0.0 if noiseless else eps)
    noise_floor = n_outputs * label_noise**2 / 2.0

    # expected loss on fresh data, ½ Σ_o (W − T)_o Σ (W − T)_oᵀ + noise floor, as a quadratic form
    test_quadratic = (cov, teacher @ cov, 0.5 * float(np.sum((teacher @ cov) * teacher)) + noise_floor)
    problem = AffineProblem("linear", x, y, noise_types=NOISE_TYPES, label_noise=label_noise,
                            test_quadratic=test_quadratic)
    problem.teacher = teacher
    problem.input_cov = cov
    return problem


def make_problem(dparams: Mapping[str, Any]) -> AffineProblem:
    """The problem of :func:`data_params` (deterministic in its arguments, cached per process)."""
    return _make(int(dparams["n_inputs"]), int(dparams["n_outputs"]), int(dparams["n_samples"]),
                 float(dparams["label_noise"]), dparams["inputs"], dparams["wishart_ratio"],
                 dparams["labels"], bool(dparams["noiseless"]), int(dparams["seed"]))
