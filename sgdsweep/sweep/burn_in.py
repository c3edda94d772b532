"""Burn-ins too short for the stationary state, found when a sweep is read.

A point measures the stationary state only when its burn-in has outlasted the relaxation from its
start. Each point's burn-in is counted in slowest relaxation times of the noise-free update at the
minimum, 1/(1 − ρ) (:func:`sgdsweep.models.base.burn_in_relaxations`, what ``burn_in: auto``
counts), from its data set's Hessian eigenvalues (:attr:`sgdsweep.sweep.config.Sweep.curvatures`),
for all points of a data set at once. Under
:data:`~sgdsweep.models.base.SHORT_BURN_IN` such times the measured averages may still hold
the relaxation: ``sgdsweep validate``, ``plan`` and ``run`` warn before anything is simulated, and
every simulated point stores the same number (``burn_in_relaxations``) for the report.

Points of an escape sweep (``observe.escape``) are not counted: their question is the time to
leave the minimum they start in, whatever the burn-in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sgdsweep.models.base import SHORT_BURN_IN, SHORT_BURN_IN_FIX
from sgdsweep.models.base import burn_in_relaxations as base_relaxations


def burn_in_relaxations(sweep: Any) -> dict[str, float]:
    """Point hash → its burn-in in slowest relaxation times, for every point of ``sweep`` (a
    :class:`~sgdsweep.sweep.config.Sweep`) whose data set's curvatures the sweep holds and that
    does not observe escapes (:func:`sgdsweep.models.base.burn_in_relaxations`, what each
    simulated point stores); NaN where the noise-free update is unstable."""
    by_data_set: dict[str, list[Any]] = {}
    for p in sweep.points:
        if p.data_set in sweep.curvatures and not p.params.get("observe", {}).get("escape"):
            by_data_set.setdefault(p.data_set, []).append(p)
    out: dict[str, float] = {}
    for data_set, points in by_data_set.items():
        relaxations = base_relaxations(
            sweep.curvatures[data_set], np.array([p.params["lr"] for p in points]),
            np.array([p.params.get("momentum", 0.0) for p in points]), np.array([p.burn_in for p in points]),
            np.array([float(p.params["dt_over_lr"]) if p.params.get("method") == "sde" else np.nan for p in points]))
        out.update(zip((p.hash for p in points), relaxations.tolist()))
    return out


def short_burn_in_warning(sweep: Any) -> str | None:
    """One line on the points of ``sweep`` whose burn-in is under
    :data:`~sgdsweep.models.base.SHORT_BURN_IN` relaxation times (:func:`burn_in_relaxations`):
    how many, the shortest and its point, and the fix; None when there is none."""
    relaxations = burn_in_relaxations(sweep)
    short = {h: r for h, r in relaxations.items() if r < SHORT_BURN_IN}
    if not short:
        return None
    fewest = min(short, key=short.__getitem__)
    point = next(p for p in sweep.points if p.hash == fewest)
    where = ", ".join(f"{c}={point.params[c]}" for c in sweep.coords if c in point.params)
    one = len(short) == 1
    return (f"warning: {len(short)} of {len(sweep.points)} points {'has' if one else 'have'} a burn-in under "
            f"{SHORT_BURN_IN:g} slowest relaxation times (the fewest {short[fewest]:.2g}, {point.burn_in} steps at "
            f"{where}): {'its' if one else 'their'} averages "
            "would still hold the relaxation from the start, which the stationary theory does not describe; "
            f"{SHORT_BURN_IN_FIX}")
