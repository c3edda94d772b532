"""Finite-data teacher–student linear regression (physics.md §2).

Inputs ``x ~ N(0, I/N)`` (σ_x² = 1/N), teacher ``u ~ N(0, I)``, labels ``y = uᵀx + ε`` with
``ε ~ N(0, σ_ε²)``; ``P = round(N · samples_per_param)`` samples. The loss is
``L(w) = 1/(2P) Σ (wᵀx_μ − y_μ)²``, Hessian ``H = XᵀX/P``, minimiser ``ŵ`` (least squares).
Stationary statistics are measured around ``ŵ``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError
from ..identity import content_hash, hash_words

#: Point parameters this model reads (besides the dynamics keys common to all models).
PARAMS = ("n_inputs", "label_noise", "samples_per_param", "lr", "batch_size", "momentum", "noise")
#: ``noise`` values this model supports.
NOISE_TYPES = ("minibatch", "minibatch_replace")
#: Axes that do not apply to this model.
NOT_APPLICABLE = ("hidden_width",)


@dataclass(frozen=True)
class LinearData:
    """One finite data set and the quantities derived from it (all float64).

    Attributes:
        x: inputs, shape (P, N).
        y: labels, shape (P,).
        w_hat: least-squares minimiser ŵ, shape (N,).
        hessian: H = XᵀX/P, shape (N, N).
        residual: r = y − Xŵ, shape (P,).
        loss_min: L(ŵ) = mean(r²)/2.
        eigenvalues: eigenvalues ω of H, ascending.
    """

    x: np.ndarray
    y: np.ndarray
    w_hat: np.ndarray
    hessian: np.ndarray
    residual: np.ndarray
    loss_min: float
    eigenvalues: np.ndarray

    @property
    def n_samples(self) -> int:
        return self.x.shape[0]

    @property
    def n_inputs(self) -> int:
        return self.x.shape[1]


def n_samples(params: Mapping[str, Any]) -> int:
    """P = round(N · samples_per_param), halves rounded up."""
    return int(math.floor(params["n_inputs"] * params["samples_per_param"] + 0.5))


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters that determine the data set (points sharing them share data)."""
    return {
        "model": "linear",
        "n_inputs": params["n_inputs"],
        "n_samples": n_samples(params),
        "label_noise": params["label_noise"],
        "seed": params["seed"],
    }


def check_point(params: Mapping[str, Any], where: str) -> None:
    """Raise :class:`ConfigError` if the point cannot be simulated by this model.

    ``where`` names the point in messages (``"grid point lr=0.1, batch_size=4"``).
    """
    if params["noise"] not in NOISE_TYPES:
        raise ConfigError("grid.noise", params["noise"], "for model.kind linear: " + ", ".join(NOISE_TYPES),
                          f"At {where}.")
    p, n = n_samples(params), params["n_inputs"]
    if p <= n:
        raise ConfigError(
            "grid.samples_per_param", params["samples_per_param"],
            f"a value with P = round(N·samples_per_param) > N = {n} (got P = {p})",
            "With P <= N the data are interpolated: the minimiser is not unique and there are "
            f"no stationary fluctuations. At {where}.")
    if params["batch_size"] > p:
        raise ConfigError("grid.batch_size", params["batch_size"],
                          f"at most the number of samples P = {p}", f"At {where}.")


@functools.lru_cache(maxsize=16)
def _make_data_cached(n_inputs: int, n_samples_: int, label_noise: float, seed: int) -> LinearData:
    key = {"model": "linear", "n_inputs": n_inputs, "n_samples": n_samples_,
           "label_noise": label_noise, "seed": seed}
    rng = np.random.default_rng(np.random.SeedSequence([seed, *hash_words(content_hash(key))]))
    x = rng.standard_normal((n_samples_, n_inputs)) / np.sqrt(n_inputs)
    teacher = rng.standard_normal(n_inputs)
    y = x @ teacher + label_noise * rng.standard_normal(n_samples_)
    w_hat, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ w_hat
    hessian = x.T @ x / n_samples_
    eig = np.linalg.eigvalsh(hessian)
    for arr in (x, y, w_hat, residual, hessian, eig):
        arr.setflags(write=False)
    return LinearData(x=x, y=y, w_hat=w_hat, hessian=hessian, residual=residual,
                      loss_min=float(0.5 * np.mean(residual**2)), eigenvalues=eig)


def make_data(dparams: Mapping[str, Any]) -> LinearData:
    """The data set of :func:`data_params` (deterministic in its arguments, cached per process)."""
    return _make_data_cached(int(dparams["n_inputs"]), int(dparams["n_samples"]),
                             float(dparams["label_noise"]), int(dparams["seed"]))


def mean_update_radius(eigenvalues: np.ndarray, lr: float, momentum: float) -> float:
    """Spectral radius ρ of the mean (noise-free) update of w − ŵ.

    Per Hessian eigenvalue ω the heavy-ball update has characteristic polynomial
    ``z² − (1 + μ − λω) z + μ = 0``; ρ is the largest root modulus over all ω.
    """
    b = 1.0 + momentum - lr * np.asarray(eigenvalues)
    disc = b * b - 4.0 * momentum
    sq = np.sqrt(np.abs(disc))
    real_roots = np.maximum(np.abs(b + sq), np.abs(b - sq)) / 2.0
    complex_mod = np.full_like(b, np.sqrt(momentum))
    return float(np.max(np.where(disc >= 0, real_roots, complex_mod)))


def relaxation_steps(data: LinearData, lr: float, momentum: float) -> float:
    """Slowest relaxation time 1/(1 − ρ) of the mean update, in steps (inf if unstable)."""
    rho = mean_update_radius(data.eigenvalues, lr, momentum)
    return float("inf") if rho >= 1.0 else 1.0 / (1.0 - rho)
