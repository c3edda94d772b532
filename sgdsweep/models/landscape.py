"""``landscape``: escape from a minimum (docs/physics.md §6).

``double_well``: the 1-D quartic ``U(w) = ½k_a w² + c₃w³ + c₄w⁴`` with its minimum at w = 0
(curvature ``curvature_min`` = k_a), the barrier top at ``s = √(12ΔL/(k_a + k_b))`` (height
``barrier`` = ΔL, curvature −k_b, ``curvature_saddle`` = k_b < k_a) and a second minimum at
``s·k_a/(k_a − k_b)``; c₃ = −(2k_a − k_b)/(3s), c₄ = (k_a − k_b)/(4s²). A step adds Gaussian (or
Student-t) noise of variance σ²/S (``noise_std`` = σ). A replica has escaped when it reaches
the second minimum (Kramers' τ is the mean time to arrive in the other well).

``thesis``: Vescovi's model ``f(a, b; x) = a² + x(1 + b/(1 + e^{−ax}))`` fitted by the mean
squared error (no ½, as in the thesis' tables) to 600 samples: f(1, 5; x) at 30 equally spaced
x in [−15, 15], 20 copies each, plus Uniform[−3, 3] label noise (fixed by the seed). Its real
minimum ≈ (0.97, 5.0), spurious minimum ≈ (−5.6, 3.0) and saddle ≈ (−0.30, 0.16) are located
numerically. A replica starting in ``start`` has escaped when it crosses the hyperplane
through the saddle normal to the saddle's unstable direction (the linearised separatrix).

Each landscape owns its escape theory (:meth:`DoubleWell.escape_theory`,
:meth:`Thesis.escape_theory`), which the model's ``escape`` hook asks: Kramers' 1-D law and the
1-D exact chain on the double well; Eyring–Kramers, Mori's power law and the 2-D exact chain on
the thesis landscape (docs/physics.md §6; :mod:`sgdsweep.models.escape` holds what they share).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.core.noise_types import DATA_FREE_NOISE, GAUSSIAN_NOISE, MINIBATCH_NOISE, NOISE, UNLABELLED_NOISE, select
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models.base import Layer, Problem, data_rng
from sgdsweep.models.escape import laws_absent, record_exact

if TYPE_CHECKING:
    from sgdsweep.models.predict import Prediction

AXES = ("lr", "batch_size", "momentum", "noise")
OPTIONS: dict[str, Any] = {"landscape": "double_well", "barrier": 1.0, "curvature_min": 1.0,
                           "curvature_saddle": 0.5, "noise_std": 1.0, "start": "spurious"}
#: options that only one landscape reads
_DOUBLE_WELL = ("barrier", "curvature_min", "curvature_saddle", "noise_std")
#: the thesis landscape's: every type but fresh label noise (its data set has no teacher)
NOISE_TYPES = UNLABELLED_NOISE
#: Escape from the starting basin (``dynamics.observe.escape``; on by default).
OBSERVES = frozenset({"escape"})
#: Noise types whose per-step covariance at the minimum the local theory of the thesis landscape
#: knows: the minibatch covariance of the per-sample gradients, each step independent, sampled or
#: Gaussian (minibatch, minibatch_replace, gaussian_matched).
LOCAL_NOISE = tuple(n for n in select(matched=True, independent_steps=True, fresh_labels=False)
                    if NOISE[n].sampled or NOISE[n].gaussian)
LOCAL_FORMULA = ("local quadratic approximation at the starting minimum w*: the exact discrete Lyapunov "
                 "solution with H = ∇²L(w*) and C = the minibatch covariance of the per-sample gradients "
                 "at w* (quadratic.stationary_covariance); neglects ∇³L and C(w) − C(w*), O(λ) relative")


class DoubleWell(Problem):
    """See the module docstring."""

    kind = "landscape"
    noise_types = DATA_FREE_NOISE
    auto_init = "minimum"
    kernel = "additive"

    def __init__(self, barrier: float, k_a: float, k_b: float, noise_std: float) -> None:
        self.barrier, self.k_min, self.k_saddle = barrier, k_a, k_b
        s = math.sqrt(12.0 * barrier / (k_a + k_b))
        self.saddle, self.c3, self.c4 = s, -(2 * k_a - k_b) / (3 * s), (k_a - k_b) / (4 * s * s)
        self.other_minimum = s * k_a / (k_a - k_b)
        self.dim = 1
        self.w_min = np.zeros(1)
        self.noise_cov = np.array([[noise_std**2]])
        self.noise_chol = np.array([[noise_std]])
        self.layers = (Layer("w", 0, 1, 1),)
        self.loss_min = 0.0
        self.loss_saddle = None
        #: the gradient as polynomial coefficients of (w, w², w³) and where escape begins: sgdsweep.sim.kernels.additive
        self.polynomial = (np.array([k_a]), np.array([3 * self.c3]), np.array([4 * self.c4]))
        self.escape_threshold = self.other_minimum

    def grad(self, w, idx=None, label_eps=None):
        return self.k_min * w + 3 * self.c3 * w**2 + 4 * self.c4 * w**3

    def loss(self, w):
        w = w[:, 0]
        return 0.5 * self.k_min * w**2 + self.c3 * w**3 + self.c4 * w**4

    def escaped(self, w):
        return w[:, 0] >= self.other_minimum

    def curvatures(self):
        return np.array([self.k_min])

    def step_noise_var(self, batch_size: int) -> float:
        return float(self.noise_cov[0, 0] / batch_size)

    def divergence_scale(self):
        return 1.0 + 100.0 * self.other_minimum**2

    def describe(self):
        return {"loss_min": 0.0, "barrier": self.barrier, "saddle": self.saddle,
                "other_minimum": self.other_minimum}

    def stationary_theory(self, params: Mapping[str, Any], pred: Prediction, step: float, gain: float) -> None:
        """None: no stationary theory of the double well is computed (predict records why)."""

    def escape_theory(self, params: Mapping[str, Any], pred: Prediction) -> None:
        """Kramers' 1-D law where it holds (:func:`sgdsweep.models.escape.laws_absent`; no power
        law: the noise is additive) and, where escape is measured, the exact 1-D chain's τ; in SGD
        steps, escape = reaching the other minimum."""
        from sgdsweep.theory import escape as escape_theory

        absent = laws_absent(params, powerlaw=False)
        pred.reasons.update(absent)
        lr, s = params["lr"], params["batch_size"]
        if "escape_time_arrhenius" not in absent:
            pred.escape_time_arrhenius = escape_theory.kramers_steps(self.barrier, self.k_min, self.k_saddle, lr,
                                                                     self.step_noise_var(s))
            pred.formulas["escape_time_arrhenius"] = (
                escape_theory.FORMULA["kramers_steps"] + " with the per-step noise variance sigma^2/S; valid "
                "for lr*curvature << 1 and T << barrier")
        if params["observe"]["escape"]:  # a grid solve per point: only where escape is measured
            record_exact(pred, *self.exact_escape(params))

    def exact_escape(self, params: Mapping[str, Any], rtol: float = 0.01) -> tuple[str, Any, str]:
        """(column, result, note) of the exact 1-D chain at the point ``params``
        (:func:`sgdsweep.theory.escape_exact.for_point`; column ``exact``), to relative
        accuracy ``rtol``."""
        from sgdsweep.theory import escape_exact

        noise, s = params["noise"], int(params["batch_size"])
        unsupported = None if noise in DATA_FREE_NOISE else f"no exact kernel for noise {noise} on the double well"
        return escape_exact.for_point(
            params, "exact", lambda step, gain: escape_exact.double_well(self, step, self.step_noise_var(s) * gain,
                                                                         noise, rtol=rtol), unsupported)


def _thesis_f(a, b, x):
    return a * a + x * (1.0 + b / (1.0 + np.exp(-a * x)))


def _descend(grad, hessian, loss, start, iterations: int = 500) -> np.ndarray:
    """A local minimum of ``loss`` (2 parameters) from ``start``: Newton steps where the Hessian
    is positive definite, gradient steps elsewhere, each halved until the loss decreases; stops
    when no step decreases it or the gradient is below 1e-10."""
    w = np.asarray(start, float)
    value = loss(w)
    for _ in range(iterations):
        g = grad(w)
        if float(np.max(np.abs(g))) < 1e-10:
            break
        h = hessian(w)
        step = -np.linalg.solve(h, g) if np.all(np.linalg.eigvalsh(h) > 0) else -g
        for _ in range(60):
            trial = w + step
            new = loss(trial)
            if new < value:
                w, value = trial, new
                break
            step = step / 2
        else:
            break
    return w


def _stationary(grad, hessian, start, iterations: int = 50) -> np.ndarray:
    """A root of ``grad`` (2 parameters) by Newton's method from ``start``, polished until a step
    no longer lowers the gradient's norm (rounding)."""
    w = np.asarray(start, float)
    norm = float(np.linalg.norm(grad(w)))
    for _ in range(iterations):
        trial = w - np.linalg.solve(hessian(w), grad(w))
        new = float(np.linalg.norm(grad(trial)))
        if not new < norm:
            break
        w, norm = trial, new
    return w


