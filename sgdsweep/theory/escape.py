"""Escape-time theory for SGD leaving a minimum (docs/physics.md §6).

Two laws are provided:

- **Arrhenius–Kramers** (state-independent, additive noise). Overdamped Langevin dynamics
  ``dx = −U'(x) dt + √(2T) dW`` in continuous time t with temperature T (units of the loss)
  leaves a minimum of curvature ``k_a = U''(x_a) > 0`` over a saddle of curvature
  ``k_b = U''(x_b) < 0`` and height ``ΔL = U(x_b) − U(x_a)`` at the mean time
  ``τ = 2π/√(k_a|k_b|) · exp(ΔL/T)`` to leading order in T/ΔL (corrections are O(T/ΔL)).

  **Which time this is:** τ is the inverse Kramers rate, i.e. the mean first-passage time from
  the minimum to a point *well past* the saddle (into the other basin: e.g. the other minimum).
  The mean first-passage time to the saddle point itself is τ/2 (from the top the walker
  falls back or over with equal probability). An escape criterion "crossing the saddle's stable
  manifold" measures τ/2; "entering the other basin" measures τ.

  SGD with additive noise, ``w ← w − λ(∇L + ξ)`` with per-step gradient-noise variance
  ``v = Var ξ`` (``v = σ²/S`` for per-sample variance σ² and batch size S) is, with
  ``t = λ·steps``, this Langevin dynamics at ``T = λv/2 = λσ²/(2S)``.

  Where it holds: additive Gaussian noise of constant covariance, no momentum, λk ≪ 1 and
  T ≪ ΔL; in d dimensions with isotropic noise the prefactor is Eyring–Kramers'
  (:func:`eyring_kramers_time`). :func:`sgdsweep.models.escape.laws_absent` decides per
  point whether a column is computed, and records why not.

- **Mori's power law** (state-dependent SGD noise, ``C ≈ 2L(θ)H/S`` near a minimum):
  ``ln τ ≈ const + (S/(λh*)) ln(L_saddle/L_min)``, linear in S/λ with slope
  ``ln(L_saddle/L_min)/h*`` rather than Arrhenius' ``2SΔL/σ²`` in 1/λ.
"""

from __future__ import annotations

import math

import numpy as np

#: One-line description of every formula, for the ``attrs`` of theory columns.
FORMULA: dict[str, str] = {
    "kramers_time": (
        "Kramers mean escape time tau = 2 pi/sqrt(k_min |k_saddle|) exp(barrier/T) in continuous "
        "time t = lr*steps for overdamped Langevin dx=-U'dt+sqrt(2T)dW; time to reach the other "
        "basin (twice the time to reach the saddle); leading order in T/barrier"
    ),
    "eyring_kramers_time": (
        "Eyring-Kramers mean escape time tau = 2 pi/|k_unstable| sqrt(|det H_saddle|/det H_min) "
        "exp(barrier/T) for dx=-grad U dt+sqrt(2T)dW with isotropic state-independent T; d = 1: kramers_time"
    ),
    "sgd_temperature": (
        "SGD temperature T = lr*noise_var/(2*batch_size) = lr*(per-step gradient-noise variance)/2 "
        "(additive Gaussian noise, continuous-time limit t = lr*steps)"
    ),
    "kramers_steps": (
        "Kramers mean escape time in SGD steps: kramers_time(T = lr*gradient_noise_var/2)/lr "
        "(additive noise; continuous-time and leading order in T/barrier)"
    ),
    "powerlaw_log_time": (
        "Mori et al. power law for state-dependent SGD noise: ln tau = const + "
        "(S/(lr h*)) ln(L_saddle/L_min); const is not predicted"
    ),
    "powerlaw_slope": (
        "slope d ln tau / d(S/lr) = ln(L_saddle/L_min)/h* of Mori's power law"
    ),
}


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def kramers_time(barrier: float, k_min: float, k_saddle: float, temperature: float) -> float:
    """Kramers mean escape time ``τ = 2π/√(k_min |k_saddle|) · exp(barrier/temperature)``.

    Arguments: ``barrier`` ΔL = L(saddle) − L(min) ≥ 0 (loss units), ``k_min`` > 0 the curvature
    at the minimum and ``k_saddle`` the curvature at the saddle along the escape direction
    (loss/x²; its sign is ignored, |k_saddle| > 0 is used), ``temperature`` T > 0 (loss units)
    of ``dx = −U'dt + √(2T)dW``.

    Returns τ in continuous time units (t = λ·steps for SGD): the mean time to escape *into the
    other basin* (the inverse rate); the mean time to first reach the saddle point is τ/2.
    Leading order in T/ΔL (relative corrections O(T/ΔL)); ``inf`` if the exponential overflows.
    """
    barrier = float(barrier)
    if not (math.isfinite(barrier) and barrier >= 0.0):
        raise ValueError(f"barrier must be finite and >= 0, got {barrier}")
    k_a = _positive("k_min", k_min)
    k_b = _positive("|k_saddle|", abs(float(k_saddle)))
    temp = _positive("temperature", temperature)
    prefactor = 2.0 * math.pi / math.sqrt(k_a * k_b)
    exponent = barrier / temp
    if exponent > 700.0:  # exp overflows near 709.8
        return math.inf
    return prefactor * math.exp(exponent)


