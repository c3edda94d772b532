"""``two_layer``: the linear network y = W2·W1·x, both layers trained together (docs/physics.md §4).

``W1`` (hidden_width × n_inputs) and ``W2`` (n_outputs × hidden_width) are flattened into
``w = (vec W1, vec W2)`` (row-major). Data as in ``linear``: x ~ N(0, I/N_i), P = round(N_i ·
samples_per_param); targets ``teacher`` (y = U x + ε, U with N(0, 1) entries) or ``noise``
(pure-noise targets y = ε, Gross et al.'s setting); σ_ε = ``label_noise``. Loss
``L = 1/(2P) Σ ‖y − W2 W1 x‖²`` (label²). Its minima form a manifold (W2W1 = the least-squares
map; any invertible G gives W2G⁻¹, GW1), so each replica is measured around its own time mean
after burn-in. ``init_scale``: ``glorot`` draws entries N(0, 1/fan_in) per replica, ``tiny``
N(0, 10⁻⁶/fan_in).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.core.noise_types import ALL
from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models.base import Layer, Problem, data_rng
from sgdsweep.models.linear import check_data, n_samples

if TYPE_CHECKING:
    from sgdsweep.models.predict import Prediction

AXES = ("lr", "batch_size", "momentum", "samples_per_param", "hidden_width", "noise")
OPTIONS: dict[str, Any] = {"n_inputs": 10, "n_outputs": 1, "label_noise": 1.0, "labels": "noise",
                           "init_scale": "glorot"}
#: Every noise type but ``gaussian``: its isotropic variance is the minibatch noise at the
#: unique minimum (docs/physics.md §7), and the two-layer minima form a manifold.
NOISE_TYPES = tuple(n for n in ALL if n != "gaussian")
INIT_VARIANCE = {"glorot": 1.0, "tiny": 1e-6}


class TwoLayerProblem(Problem):
    """See the module docstring."""

    kind = "two_layer"
    noise_types = NOISE_TYPES
    auto_init = "random"
    kernel = "two_layer"
    isotropic_on_range = True

    def __init__(self, x: np.ndarray, y: np.ndarray, hidden: int, init_scale: str, label_noise: float,
                 teacher: np.ndarray) -> None:
        self.x, self.y = x, y
        self.n_samples, self.n_inputs = x.shape
        self.n_outputs = y.shape[1]
        self.hidden = hidden
        self.init_scale = init_scale
        self.label_noise = label_noise
        self.teacher = teacher
        n1 = hidden * self.n_inputs
        self.layers = (Layer("W1", 0, hidden, self.n_inputs), Layer("W2", n1, self.n_outputs, hidden))
        self.dim = n1 + self.n_outputs * hidden
        #: rank of the loss Hessian at a minimum (the range of Γ): N_o·N_i
        self.hessian_rank = self.n_outputs * self.n_inputs
        self.sxx = x.T @ x / self.n_samples
        self.syx = y.T @ x / self.n_samples
        self.map_min = np.linalg.solve(self.sxx, self.syx.T).T  # least-squares W2W1
        r = y - x @ self.map_min.T
        self.loss_min = float(0.5 * np.mean(np.sum(r * r, axis=1)))
        self._yy = float(0.5 * np.mean(np.sum(y * y, axis=1)))

    def _split(self, w):
        return self.layers[0].take(w), self.layers[1].take(w)

    def grad(self, w, idx=None, label_eps=None):
        w1, w2 = self._split(w)
        prod = np.einsum("loh,lhi->loi", w2, w1)
        if idx is None:
            gp = np.einsum("loi,ij->loj", prod, self.sxx) - self.syx[None]  # ∂L/∂(W2W1)
        else:
            xb, yb = self.x[idx], self.y[idx]
            if label_eps is not None:
                yb = yb + label_eps
            e = np.einsum("lsi,loi->lso", xb, prod) - yb
            gp = np.einsum("lso,lsi->loi", e, xb) / idx.shape[1]
        g1 = np.einsum("loh,loi->lhi", w2, gp)
        g2 = np.einsum("loi,lhi->loh", gp, w1)
        return np.concatenate([g1.reshape(len(w), -1), g2.reshape(len(w), -1)], axis=1)

    def sample_grads(self, w):
        w1, w2 = self._split(w)
        prod = np.einsum("loh,lhi->loi", w2, w1)
        e = np.einsum("pi,loi->lpo", self.x, prod) - self.y[None]  # (L, P, o)
        h = np.einsum("pi,lhi->lph", self.x, w1)  # (L, P, h)
        back = np.einsum("lpo,loh->lph", e, w2)  # (L, P, h)
        g1 = back[:, :, :, None] * self.x[None, :, None, :]
        g2 = e[:, :, :, None] * h[:, :, None, :]
        L, P = e.shape[:2]
        return np.concatenate([g1.reshape(L, P, -1), g2.reshape(L, P, -1)], axis=2)

    def loss(self, w):
        w1, w2 = self._split(w)
        d = np.einsum("loh,lhi->loi", w2, w1) - self.map_min[None]
        return self.loss_min + 0.5 * np.einsum("loj,loj->l", d @ self.sxx, d)

    def test_loss(self, w):
        w1, w2 = self._split(w)
        d = np.einsum("loh,lhi->loi", w2, w1) - self.teacher[None]
        return 0.5 * np.einsum("loi,loi->l", d, d) / self.n_inputs + self.n_outputs * self.label_noise**2 / 2

    def initial(self, how, rng):
        if how == "zero":
            return np.zeros(self.dim)
        if how != "random":
            raise ValueError(f"init {how!r}: two_layer has no unique minimum; use auto (init_scale) or zero")
        v = INIT_VARIANCE[self.init_scale]
        w1 = rng.standard_normal(self.layers[0].size) * np.sqrt(v / self.n_inputs)
        w2 = rng.standard_normal(self.layers[1].size) * np.sqrt(v / self.hidden)
        return np.concatenate([w1, w2])

    def curvatures(self):
        # the end-to-end map relaxes at rate ~ λ·ω·(‖W1‖² + ‖W2‖²); at the scale of a trained
        # network (‖W‖² ≈ ‖map‖) the slowest data direction sets the time
        scale = max(np.linalg.norm(self.map_min), 1e-3)
        return np.linalg.eigvalsh(self.sxx) * scale

    def divergence_scale(self):
        return 1.0 + self.dim

    def layer_cov_theory(self, w: np.ndarray, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """W2's covariance eigenvalues (λσ²/2S)·D1/(D1 + D2) at the weights ``w``, σ² = 2 L_min
        (one output only)."""
        if self.n_outputs != 1:
            return {}
        from sgdsweep.theory import two_layer as two_layer_theory

        w1, w2 = (layer.take(w[None])[0] for layer in self.layers)
        return {"W2": two_layer_theory.w2_covariance_eigenvalues(
            w1, w2, params["lr"], params["batch_size"], 2.0 * self.loss_min)[0]}

    def describe(self) -> dict[str, Any]:
        return {"loss_min": self.loss_min, "n_samples": self.n_samples, "hidden_width": self.hidden}


def data_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": "two_layer", "seed": params["seed"], "n_inputs": params["n_inputs"],
            "n_outputs": params["n_outputs"], "n_samples": n_samples(params),
            "label_noise": params["label_noise"], "labels": params["labels"],
            "hidden_width": params["hidden_width"], "init_scale": params["init_scale"],
            "noiseless": params["noise"] == "label"}


def check_point(params: Mapping[str, Any], where: PointName) -> None:
    check_data(params, n_samples(params), params["n_inputs"], where)


def check_dynamics(params: Mapping[str, Any], where: PointName) -> None:
    """No start at the minimum: there is no unique one."""
    if params["init"] == "minimum":
        raise ConfigError("dynamics.init", "minimum", "auto or zero for two_layer",
                          "Its minima form a manifold; auto starts from random weights (model.init_scale).")


def theory(problem: TwoLayerProblem, params: Mapping[str, Any], pred: Prediction, step: float,
           gain: float) -> None:
    """No stationary covariance (the minima form a manifold); the joint eigenvalue λ⟨r²⟩/(2S)
    on the range of Γ and the formula of W2's spectrum, measured per replica."""
    from sgdsweep.theory import two_layer as two_layer_theory

    pred.formulas["layer_cov_eigenvalues_W2"] = (two_layer_theory.FORMULA["w2_covariance_eigenvalues"]
                                                 + "; per replica at its own mean weights, averaged")
    pred.joint_eigenvalue = params["lr"] * 2.0 * problem.loss_min / (2.0 * params["batch_size"])
    pred.formulas["joint_eigenvalue"] = (
        "λ⟨r²⟩/(2S), ⟨r²⟩ = 2 L_min: isotropic joint fluctuations on the range of Γ (Gross et al. "
        "2024 Sec. III, docs/physics.md §4; leading order in λ, P ≫ N)")


@functools.lru_cache(maxsize=16)
def _make(n_inputs, n_outputs, p, label_noise, labels, hidden, init_scale, noiseless, seed) -> TwoLayerProblem:
    rng = data_rng({"model": "two_layer", "n_inputs": n_inputs, "n_outputs": n_outputs, "n_samples": p,
                    "label_noise": label_noise, "labels": labels, "seed": seed})
    x = rng.standard_normal((p, n_inputs)) / np.sqrt(n_inputs)
    teacher = rng.standard_normal((n_outputs, n_inputs)) if labels == "teacher" else np.zeros((n_outputs, n_inputs))
    eps = label_noise * rng.standard_normal((p, n_outputs))
    y = x @ teacher.T + (0.0 if noiseless else eps)
    return TwoLayerProblem(x, y, hidden, init_scale, label_noise, teacher)


def make_problem(d: Mapping[str, Any]) -> TwoLayerProblem:
    return _make(int(d["n_inputs"]), int(d["n_outputs"]), int(d["n_samples"]), float(d["label_noise"]),
                 d["labels"], int(d["hidden_width"]), d["init_scale"], bool(d["noiseless"]), int(d["seed"]))