class Thesis(Problem):
    """See the module docstring. Parameters w = (a, b); loss = mean squared error (no ½)."""

    kind = "landscape"
    noise_types = NOISE_TYPES
    auto_init = "minimum"
    kernel = "thesis"

    def __init__(self, x: np.ndarray, y: np.ndarray, start: str) -> None:
        self.x, self.y = x, y
        self.n_samples = x.size
        self.dim = 2
        self.layers = (Layer("w", 0, 1, 2),)
        full = lambda v: self.grad(np.asarray(v, float)[None])[0]
        lossf = lambda v: float(self.loss(np.asarray(v, float)[None])[0])
        # each basin's minimum by a descent from its start, polished by Newton's method on the
        # gradient to rounding; the saddle by Newton's method alone (no SciPy: planning imports none)
        real, spur = (_stationary(full, self.hessian, _descend(full, self.hessian, lossf, start_at))
                      for start_at in ([1.0, 5.0], [-5.6, 3.0]))
        saddle = _stationary(full, self.hessian, np.array([-0.30, 0.16]))
        self.minima = {"real": real, "spurious": spur}
        self.saddle_point = saddle
        self.w_min = self.minima[start]
        self.other = self.minima["spurious" if start == "real" else "real"]
        hs = self.hessian(saddle)
        vals, vecs = np.linalg.eigh(hs)
        v = vecs[:, 0]  # unstable direction (negative curvature)
        self.normal = v if v @ (self.other - saddle) > 0 else -v
        hm = self.hessian(self.w_min)
        self._curv = np.linalg.eigvalsh(hm)
        self.loss_min = lossf(self.w_min)
        self.loss_saddle = lossf(saddle)
        self.barrier = self.loss_saddle - self.loss_min
        self.k_min = float(self._curv[0])  # softest curvature at the minimum
        self.k_saddle = float(-vals[0])

    def hessian(self, v: np.ndarray, h: float = 1e-6) -> np.ndarray:
        e = np.eye(2) * h
        rows = [(self.grad((v + e[i])[None])[0] - self.grad((v - e[i])[None])[0]) / (2 * h) for i in range(2)]
        m = np.array(rows)
        return 0.5 * (m + m.T)

    def _residual_and_jac(self, w, x):
        a = w[:, 0:1]
        b = w[:, 1:2]
        sig = 1.0 / (1.0 + np.exp(-a * x))
        f = a * a + x * (1.0 + b * sig)
        df_da = 2 * a + b * x * x * sig * (1 - sig)
        df_db = x * sig
        return f, df_da, df_db

    def grad(self, w, idx=None, label_eps=None):
        x = self.x[None, :] if idx is None else self.x[idx]
        y = self.y[None, :] if idx is None else self.y[idx]
        f, da, db = self._residual_and_jac(w, x)
        r = 2.0 * (f - y)
        return np.stack([np.mean(r * da, axis=1), np.mean(r * db, axis=1)], axis=1)

    def sample_grads(self, w):
        f, da, db = self._residual_and_jac(w, self.x[None, :])
        r = 2.0 * (f - self.y[None, :])
        return np.stack([r * da, r * db], axis=2)

    def loss(self, w):
        f, _, _ = self._residual_and_jac(w, self.x[None, :])
        return np.mean((f - self.y[None, :]) ** 2, axis=1)

    def escaped(self, w):
        return (w - self.saddle_point) @ self.normal > 0

    def curvatures(self):
        return self._curv

    def step_noise_var(self, batch_size: int) -> float:
        """Minibatch gradient-noise variance per step along the escape direction at the minimum."""
        return float(self.normal @ self.minibatch_noise_cov(batch_size) @ self.normal)

    def divergence_scale(self):
        return 1.0 + 1e4

    def describe(self):
        return {"loss_min": self.loss_min, "loss_saddle": self.loss_saddle, "barrier": self.barrier,
                "minimum": self.w_min.tolist(), "saddle": self.saddle_point.tolist(),
                "other_minimum": self.other.tolist()}

    def stationary_theory(self, params: Mapping[str, Any], pred: Prediction, step: float, gain: float) -> None:
        """With :data:`LOCAL_NOISE`: the stationary covariance and loss of the local quadratic
        approximation at the starting minimum (:data:`LOCAL_FORMULA`); none with other noise."""
        from sgdsweep.theory import quadratic as quadratic_theory

        noise, s = params["noise"], params["batch_size"]
        if noise not in LOCAL_NOISE:
            return
        pred.hessian = self.hessian(self.w_min)
        pred.noise_cov = self.minibatch_noise_cov(s, replace=NOISE[noise].replacement)
        pred.weight_cov = quadratic_theory.stationary_covariance(pred.hessian, pred.noise_cov * gain, step,
                                                                 params["momentum"])
        pred.loss = float(self.loss_min + 0.5 * np.sum(pred.hessian * pred.weight_cov))
        pred.formulas["weight_cov"] = LOCAL_FORMULA
        pred.formulas["loss"] = "L(w*) + ½ Tr(H M) with M from " + LOCAL_FORMULA

    def escape_theory(self, params: Mapping[str, Any], pred: Prediction) -> None:
        """Eyring–Kramers (isotropic ``gaussian`` noise) and Mori's power law (state-dependent
        minibatch noise), each where it holds (:func:`sgdsweep.models.escape.laws_absent`), and,
        where escape is measured, the exact 2-D chain's τ (or its Gaussian-matched approximation
        for sampled noise); in SGD steps, escape = crossing the saddle's linearised separatrix."""
        from sgdsweep.theory import escape as escape_theory

        absent = laws_absent(params, powerlaw=self.loss_min > 0)
        pred.reasons.update(absent)
        lr, s = params["lr"], params["batch_size"]
        if "escape_time_arrhenius" not in absent:
            temp = escape_theory.sgd_temperature(lr, self.gaussian_noise_var(s), 1.0)
            tau = escape_theory.eyring_kramers_time(self.barrier, np.linalg.eigvalsh(self.hessian(self.w_min)),
                                                    np.linalg.eigvalsh(self.hessian(self.saddle_point)), temp)
            pred.escape_time_arrhenius = 0.5 * tau / lr
            pred.formulas["escape_time_arrhenius"] = (
                "half the " + escape_theory.FORMULA["eyring_kramers_time"] + ", at T = lr*v/2 with v the "
                "per-coordinate variance of the isotropic noise, in steps (tau/lr): the escape criterion "
                "(crossing the saddle's linearised separatrix) is met in half the time into the other basin; "
                "valid for lr*curvature << 1 and T << barrier")
        if "escape_time_powerlaw" not in absent:
            slope = escape_theory.powerlaw_slope(self.k_min, self.loss_min, self.loss_saddle)
            exponent = slope * s / lr
            pred.escape_time_powerlaw = math.exp(exponent) / lr if exponent < 700.0 else math.inf  # beyond float range
            pred.formulas["escape_time_powerlaw"] = (
                "Mori's state-dependent law τ_t ∝ exp((S/(λ h*)) ln(L_saddle/L_min)) with unit prefactor, "
                "τ_steps = τ_t/λ; only the slope of ln τ against S/λ is predicted")
        if params["observe"]["escape"]:  # seconds per point: only where escape is measured
            record_exact(pred, *self.exact_escape(params))

    def exact_escape(self, params: Mapping[str, Any], rtol: float = 0.01) -> tuple[str, Any, str]:
        """(column, result, note) of the exact 2-D chain at the point ``params``
        (:func:`sgdsweep.theory.escape_exact.for_point`): column ``exact`` for Gaussian noise,
        ``matched`` (the Gaussian chain of the same covariance C(w), an approximation) for sampled
        minibatch noise; to relative accuracy ``rtol``."""
        from sgdsweep.theory import escape_exact

        noise, s = params["noise"], int(params["batch_size"])
        column = "matched" if noise in MINIBATCH_NOISE else "exact"
        unsupported = None if noise in GAUSSIAN_NOISE + MINIBATCH_NOISE else (
            f"no exact kernel for noise {noise} on the thesis landscape (gaussian and gaussian_matched; "
            "minibatch via the matched approximation)")

        def solve(step: float, gain: float) -> Any:
            chain = escape_exact.thesis_chain(self, step, s, "gaussian" if noise == "gaussian" else "matched",
                                              gain, replace=NOISE[noise].replacement)
            return escape_exact.chain_escape(chain, escape_exact.box_2d(chain, self.hessian(self.w_min)), rtol=rtol)

        return escape_exact.for_point(params, column, solve, unsupported)


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    if params["landscape"] == "double_well":
        return {"model": "landscape", "landscape": "double_well",
                **{k: params[k] for k in _DOUBLE_WELL}}
    return {"model": "landscape", "landscape": "thesis", "start": params["start"], "seed": params["seed"]}


