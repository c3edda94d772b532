"""The theory of one point, whatever its model: what goes into the ``*_theory`` columns.

:func:`predict` returns a :class:`Prediction`; an entry is absent when the point's model,
noise or dynamics has no prediction (``reasons`` says why). Theory never costs a simulation: a
failing solver records its error and the point keeps its measurements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sgdsweep.models import get_model, hook
from sgdsweep.theory import escape as escape_theory
from sgdsweep.theory import escape_exact, lyapunov


@dataclass
class Prediction:
    """Theory values of one point.

    Attributes:
        weight_cov: stationary E[(w − w*)(w − w*)ᵀ] (d × d), or None.
        loss: stationary E[L].
        escape_arrhenius, escape_powerlaw: mean escape time in SGD steps.
        escape_exact: mean escape time in SGD steps of the discrete chain itself (exact kernel).
        escape_exact_matched: the same for the Gaussian-matched chain standing in for sampled
            (minibatch) noise on a data landscape: an approximation.
        joint_eigenvalue: two_layer's isotropic joint fluctuation eigenvalue λ⟨r²⟩/(2S).
        test_loss: stationary E[test loss] = test_loss(ŵ) + ½ Tr(Σ_pop M) (linear regression).
        fdr_residual: residual of the papers' fluctuation–dissipation relation at the exact M.
        hessian, noise_cov: H and the per-step gradient-noise covariance C at the minimum (models
            with a unique minimum and a known C), from which the approximations below follow.
        weight_cov_continuous: the continuous-time solution of HM + MH = λ_eff C, λ_eff = λ/(1−μ).
        weight_cov_eigenvalues_detailed_balance: eigenvalues of (λ_eff/2)H⁻¹C (Gross Eq. 2.33).
        q_eigenvalues_continuous: |eig Q| of the continuous theory (Gross Eq. 2.31), in the units of
            C (gradient²); measured as Q = (HM − MH)/λ_eff.
        formulas: column name → which formula and approximation.
        reasons: column name → why there is no prediction.
    """

    weight_cov: np.ndarray | None = None
    loss: float | None = None
    escape_arrhenius: float | None = None
    escape_powerlaw: float | None = None
    escape_exact: float | None = None
    escape_exact_matched: float | None = None
    joint_eigenvalue: float | None = None
    test_loss: float | None = None
    fdr_residual: float | None = None
    hessian: np.ndarray | None = None
    noise_cov: np.ndarray | None = None
    weight_cov_continuous: np.ndarray | None = None
    weight_cov_eigenvalues_detailed_balance: np.ndarray | None = None
    q_eigenvalues_continuous: np.ndarray | None = None
    formulas: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


def _sde_step(params: Mapping[str, Any]) -> tuple[float, float]:
    """(integrator step, noise gain): (λ, 1) for SGD, (dt, λ/dt) for the SDE."""
    lr = params["lr"]
    if params["method"] == "sde":
        dt = lr * params["dt_over_lr"]
        return dt, lr / dt
    return lr, 1.0


def predict(problem, params: Mapping[str, Any]) -> Prediction:
    """Theory for ``params`` on ``problem`` (see :class:`Prediction`): the model's own ``theory``
    hook (:mod:`sgdsweep.models`), then what is common to every model — the papers'
    approximations from H and C, and escape times wherever the problem has a barrier."""
    pred = Prediction()
    kind, noise = params["model"], params["noise"]
    step, gain = _sde_step(params)
    try:
        hook(get_model(kind), "theory")(problem, params, pred, step, gain)
    except (RuntimeError, np.linalg.LinAlgError, MemoryError, ValueError) as exc:
        pred.reasons["weight_cov"] = f"{type(exc).__name__}: {exc}"
    if pred.weight_cov is None and "weight_cov" not in pred.reasons:
        pred.reasons["weight_cov"] = (f"no exact stationary covariance for model {kind} with noise {noise}"
                                      + (" and several outputs" if getattr(problem, "n_outputs", 1) > 1 else ""))
    if "weight_cov" in pred.reasons:
        pred.reasons["loss"] = pred.reasons["weight_cov"]
    _approximations(params, pred)
    for key, value in (("fdr_residual", pred.fdr_residual), ("test_loss", pred.test_loss)):
        if value is None and key not in pred.reasons:
            pred.reasons[key] = "needs the exact stationary covariance of single-output linear regression" + (
                f" ({pred.reasons['weight_cov']})" if "weight_cov" in pred.reasons else "")
    if hasattr(problem, "barrier"):
        _escape(problem, params, pred)
    return pred


def _approximations(params: Mapping[str, Any], pred: Prediction) -> None:
    """The papers' leading-order theories next to the exact one: continuous-time Lyapunov,
    detailed balance and Q (docs/physics.md §2), with λ_eff = λ/(1−μ) (leading order in momentum)."""
    approx = ("weight_cov_continuous", "weight_cov_detailed_balance", "q_continuous")
    if pred.hessian is None or pred.noise_cov is None:
        for key in approx:
            pred.reasons[key] = pred.reasons.get("weight_cov", "no Hessian and noise covariance at a unique minimum")
        return
    lr_eff = params["lr"] / (1 - params["momentum"])
    try:
        (pred.weight_cov_continuous, pred.weight_cov_eigenvalues_detailed_balance,
         pred.q_eigenvalues_continuous) = lyapunov.leading_order(pred.hessian, pred.noise_cov, lr_eff)
    except (ValueError, np.linalg.LinAlgError) as exc:  # e.g. a singular Hessian (P ≤ N)
        for key in approx:
            pred.reasons[key] = f"{type(exc).__name__}: {exc}"
        return
    momentum = " with lr -> lr/(1-momentum)" if params["momentum"] else ""
    pred.formulas["weight_cov_continuous"] = lyapunov.FORMULA["continuous_covariance"] + momentum
    pred.formulas["weight_cov_detailed_balance"] = (
        "eigenvalues of the detailed-balance approximation (lr/2) H^-1 C (Gross 2024 Eq. 2.33), exact only "
        "when [H, C] = 0" + momentum)
    pred.formulas["q_continuous"] = (
        "|eig Q| of the continuous theory, Q_ij = (w_i - w_j)/(w_i + w_j) (V'CV)_ij in H's eigenbasis "
        "(Gross 2024 Eq. 2.31); measured as (HM - MH)(1-momentum)/lr")


#: noise types Mori's power law is for: the state-dependent minibatch covariance C(w), each step
#: independent, with a Gaussian diffusion limit (sampled batches, or Gaussian noise drawn with C(w))
POWERLAW_NOISE = ("minibatch", "minibatch_replace", "gaussian_matched")
#: why Kramers' law does not hold for a noise type (it needs additive Gaussian noise of constant covariance)
_NOT_KRAMERS = {
    "student_t": "heavy-tailed (Student-t, nu = 4): it escapes by rare large jumps, at a rate the variance "
                 "alone does not set",
    "gaussian_matched": "Gaussian but with the state-dependent covariance C(w), which changes the exponent "
                        "(Mori's power law is the law for it)",
    "minibatch": "sampled from the data set: not Gaussian, with the state-dependent covariance C(w)",
    "minibatch_replace": "sampled from the data set: not Gaussian, with the state-dependent covariance C(w)",
    "epoch": "sampled from the data set in epoch order: not Gaussian, not independent from step to step",
}


def escape_laws_apply(problem, params: Mapping[str, Any]) -> dict[str, str]:
    """Why each escape law does not hold at this point: ``{"escape_time_arrhenius": reason,
    "escape_time_powerlaw": reason}``, a key absent where the law holds.

    Kramers' law holds for SGD without momentum under additive Gaussian noise of constant
    covariance (noise ``gaussian``); Mori's power law for SGD without momentum under the
    state-dependent minibatch noise (:data:`POWERLAW_NOISE`) at a minimum with L_min > 0 (the
    thesis landscape). Both are continuous-time, leading-order laws (λh ≪ 1, T ≪ ΔL): that
    caveat is stated in their ``formula``, not here.
    """
    noise, mu = params["noise"], float(params["momentum"])
    out: dict[str, str] = {}
    if mu != 0:
        why = (f"is for SGD without momentum; with momentum {mu:g} the chain is second order (w and its "
               "velocity) and its escape rate is not this formula (no prediction)")
        out["escape_time_arrhenius"] = "Kramers' law " + why
        out["escape_time_powerlaw"] = "Mori's law " + why
    if noise != "gaussian" and "escape_time_arrhenius" not in out:
        out["escape_time_arrhenius"] = ("Kramers' law needs additive Gaussian noise of constant covariance "
                                        f"(noise gaussian); {noise} is "
                                        + _NOT_KRAMERS.get(noise, "not such noise"))
    if not (getattr(problem, "loss_saddle", None) and problem.loss_min > 0):
        out["escape_time_powerlaw"] = ("the state-dependent law needs SGD's own noise at a minimum with L_min > 0 "
                                       "(the thesis landscape); this landscape has additive noise")
    elif noise not in POWERLAW_NOISE and "escape_time_powerlaw" not in out:
        out["escape_time_powerlaw"] = ("Mori's law is for the state-dependent minibatch noise covariance with "
                                       "independent steps and a Gaussian diffusion limit "
                                       f"({', '.join(POWERLAW_NOISE)}); {noise} is not")
    return out


def _escape(problem, params: Mapping[str, Any], pred: Prediction) -> None:
    """Kramers (Arrhenius) and state-dependent power-law escape times in SGD steps, each where it
    holds (:func:`escape_laws_apply`; elsewhere the reason is recorded), and the exact chain's."""
    lr, s = params["lr"], params["batch_size"]
    absent = escape_laws_apply(problem, params)
    pred.reasons.update(absent)
    if "escape_time_arrhenius" not in absent:
        if problem.n_samples is None:  # the double well: 1-D, escape = reaching the other minimum
            pred.escape_arrhenius = escape_theory.kramers_steps(problem.barrier, problem.k_min, problem.k_saddle,
                                                                lr, problem.step_noise_var(s))
            pred.formulas["escape_time_arrhenius"] = (
                escape_theory.FORMULA["kramers_steps"] + " with the per-step noise variance sigma^2/S; valid "
                "for lr*curvature << 1 and T << barrier")
        else:  # isotropic gaussian noise on a 2-D landscape, escape = crossing the saddle's separatrix
            temp = escape_theory.sgd_temperature(lr, problem.gaussian_noise_var(s), 1.0)
            tau = escape_theory.eyring_kramers_time(problem.barrier, np.linalg.eigvalsh(problem.hessian(problem.w_min)),
                                                    np.linalg.eigvalsh(problem.hessian(problem.saddle_point)), temp)
            pred.escape_arrhenius = 0.5 * tau / lr
            pred.formulas["escape_time_arrhenius"] = (
                "half the " + escape_theory.FORMULA["eyring_kramers_time"] + ", at T = lr*v/2 with v the "
                "per-coordinate variance of the isotropic noise, in steps (tau/lr): the escape criterion "
                "(crossing the saddle's linearised separatrix) is met in half the time into the other basin; "
                "valid for lr*curvature << 1 and T << barrier")
    if "escape_time_powerlaw" not in absent:
        slope = escape_theory.powerlaw_slope(problem.k_min, problem.loss_min, problem.loss_saddle)
        exponent = slope * s / lr
        pred.escape_powerlaw = math.exp(exponent) / lr if exponent < 700.0 else math.inf  # beyond float range
        pred.formulas["escape_time_powerlaw"] = (
            "Mori's state-dependent law τ_t ∝ exp((S/(λ h*)) ln(L_saddle/L_min)) with unit prefactor, "
            "τ_steps = τ_t/λ; only the slope of ln τ against S/λ is predicted")
    if params["observe"]["escape"]:  # seconds per point: only where escape is measured
        _escape_exact(problem, params, pred)


def _escape_exact(problem, params: Mapping[str, Any], pred: Prediction) -> None:
    """The discrete chain's exact mean escape time (theory.escape_exact), or the Gaussian-matched
    approximation of it for sampled noise; the formula names the grid it was solved on."""
    column, result, note = escape_exact.for_point(problem, params)
    other = "escape_time_exact" if column == "matched" else "escape_time_exact_matched"
    key = "escape_time_exact_matched" if column == "matched" else "escape_time_exact"
    pred.reasons[other] = ("sampled noise has no exact kernel here; see escape_time_exact_matched"
                           if column == "matched" else
                           "the matched approximation is for sampled (minibatch) noise on a data landscape")
    if result is None:
        pred.reasons[key] = note
        return
    pred.formulas[key] = note
    if column == "matched":
        pred.escape_exact_matched = result.steps
    else:
        pred.escape_exact = result.steps
