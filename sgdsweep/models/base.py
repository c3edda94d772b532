"""The interface every model implements: a fixed problem on flattened weights ``w ∈ R^d``.

A :class:`Problem` is built once per shard from the point parameters that determine it (its
``data_params``) and is then shared by every lane (point × replica) of a simulation call. All
methods are vectorised over lanes: ``w`` has shape ``(L, d)``.

Two kinds of problem exist:

- *data* problems (``n_samples`` is an int P): the loss is an average over P samples and the
  gradient noise comes from which samples a step sees (``minibatch``, ``minibatch_replace``,
  ``epoch``, ``label``) or is drawn to match the per-sample gradients' covariance
  (``gaussian``, ``gaussian_matched``, ``student_t``);
- *additive* problems (``n_samples`` is None): the loss is known exactly and every step adds
  noise of covariance ``noise_cov / batch_size`` to the gradient (``gaussian``, ``student_t``).

Units: weights and losses are in the model's own units (documented per model); time is in
steps (one step = one update).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sgdsweep.core.noise_types import ADDED_NOISE, SAMPLING_NOISE

#: Public names; the noise types' subsets are re-exported from :mod:`sgdsweep.core.noise_types`.
__all__ = ["ADDED_NOISE", "KERNELS", "SAMPLING_NOISE", "Layer", "Problem", "data_rng",
           "mean_update_radius", "relaxation_from_curvatures"]

#: The kernel families of :attr:`Problem.kernel`.
KERNELS = ("affine", "two_layer", "thesis", "additive")


@dataclass(frozen=True)
class Layer:
    """A named matrix block of the flattened weights: ``w[:, start:start + rows*cols]`` is the
    row-major ``rows × cols`` matrix (outputs × inputs)."""

    name: str
    start: int
    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def take(self, w: np.ndarray) -> np.ndarray:
        """The layer's matrices, shape (L, rows, cols)."""
        return w[:, self.start:self.start + self.size].reshape(w.shape[0], self.rows, self.cols)


