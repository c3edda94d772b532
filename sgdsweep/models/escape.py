"""What the escape theories of the landscapes share (docs/physics.md §6): where each law holds,
and how a point's exact discrete-chain escape time is recorded.

Each landscape problem (:mod:`sgdsweep.models.landscape`) owns its escape theory: its method
``escape_theory(params, pred)`` fills the escape-time fields of the
:class:`~sgdsweep.models.predict.Prediction` (``escape_time_arrhenius``, ``escape_time_powerlaw``,
``escape_time_exact``, ``escape_time_exact_matched``: each field's name is also the key of its
formula and reason, and its stored column is ``escape_time_theory_<law>``); the landscape model's
``escape`` hook asks it. The helpers here hold what no single landscape owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgdsweep.models.predict import Prediction
    from sgdsweep.theory.escape_exact import ExactEscape

#: the escape laws: each law's field of the Prediction is ``escape_time_<law>``, its stored column
#: ``escape_time_theory_<law>`` (:func:`sgdsweep.models.predict.theory_column`)
LAWS = ("arrhenius", "powerlaw", "exact", "exact_matched")
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
#: why a landscape with additive noise has no power law
NO_POWERLAW = ("the state-dependent law needs SGD's own noise at a minimum with L_min > 0 (the thesis landscape); "
               "this landscape has additive noise")


def laws_absent(params: Mapping[str, Any], powerlaw: bool) -> dict[str, str]:
    """Why each escape law does not hold at this point: ``{"escape_time_arrhenius": reason,
    "escape_time_powerlaw": reason}``, a key absent where the law holds; ``powerlaw``: whether
    the landscape has the state-dependent noise Mori's law is for (a minimum with L_min > 0).

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
    if not powerlaw:
        out["escape_time_powerlaw"] = NO_POWERLAW
    elif noise not in POWERLAW_NOISE and "escape_time_powerlaw" not in out:
        out["escape_time_powerlaw"] = ("Mori's law is for the state-dependent minibatch noise covariance with "
                                       "independent steps and a Gaussian diffusion limit "
                                       f"({', '.join(POWERLAW_NOISE)}); {noise} is not")
    return out


def record_exact(pred: Prediction, column: str, result: ExactEscape | None, note: str) -> None:
    """Record the exact discrete-chain escape time of a point
    (:func:`sgdsweep.theory.escape_exact.for_point`'s ``(column, result, note)``): in
    ``escape_time_exact``, or ``escape_time_exact_matched`` for the Gaussian-matched approximation
    of sampled noise (``column`` ``matched``), with the other's reason."""
    key = "escape_time_exact_matched" if column == "matched" else "escape_time_exact"
    other = "escape_time_exact" if column == "matched" else "escape_time_exact_matched"
    pred.reasons[other] = ("sampled noise has no exact kernel here; see escape_time_exact_matched"
                           if column == "matched" else
                           "the matched approximation is for sampled (minibatch) noise on a data landscape")
    if result is None:
        pred.reasons[key] = note
        return
    pred.formulas[key] = note
    setattr(pred, key, result.steps)
