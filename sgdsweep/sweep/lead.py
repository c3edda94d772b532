"""What leads a report: the question a sweep asks, as the config's ``report.lead``.

Each value of :data:`LEADS` names an observable and the figure that answers its question; the
report's first screen is a headline sentence on it (measured value, theory value, agreement:
:mod:`sgdsweep.analysis.headline`) above that figure. ``auto`` (the default) resolves from what
the sweep measured and fitted (:func:`resolve`), in the order of :data:`AUTO_ORDER`:

=============  ==================================================================================
``escape``     a landscape whose escape fit ran (escape time against 1/λ)
``fdr``        gradient noise observed (the fluctuation–dissipation relation of Han et al.)
``isotropy``   two_layer (isotropic joint fluctuations on the range of Γ, Gross et al.)
``wigner``     a degenerate pair fitted (matrix: Binder cumulant and Wigner surmise, Park et al.)
``flatness``   ψ fitted (the inverse variance–flatness relation)
``momentum``   momentum swept at a single λ/S (variance against μ and the exact stability edge)
``weight_var`` everything else (weight variance against λ/S, or against the swept axis when
               λ/S takes one value)
=============  ==================================================================================

``loss`` and ``spectrum`` are chosen only by name. :func:`check` refuses, before anything runs, a
lead that the sweep cannot draw (a :class:`~sgdsweep.errors.ConfigError` naming the key, the
value and what it needs); the schema's enum of ``report.lead`` is :data:`LEADS`' keys.

Light on imports: :mod:`sgdsweep.sweep.config` calls :func:`check` for every config, and the report
(:mod:`sgdsweep.analysis.headline`) calls :func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.errors import ConfigError

#: Every value of ``report.lead``, with what the report then leads with.
LEADS: dict[str, str] = {
    "auto": "chosen from what the sweep measured and fitted (escape, fdr, isotropy, wigner, flatness, momentum, "
            "else weight_var)",
    "weight_var": "weight variance against λ/S (against the swept axis when λ/S takes one value) and the exact theory",
    "loss": "training loss against the swept axis and the exact theory",
    "momentum": "weight variance against the momentum μ at one λ/S, and the exact stability edge in μ",
    "escape": "escape time: ln(λτ) against 1/λ, the exact discrete chain's τ and Kramers' law",
    "isotropy": "two layers: the joint fluctuation eigenvalues on the range of Γ against their isotropic value "
                "λ⟨r²⟩/(2S)",
    "flatness": "the variance–flatness exponent ψ against its exact value",
    "spectrum": "the covariance eigenvalues against the swept axis, the exact theory and its approximations",
    "fdr": "the fluctuation–dissipation residual against its exact value, the gradient noise's whiteness and Q",
    "wigner": "the degenerate pair: Binder cumulant against −4/27 and spacings against the Wigner surmise",
}
#: The order in which ``auto`` tries the leads (:func:`resolve`); ``weight_var`` when none fits.
AUTO_ORDER = ("escape", "fdr", "isotropy", "wigner", "flatness", "momentum")


def _finite(ds: Any, name: str) -> bool:
    return name in ds and bool(np.isfinite(np.asarray(ds[name].values, float)).any())


def varying(ds: Any, axis: str) -> bool:
    """Whether ``axis`` is a coordinate of ``ds`` with more than one value."""
    return axis in ds.coords and len(set(np.asarray(ds[axis].values).tolist())) > 1


def single_ratio(ds: Any) -> bool:
    """Whether every point has the same λ/S."""
    ratio = np.asarray(ds["lr"].values, float) / np.asarray(ds["batch_size"].values, float)
    return bool(np.unique(ratio).size < 2)


def _fitted(fits: Mapping[str, Any], kind: str) -> bool:
    return any(r.get("params") and not r.get("error") for r in fits.get(kind) or [])


def _applies(lead: str, ds: Any, fits: Mapping[str, Any]) -> bool:
    """Whether the data hold what ``lead`` draws (used by ``auto``)."""
    if lead in ("escape", "wigner", "flatness"):
        return _fitted(fits, lead)
    if lead == "fdr":
        return _finite(ds, "fdr_residual")
    if lead == "isotropy":
        return _finite(ds, "joint_eigenvalue") and _finite(ds, "joint_eigenvalue_theory")
    if lead == "momentum":
        return varying(ds, "momentum") and single_ratio(ds) and _finite(ds, "weight_var")
    return False


def resolve(requested: str | None, ds: Any, fits: Mapping[str, Any]) -> str:
    """The lead of the report: ``requested`` unless it is ``auto`` (or None), else the first of
    :data:`AUTO_ORDER` that the ensemble ``ds`` and the fits hold, else ``weight_var`` (or
    ``loss`` when there is no weight variance)."""
    if requested and requested != "auto":
        return requested
    for lead in AUTO_ORDER:
        if _applies(lead, ds, fits):
            return lead
    return "weight_var" if _finite(ds, "weight_var") else "loss"


def check(cfg: Mapping[str, Any], kind: str, observe: Mapping[str, Any],
          values: Mapping[str, set[Any]]) -> None:
    """Raise :class:`ConfigError` when ``report.lead`` names a lead this sweep cannot draw.

    Args:
        cfg: the config, defaults filled (its ``report.lead`` and ``fit`` sections are read).
        kind: the model kind.
        observe: ``dynamics.observe`` with ``escape: auto`` resolved.
        values: per axis, the set of values the sweep's points take.
    """
    lead = cfg["report"].get("lead", "auto")
    fit = cfg.get("fit", {})
    needs = {
        "escape": (bool(observe.get("escape")) and fit.get("escape", {}).get("enabled", True),
                   ("escape times observed and fitted (a landscape model, dynamics.observe.escape and fit.escape "
                   "enabled)")),
        "fdr": (bool(observe.get("gradient_noise")), "dynamics.observe.gradient_noise: true"),
        "loss": (bool(observe.get("loss", True)), "dynamics.observe.loss: true"),
        "momentum": (len(values.get("momentum", ())) > 1, "momentum swept over at least two values in grid or points"),
        "isotropy": (kind == "two_layer", "model.kind two_layer (the joint fluctuations of two layers)"),
        "wigner": (fit.get("wigner", {}).get("enabled", True), "fit.wigner enabled"),
        "flatness": (fit.get("flatness", {}).get("enabled", True), "fit.flatness enabled"),
    }
    ok, what = needs.get(lead, (True, ""))
    if not ok:
        raise ConfigError("report.lead", lead, f"a lead this sweep can draw; '{lead}' needs {what}",
                          "Choose another lead (auto picks one from the sweep): "
                          + ", ".join(LEADS) + ".")
