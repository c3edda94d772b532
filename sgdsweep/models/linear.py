"""``linear``: finite-data teacher–student regression (docs/physics.md §2).

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
from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.core.noise_types import MINIBATCH_NOISE
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models.affine import AFFINE_NOISE, AffineProblem
from sgdsweep.models.base import data_rng

if TYPE_CHECKING:
    from sgdsweep.models.predict import Prediction

#: Axes this model uses.
AXES = ("lr", "batch_size", "momentum", "samples_per_param", "noise")
#: ``model.*`` options and their defaults.
OPTIONS: dict[str, Any] = {"n_inputs": 20, "n_outputs": 1, "label_noise": 0.5, "inputs": "isotropic",
                           "wishart_ratio": 2.0, "labels": "teacher"}
NOISE_TYPES = AFFINE_NOISE
#: The fluctuation–dissipation observables of sampled batches (``dynamics.observe.gradient_noise``).
OBSERVES = frozenset({"gradient_noise"})


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


def check_data(params: Mapping[str, Any], p: int, n: int, where: PointName) -> None:
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


def check_point(params: Mapping[str, Any], where: PointName) -> None:
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


def theory(problem: AffineProblem, params: Mapping[str, Any], pred: Prediction, step: float, gain: float) -> None:
    """The exact discrete-time stationary second moment of one output (every noise type that
    :data:`sgdsweep.theory.linear.NOISE_TYPES` covers), the loss, test loss and
    fluctuation–dissipation residual from it, H and C at the minimum (``step``: λ or the SDE's
    dt; ``gain``: the noise gain λ/dt). Several outputs or ``epoch`` noise: no theory."""
    from sgdsweep.theory import linear as linear_theory  # scipy: loaded when a point is predicted

    noise, s = params["noise"], params["batch_size"]
    if problem.n_outputs != 1 or noise not in linear_theory.NOISE_TYPES:
        return
    pred.weight_cov = linear_theory.stationary_second_moment(problem, step, s, params["momentum"], noise, gain)
    pred.loss = linear_theory.training_loss(problem, pred.weight_cov)
    pred.formulas["weight_cov"] = linear_theory.FORMULA
    pred.formulas["loss"] = "L(w*) + ½ Tr(H M) with M from " + linear_theory.FORMULA
    pred.hessian, pred.noise_cov = problem.sxx, linear_theory.noise_covariance(problem, s, noise)
    _theory_extras(problem, params, pred)


def _theory_extras(problem: AffineProblem, params: Mapping[str, Any], pred: Prediction) -> None:
    """Test loss and the fluctuation–dissipation residual from the exact M."""
    from sgdsweep.theory import fdr
    from sgdsweep.theory import linear as linear_theory

    m = pred.weight_cov
    if not np.all(np.isfinite(m)):
        return
    if getattr(problem, "input_cov", None) is not None:
        pred.test_loss = float(problem.test_loss(problem.w_min[None])[0] + 0.5 * np.sum(problem.input_cov * m))
        pred.formulas["test_loss"] = ("test_loss(w_hat) + 1/2 Tr(Sigma_pop M) with the exact M: E[w] = w_hat exactly "
                                      "for a quadratic loss, Sigma_pop the input covariance of fresh data")
    if params["noise"] in MINIBATCH_NOISE and params["momentum"] == 0 and params["method"] == "sgd":
        batch = linear_theory.batch_product(problem, m, params["batch_size"], params["noise"])
        pred.fdr_residual = fdr.predicted_residual(params["lr"] * batch, params["lr"] * pred.noise_cov)
        pred.formulas["fdr_residual"] = fdr.FORMULA["predicted_residual"]
    else:
        pred.reasons["fdr_residual"] = "the relation is derived for plain SGD with minibatch noise (no momentum)"


def stability_edge(problem: AffineProblem, params: Mapping[str, Any], axis: str) -> dict[str, Any] | None:
    """The exact edge along ``axis`` (``lr`` or ``momentum``) where the spectral radius of SGD's
    second-moment map reaches 1 (:func:`sgdsweep.theory.edge.linear_edge`): one output, every
    noise type of :data:`sgdsweep.theory.linear.NOISE_TYPES` (not ``epoch``), plain SGD steps
    (not the SDE integrator); None otherwise."""
    from sgdsweep.theory import edge
    from sgdsweep.theory import linear as linear_theory

    noise = params["noise"]
    if problem.n_outputs != 1 or noise not in linear_theory.NOISE_TYPES or params.get("method", "sgd") != "sgd":
        return None
    return edge.linear_edge(problem, axis, params["lr"], params["batch_size"], params["momentum"], noise)
