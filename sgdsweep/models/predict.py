"""The theory of one point, whatever its model: what goes into the ``*_theory`` columns.

:func:`predict` returns a :class:`Prediction`; an entry is absent when the point's model,
noise or dynamics has no prediction (``reasons`` says why). Theory never costs a simulation: a
failing solver records its error and the point keeps its measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sgdsweep.models import get_model, hook
from sgdsweep.theory import lyapunov


@dataclass
class Prediction:
    """Theory values of one point.

    Attributes:
        weight_cov: stationary E[(w − w*)(w − w*)ᵀ] (d × d), or None.
        loss: stationary E[L].
        escape_time_arrhenius, escape_time_powerlaw: mean escape time in SGD steps (Kramers' and
            Mori's laws).
        escape_time_exact: mean escape time in SGD steps of the discrete chain itself (exact kernel).
        escape_time_exact_matched: the same for the Gaussian-matched chain standing in for sampled
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
        formulas: quantity → which formula and approximation.
        reasons: quantity → why there is no prediction.

    A quantity has one name: the field's, the key of its formula and reason, and (with
    ``_theory`` after the measured observable it predicts, :func:`sgdsweep.store.variables.theory_column`)
    its stored column: ``escape_time_arrhenius`` is stored as ``escape_time_theory_arrhenius``,
    ``loss`` as ``loss_theory``.
    """

    weight_cov: np.ndarray | None = None
    loss: float | None = None
    escape_time_arrhenius: float | None = None
    escape_time_powerlaw: float | None = None
    escape_time_exact: float | None = None
    escape_time_exact_matched: float | None = None
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


#: what a stored theory column puts after the measured observable it predicts
THEORY = "_theory"


def theory_column(observable: str, variant: str = "") -> str:
    """The stored column of the theory quantity ``<observable>[_<variant>]``: ``<observable>_theory``
    and the variant after it (``escape_time``, ``arrhenius`` → ``escape_time_theory_arrhenius``;
    ``loss`` → ``loss_theory``); its inverse is :func:`theory_name`."""
    return observable + THEORY + (f"_{variant}" if variant else "")


def theory_name(column: str) -> str:
    """The theory quantity a stored column holds, the one name of its :class:`Prediction` field
    (where it has one) and of its formula and reason: the column's name without ``_theory``
    (``escape_time_theory_arrhenius`` → ``escape_time_arrhenius``)."""
    head, found, tail = column.partition(THEORY)
    if not found:
        raise ValueError(f"{column!r} is not a theory column: its name has no {THEORY!r} (e.g. loss_theory)")
    return head + tail


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
    approximations from H and C — and the model's ``escape`` hook (escape times; none by default)."""
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
    hook(get_model(kind), "escape")(problem, params, pred)
    return pred


def _approximations(params: Mapping[str, Any], pred: Prediction) -> None:
    """The papers' leading-order theories next to the exact one: continuous-time Lyapunov,
    detailed balance and Q (docs/physics.md §2), with λ_eff = λ/(1−μ) (leading order in momentum)."""
    approx = ("weight_cov_continuous", "weight_cov_eigenvalues_detailed_balance", "q_eigenvalues_continuous")
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
    pred.formulas["weight_cov_eigenvalues_detailed_balance"] = (
        "eigenvalues of the detailed-balance approximation (lr/2) H^-1 C (Gross 2024 Eq. 2.33), exact only "
        "when [H, C] = 0" + momentum)
    pred.formulas["q_eigenvalues_continuous"] = (
        "|eig Q| of the continuous theory, Q_ij = (w_i - w_j)/(w_i + w_j) (V'CV)_ij in H's eigenbasis "
        "(Gross 2024 Eq. 2.31); measured as (HM - MH)(1-momentum)/lr")