def eyring_kramers_time(barrier: float, curvatures_min, curvatures_saddle, temperature: float) -> float:
    """Eyring–Kramers mean escape time in d dimensions under isotropic noise:
    ``τ = 2π/|κ_b| · √(|det H_b|/det H_a) · exp(barrier/temperature)``.

    ``curvatures_min``: the d Hessian eigenvalues at the minimum (all > 0, loss/x²);
    ``curvatures_saddle``: the d eigenvalues at the saddle, exactly one negative (κ_b, the
    escape direction). Dynamics ``dx = −∇U dt + √(2T) dW`` with the same T along every axis
    (isotropic, state-independent noise); for d = 1 this is :func:`kramers_time`. Same time as
    :func:`kramers_time` (into the other basin; half of it to first reach the saddle's
    separatrix), leading order in T/ΔL; ``inf`` if the exponential overflows.
    """
    k_a = np.asarray(curvatures_min, float).ravel()
    k_b = np.asarray(curvatures_saddle, float).ravel()
    if k_a.size != k_b.size or k_a.size == 0:
        raise ValueError(f"curvatures at the minimum ({k_a.size}) and at the saddle ({k_b.size}) must be "
                         "the same number (one per dimension), at least one")
    if not (np.all(np.isfinite(k_a)) and np.all(k_a > 0)):
        raise ValueError(f"every curvature at the minimum must be finite and > 0, got {k_a.tolist()}")
    if not np.all(np.isfinite(k_b)) or np.sum(k_b < 0) != 1 or np.any(k_b == 0):
        raise ValueError(f"the saddle needs exactly one negative curvature and no zero one, got {k_b.tolist()}")
    unstable = float(-k_b[k_b < 0][0])
    ratio = float(np.prod(np.abs(k_b) / k_a))  # |det H_b|/det H_a as a product of ratios: no overflow
    return kramers_time(barrier, unstable, -unstable, temperature) * math.sqrt(ratio)


def sgd_temperature(lr: float, noise_var: float, batch_size: float) -> float:
    """SGD temperature ``T = λσ²/(2S)`` (loss units).

    ``noise_var`` σ² is the per-sample variance of the additive gradient noise, so that the
    noise added to the gradient in one step has variance ``σ²/S`` (``batch_size`` S). Equivalently
    ``T = λ · (per-step gradient-noise variance)/2``. Valid for additive noise in the
    continuous-time limit ``t = λ·steps`` (diffusion ``λC/2`` per unit t).
    """
    lr = _positive("lr", lr)
    s = _positive("batch_size", batch_size)
    noise_var = float(noise_var)
    if not (math.isfinite(noise_var) and noise_var >= 0.0):
        raise ValueError(f"noise_var must be finite and >= 0, got {noise_var}")
    return lr * noise_var / (2.0 * s)


def kramers_steps(barrier: float, k_min: float, k_saddle: float, lr: float,
                  gradient_noise_var: float) -> float:
    """Kramers mean escape time in SGD steps: ``kramers_time(T = λv/2)/λ``.

    ``gradient_noise_var`` v is the per-step variance of the additive noise on the gradient
    (σ²/S). Same meaning as :func:`kramers_time` (time into the other basin; half of it to reach
    the saddle). Note ``ln τ_steps = ln τ_t − ln λ``: at fixed v, ``ln τ_t`` is linear in 1/λ
    with slope ``2ΔL/v`` (= 2SΔL/σ²), while ``ln τ_steps`` has the extra ``−ln λ``.
    """
    lr = _positive("lr", lr)
    v = _positive("gradient_noise_var", gradient_noise_var)
    return kramers_time(barrier, k_min, k_saddle, lr * v / 2.0) / lr


def powerlaw_slope(h_star: float, loss_min: float, loss_saddle: float) -> float:
    """Slope ``d ln τ / d(S/λ) = ln(L_saddle/L_min)/h*`` of Mori's power law (dimensionless
    times the units of λ).

    ``h_star`` h* > 0 is the curvature parameter of Mori et al.'s law (the Hessian eigenvalue
    along the escape direction at the minimum, loss units per parameter²); ``loss_min``,
    ``loss_saddle`` > 0 are the training losses at the minimum and at the saddle.
    """
    h = _positive("h_star", h_star)
    l_min = _positive("loss_min", loss_min)
    l_sad = _positive("loss_saddle", loss_saddle)
    return math.log(l_sad / l_min) / h


def powerlaw_log_time(lr: float, batch_size: float, h_star: float, loss_min: float,
                      loss_saddle: float, const: float = 0.0) -> float:
    """Mori's state-dependent escape law ``ln τ ≈ const + (S/(λh*)) ln(L_saddle/L_min)``.

    Returns the natural log of the mean escape time. ``const`` is not predicted by the law (fit
    it; default 0 gives the S/λ-dependent part only), so it also absorbs the choice of time unit
    (steps vs t = λ·steps). Arguments as in :func:`powerlaw_slope`, plus ``lr`` λ > 0 and
    ``batch_size`` S > 0.
    """
    lr = _positive("lr", lr)
    s = _positive("batch_size", batch_size)
    const = float(const)
    if not math.isfinite(const):
        raise ValueError(f"const must be finite, got {const}")
    return const + (s / lr) * powerlaw_slope(h_star, loss_min, loss_saddle)