class Problem:
    """Base class; subclasses set the attributes and implement the methods marked so.

    Attributes:
        kind: ``model.kind``.
        dim: number of trained parameters d.
        n_samples: P for data problems, None for additive ones.
        w_min: the unique minimiser (shape (d,)) around which stationary moments are measured,
            or None when minima form a manifold (two_layer): each replica is then measured
            around its own time average after burn-in.
        layers: the weight matrices that ``w`` holds (for singular values and spectra).
        noise_cov: per-sample gradient-noise covariance C (d × d) of additive problems; a step
            adds noise of covariance C/S.
        noise_types: the ``noise`` values the model supports.
        linear_in_w: the gradient is affine in w with sample matrices (x, y): single linear layer.
        kernel: the compiled kernel family that simulates the problem (one of :data:`KERNELS`:
            ``affine`` a single linear layer on a data set, ``two_layer`` the linear two-layer
            network, ``thesis`` the thesis landscape, ``additive`` a polynomial gradient with
            additive noise), or None when only the numpy engine runs it.
        isotropic_on_range: the theory predicts isotropic fluctuations on the Hessian's range
            (two_layer's joint eigenvalue), so results summarise that spectrum's mean and spread.
    """

    kernel: ClassVar[str | None] = None
    isotropic_on_range: ClassVar[bool] = False

    kind: str = ""
    dim: int = 0
    n_samples: int | None = None
    w_min: np.ndarray | None = None
    layers: tuple[Layer, ...] = ()
    noise_cov: np.ndarray | None = None
    noise_types: tuple[str, ...] = ()
    linear_in_w: bool = False
    #: per-step label-noise standard deviation for noise ``label`` (data models with a teacher).
    label_noise: float = 0.0
    #: number of outputs (label components per sample).
    n_outputs: int = 1
    #: what ``dynamics.init: auto`` means for this model (zero or minimum).
    auto_init: str = "zero"

    # ---- to implement -------------------------------------------------------------------
    def grad(self, w: np.ndarray, idx: np.ndarray | None = None,
             label_eps: np.ndarray | None = None) -> np.ndarray:
        """Mean gradient over the samples ``idx`` (shape (L, S)), or the full gradient when
        ``idx`` is None; ``label_eps`` (L, S, n_outputs) is added to those samples' labels."""
        raise NotImplementedError

    def loss(self, w: np.ndarray) -> np.ndarray:
        """Training loss per lane, shape (L,)."""
        raise NotImplementedError

    def initial(self, how: str, rng: np.random.Generator) -> np.ndarray:
        """Initial weights of one replica, shape (d,), for ``dynamics.init`` = ``how``."""
        if how == "auto":
            how = self.auto_init
        if how == "minimum" and self.w_min is not None:
            return self.w_min.copy()
        if how == "zero":
            return np.zeros(self.dim)
        raise ValueError(f"init {how!r} not supported by model {self.kind}")

    # ---- optional ---------------------------------------------------------------------------
    def sample_grads(self, w: np.ndarray) -> np.ndarray:
        """Per-sample gradients at w, shape (L, P, d) (data problems)."""
        raise NotImplementedError

    def test_loss(self, w: np.ndarray) -> np.ndarray | None:
        """Expected loss on fresh data (or a held-out set), shape (L,); None if undefined."""
        return None

    def escaped(self, w: np.ndarray) -> np.ndarray | None:
        """Per lane, whether the replica has left its starting basin (escape problems)."""
        return None

    def relaxation_steps(self, lr: float, momentum: float) -> float:
        """Slowest relaxation time of the mean dynamics near the minimum, in steps (inf if the
        mean update is unstable)."""
        return relaxation_from_curvatures(self.curvatures(), lr, momentum)

    def curvatures(self) -> np.ndarray:
        """Eigenvalues of the loss Hessian at the minimum used for burn-in and stability."""
        raise NotImplementedError

    def divergence_scale(self) -> float:
        """|w|² scale that the divergence bound multiplies (1 + |w_min|² by default)."""
        return 1.0 + (float(self.w_min @ self.w_min) if self.w_min is not None else 0.0)

    def minibatch_noise_cov(self, batch_size: int, replace: bool = False) -> np.ndarray:
        """Per-step gradient-noise covariance at the minimum of a data problem (gradient², d × d):
        f·cov_μ(g_μ) over the per-sample gradients, f = (P−S)/(S(P−1)) without replacement,
        1/S with replacement (docs/physics.md §7)."""
        g = self.sample_grads(self.w_min[None, :])[0]
        g = g - g.mean(axis=0)
        p = self.n_samples
        if replace:
            factor = 1.0 / batch_size
        else:
            factor = (p - batch_size) / (batch_size * (p - 1)) if p > 1 else 0.0
        return factor * (g.T @ g) / p

    def gaussian_noise_var(self, batch_size: int) -> float:
        """Per-coordinate variance of the isotropic ``gaussian`` noise per step: the minibatch
        (without replacement) noise trace at the minimum divided by d (docs/physics.md §7)."""
        return float(np.trace(self.minibatch_noise_cov(batch_size)) / self.dim)

    def layer_cov_theory(self, w: np.ndarray, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Predicted eigenvalues (descending, weight² units) of a layer's stationary covariance
        around the weights ``w`` (shape (d,)), keyed by layer name, for the point ``params``;
        empty where the model has no such theory."""
        return {}

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts about the problem, stored with every point (minimum loss etc.)."""
        return {}


#: Slowest relaxation times (:func:`relaxation_from_curvatures`) under which a point's burn-in is
#: called short (its ``burn_in_relaxations``): the start's offset from the stationary state still
#: weighs about e⁻⁴ ≈ 2 % of itself in the mean and e⁻⁸ in the second moment (more with momentum
#: near critical damping, or minibatch noise near the variance-stability edge: docs/physics.md
#: §8), which the stationary theory does not describe (``burn_in: auto`` takes 8).
SHORT_BURN_IN = 4.0
#: What to do about a short burn-in, as every warning and verdict says it: with ``burn_in: auto``
#: a short point has ``burn_in_relaxations`` set below :data:`SHORT_BURN_IN`.
SHORT_BURN_IN_FIX = (f"set dynamics.burn_in: auto (8 relaxation times; dynamics.burn_in_relaxations, where set, at "
                     f"least {SHORT_BURN_IN:g}) or raise dynamics.burn_in")


def mean_update_radius(curvatures: np.ndarray, lr: float, momentum: float) -> float:
    """Spectral radius ρ of the noise-free heavy-ball update near the minimum.

    Per curvature k the update has characteristic polynomial ``z² − (1 + μ − λk) z + μ = 0``;
    ρ is the largest root modulus over all k.
    """
    return float(mean_update_radii(curvatures, np.array([lr]), np.array([momentum]))[0])


def mean_update_radii(curvatures: np.ndarray, lr: np.ndarray, momentum: np.ndarray) -> np.ndarray:
    """:func:`mean_update_radius` of each (λ, μ) of the arrays ``lr`` and ``momentum`` (shape (n,))."""
    lr, mu = np.asarray(lr, dtype=float)[:, None], np.asarray(momentum, dtype=float)[:, None]
    b = 1.0 + mu - lr * np.asarray(curvatures, dtype=float)[None, :]
    disc = b * b - 4.0 * mu
    sq = np.sqrt(np.abs(disc))
    real_roots = np.maximum(np.abs(b + sq), np.abs(b - sq)) / 2.0
    return np.max(np.where(disc >= 0, real_roots, np.sqrt(mu)), axis=1)


def burn_in_relaxations(curvatures: np.ndarray, lr: np.ndarray, momentum: np.ndarray, burn_in: np.ndarray,
                        dt_over_lr: np.ndarray) -> np.ndarray:
    """Each point's burn-in (SGD steps, array ``burn_in``) in slowest relaxation times of its
    noise-free update at the minimum, what ``burn_in: auto`` counts; NaN where that update is
    unstable. The update is SGD's heavy-ball map, or for a point of ``method: sde``
    (``dt_over_lr`` finite there, NaN for SGD) the integrator's Euler step dt = dt_over_lr·λ
    (μ = 0), 1/dt_over_lr of them per SGD step: the SGD map's for λk ≤ 1, shorter above, and
    stable where λk ≥ 2 leaves the SGD map unstable."""
    dt = np.asarray(dt_over_lr, dtype=float)
    sde = np.isfinite(dt)
    step = np.where(sde, dt, 1.0)
    rho = mean_update_radii(curvatures, np.asarray(lr, dtype=float) * step, np.where(sde, 0.0, momentum))
    # burn / τ with τ = 1/(1 − ρ) integrator steps, counted per SGD step
    return np.where(rho < 1.0, np.asarray(burn_in, dtype=float) * np.round(1.0 / step) * (1.0 - rho), np.nan)


def relaxation_from_curvatures(curvatures: np.ndarray, lr: float, momentum: float) -> float:
    """1/(1 − ρ) in steps; inf when ρ ≥ 1 (unstable or a flat direction)."""
    rho = mean_update_radius(curvatures, lr, momentum)
    return float("inf") if rho >= 1.0 else 1.0 / (1.0 - rho)


def data_rng(key: Mapping[str, Any]) -> np.random.Generator:
    """The generator of a problem's fixed data, keyed by the parameters that determine it."""
    from sgdsweep.core.identity import hash_words, stream_hash

    return np.random.default_rng(np.random.SeedSequence([int(key.get("seed", 0)),
                                                         *hash_words(stream_hash(dict(key)))]))
