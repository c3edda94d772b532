"""Scaling-law fits on an ensemble, each declared in the config's ``fit`` section.

=================  ===========================================================  ===================
fit                what                                                         groups
=================  ===========================================================  ===================
power_law          weight_var = A·λ^a·S^b, exponents vs exact theory & 1, −1    other swept axes
linear_scaling     spread of weight_var among points with equal λ/S             other swept axes
momentum_scaling   spread among points with equal λ/((1−μ)S)                   other swept axes
escape             ln(λτ) against 1/λ: slope/intercept vs Kramers & Mori        other swept axes
wigner             Binder cumulant (−4/27) and KS vs the Wigner surmise         per point
flatness           inverse variance–flatness exponent ψ (2 for two layers)      per point
=================  ===========================================================  ===================

Each fit runs when its ``enabled`` is true (the default), except flatness on a single-layer model:
one layer has no inverse variance–flatness relation to test, so ψ is fitted there only when asked
for by naming the layer (``fit.flatness.layer: all``); otherwise it is listed under ``skipped``.

Every fit is vectorised over the axes it does not fit (one result per group of their values),
skips diverged points, states the theory value and whether it lies inside the interval, and
draws its bootstrap resamples from a fixed seed (the same ensemble gives the same fits). A fit
the data cannot support (no escapes recorded, one point per λ/S class, …) is listed under
``skipped`` with the reason instead of failing the workflow.
"""

from __future__ import annotations

import importlib
from typing import Any

#: What the package offers, and the module of each (imported on first use, so that reading
#: verdicts — ``sgdsweep run``'s summary — does not import xarray and the fits).
_EXPORTS = {"fit_ensemble": "ensemble", "SINGLE_LAYER_FLATNESS": "ensemble", "BOOTSTRAP_SEED": "ensemble",
            "fit_collapse": "collapse", "fit_escape": "escape", "fit_power_law": "power_law",
            "fit_flatness": "spectra", "fit_wigner": "spectra", "groups": "common",
            "Verdict": "verdict", "assess": "verdict", "verdicts": "verdict"}

__all__ = ["BOOTSTRAP_SEED", "SINGLE_LAYER_FLATNESS", "Verdict", "assess", "fit_collapse", "fit_ensemble", "fit_escape",
           "fit_flatness", "fit_power_law", "fit_wigner", "groups", "verdicts"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