def noise_types(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The noise types of the landscape that ``options["landscape"]`` names; the first is the
    default (the double well has no data set, so only added noise)."""
    return DoubleWell.noise_types if options["landscape"] == "double_well" else NOISE_TYPES


def check_point(params: Mapping[str, Any], where: PointName) -> None:
    if params["landscape"] == "double_well":
        if params["noise"] not in noise_types(params):
            raise ConfigError("grid.noise", params["noise"],
                              "for landscape double_well: " + ", ".join(noise_types(params)),
                              f"The 1-D well has no data set to sample from. At {where}.")
        if not params["curvature_saddle"] < params["curvature_min"]:
            raise ConfigError("model.curvature_saddle", params["curvature_saddle"],
                              f"a value below curvature_min = {params['curvature_min']}",
                              "The quartic needs k_b < k_a to have a second minimum to escape to.")
    elif params["batch_size"] > 600:
        raise ConfigError("grid.batch_size", params["batch_size"], "at most the 600 samples of the thesis data set",
                          f"At {where}.")


@functools.lru_cache(maxsize=8)
def _thesis(start: str, seed: int) -> Thesis:
    rng = data_rng({"model": "landscape", "landscape": "thesis", "seed": seed})
    grid = np.linspace(-15.0, 15.0, 30)
    x = np.repeat(grid, 20)
    y = _thesis_f(1.0, 5.0, x) + rng.uniform(-3.0, 3.0, x.size)
    return Thesis(x, y, start)


def make_problem(d: Mapping[str, Any]) -> Problem:
    if d["landscape"] == "double_well":
        return _double_well(float(d["barrier"]), float(d["curvature_min"]), float(d["curvature_saddle"]),
                            float(d["noise_std"]))
    return _thesis(d["start"], int(d["seed"]))


@functools.lru_cache(maxsize=8)
def _double_well(barrier: float, k_a: float, k_b: float, noise_std: float) -> DoubleWell:
    return DoubleWell(barrier, k_a, k_b, noise_std)


def theory(problem: DoubleWell | Thesis, params: Mapping[str, Any], pred: Prediction, step: float,
           gain: float) -> None:
    """The theory hook: the landscape's own stationary theory (:meth:`Thesis.stationary_theory`;
    the double well has none)."""
    problem.stationary_theory(params, pred, step, gain)

def escape(problem: DoubleWell | Thesis, params: Mapping[str, Any], pred: Prediction) -> None:
    """The escape hook: the landscape's own escape theory (:meth:`DoubleWell.escape_theory`,
    :meth:`Thesis.escape_theory`)."""
    problem.escape_theory(params, pred)
