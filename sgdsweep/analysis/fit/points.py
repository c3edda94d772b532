"""Point-by-point agreement of a measured variable with its exact theory: one comparison per variable.

The report's headline (:mod:`sgdsweep.analysis.headline`) states, for the variable its lead is
about, the point that deviates most from the exact theory. That statement is a test too, so it
is made here, beside the fits, and enters the report's family of comparisons
(:mod:`sgdsweep.analysis.fit.family`) like any fitted quantity: the headline says "disagrees"
only where the family's Holm procedure rejects it.

For the n points with a measurement, its SE and a theory (and no diverged replica), each
``zᵢ = (mean − theory)/SE`` is Student's t on the point's replicas less one (normal without
per-replica values); the comparison's p-value is that of the largest |zᵢ| among n independent
ones (Šidák): ``1 − (1 − p_min)ⁿ``, p_min the smallest two-sided p-value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.fit.common import two_sided_pvalue
from sgdsweep.models.base import SHORT_BURN_IN, SHORT_BURN_IN_FIX

#: (variable, its exact theory) that a headline may state point by point. The loss is checked
#: beside the weight variance: the report chooses its lead (``report.lead: loss`` on a model with
#: both), and the fits, made before it, cannot know which the headline states. The joint
#: eigenvalue's and the FDR residual's predictions are leading-order, not exact: a headline states
#: how far the measurements deviate from them, and never calls that a disagreement.
CHECKS: tuple[tuple[str, str], ...] = (
    ("weight_var", "weight_var_theory"), ("loss", "loss_theory"), ("escape_time", "escape_time_theory_exact"))


def point_agreement(ds: xr.Dataset, name: str, theory: str, keep: np.ndarray) -> dict[str, Any] | None:
    """The agreement of ``name`` (± ``name_se``) with ``theory`` over the points ``keep`` (boolean,
    per point) where all three are finite (module docstring); None where no point has them."""
    if name not in ds or theory not in ds or f"{name}_se" not in ds:
        return None
    m, se, t = (np.asarray(ds[v].values, float) for v in (name, f"{name}_se", theory))
    use = keep & np.isfinite(m) & np.isfinite(se) & (se > 0) & np.isfinite(t) & (t != 0)
    if not use.any():
        return None
    idx = np.flatnonzero(use)
    z = (m[idx] - t[idx]) / se[idx]
    table = f"{name}_replica"
    dof = (np.isfinite(np.asarray(ds[table].values, float)[idx]).sum(axis=1) - 1 if table in ds
           else np.zeros(idx.size, int))
    p = np.array([two_sided_pvalue(float(zi), int(d) if d > 0 else None) for zi, d in zip(z, dof)])
    worst = int(np.argmax(np.abs(z)))
    p_min = float(p.min())
    pvalue = float(-math.expm1(idx.size * math.log1p(-p_min))) if p_min < 1 else 1.0
    return {"variable": name, "theory": theory, "n_points": int(idx.size), "max_abs_z": float(abs(z[worst])),
            "worst_point": str(ds["point"].values[idx[worst]]), "pvalue": pvalue, "group": {}}


def point_checks(ds: xr.Dataset, diverged: np.ndarray) -> list[dict[str, Any]]:
    """Every check of :data:`CHECKS` the ensemble supports, over the points without a diverged replica."""
    out = []
    for name, theory in CHECKS:
        found = point_agreement(ds, name, theory, ~diverged)
        if found is not None:
            out.append(found)
    return out


def short_burn_in(ds: xr.Dataset) -> np.ndarray:
    """Per point, whether its burn-in is short: under :data:`~sgdsweep.models.base.SHORT_BURN_IN`
    slowest relaxation times (``burn_in_relaxations``); all False for an ensemble without that
    variable (written before it was stored). A point that observes escapes (``escaped_fraction``
    stored) is never short: its replicas are meant to leave the minimum they start in, its burn-in
    (0 in every escape sweep) is no fault, and a disagreement with the stationary theory there is
    the escapes'."""
    if "burn_in_relaxations" not in ds:
        return np.zeros(ds.sizes["point"], bool)
    with np.errstate(invalid="ignore"):
        short = np.asarray(ds["burn_in_relaxations"].values, float) < SHORT_BURN_IN
    if "escaped_fraction" in ds:
        short &= ~np.isfinite(np.asarray(ds["escaped_fraction"].values, float))
    return short


def short_burn_in_note(ds: xr.Dataset, keep: np.ndarray, where: Callable[[int], str]) -> str | None:
    """A sentence on the points of ``keep`` (boolean, per point) whose burn-in is short
    (:func:`short_burn_in`): how many, the shortest (in relaxation times) and ``where(i)`` it is,
    and what to do; None when there is none."""
    short = short_burn_in(ds) & keep
    if not short.any():
        return None
    idx = np.flatnonzero(short)
    rel = np.asarray(ds["burn_in_relaxations"].values, float)
    fewest = idx[int(np.argmin(rel[idx]))]
    at = where(int(fewest))
    one = idx.size == 1
    return (f"{idx.size} of {int(keep.sum())} points {'has' if one else 'have'} a burn-in under {SHORT_BURN_IN:g} "
            f"slowest relaxation times (burn_in_relaxations; the fewest {rel[fewest]:.2g}"
            f"{' at ' + at if at else ''}): {'its' if one else 'their'} averages may "
            "still hold the relaxation from the start, which the stationary theory does not describe; "
            + SHORT_BURN_IN_FIX)
