"""Scaling-law fits: ``weight_var = A · lr^a · batch_size^b`` with confidence intervals.

Weighted least squares of ``ln weight_var`` on ``(1, ln lr, ln batch_size)`` with weights
``(weight_var / weight_var_se)²`` (the delta-method variance of the logarithm). The parameter
covariance is ``(JᵀWJ)⁻¹`` scaled by the reduced χ² when that exceeds one (a misspecified power
law widens the intervals instead of hiding behind small standard errors); intervals use
Student's t with the residual degrees of freedom.

The *theory value* of each exponent is the same fit, with the same weights, applied to the exact
theory at the same points: the exact stationary variance is not an exact power law (discreteness
O(λω), multiplicative noise O(λσ_x²/S)), so "the theory predicts a = 1" is only the leading
order. A fit passes when the theory exponents lie inside the measured intervals.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xarray as xr
from scipy import stats

#: Leading-order exponents of weight_var ∝ lr^a · batch_size^b (physics.md §2).
LEADING_ORDER = {"a": 1.0, "b": -1.0}


def _wls(design: np.ndarray, y: np.ndarray, weights: np.ndarray):
    sw = np.sqrt(weights)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
    resid = (y - design @ coef) * sw
    return coef, float(resid @ resid)


def fit_power_law(lr: np.ndarray, batch_size: np.ndarray, value: np.ndarray, se: np.ndarray,
                  theory: np.ndarray | None = None, confidence: float = 0.95) -> dict[str, Any]:
    """Fit ``value = A · lr^a · batch_size^b``; points with non-finite or non-positive values are dropped.

    Args:
        lr, batch_size: the axes, shape (n,).
        value, se: measured values and their standard errors, shape (n,).
        theory: exact theory at the same points (optional), shape (n,); when no point has a
            finite theory value the measurements are fitted alone (theory values None).
        confidence: level of the intervals, in (0, 1).

    Returns:
        A JSON-ready dict: per parameter (``log_A``, ``a``, ``b``) the estimate, interval,
        standard error, theory value, leading-order value and whether the theory value lies
        inside; plus ``n_points``, ``dof``, ``chi2_reduced``. An exponent whose axis has a single
        value in the data is not identifiable and reported as ``None``.
    """
    lr, batch_size, value, se = (np.asarray(a, float) for a in (lr, batch_size, value, se))
    ok = np.isfinite(value) & np.isfinite(se) & (value > 0) & (se > 0) & (lr > 0) & (batch_size > 0)
    if theory is not None:
        theory = np.asarray(theory, float)
        has_theory = np.isfinite(theory) & (theory > 0)
        if has_theory[ok].any():  # fit where theory exists, so that both fits see the same points
            ok &= has_theory
        else:  # no theory for this model: fit the measurements alone
            theory = None
    columns = [("log_A", np.ones(ok.sum()))]
    if len(np.unique(lr[ok])) > 1:
        columns.append(("a", np.log(lr[ok])))
    if len(np.unique(batch_size[ok])) > 1:
        columns.append(("b", np.log(batch_size[ok])))
    names = [c[0] for c in columns]
    design = np.column_stack([c[1] for c in columns]) if ok.any() else np.zeros((0, len(columns)))
    n, k = design.shape
    result: dict[str, Any] = {"model": "weight_var = A * lr^a * batch_size^b", "n_points": int(n),
                              "dof": int(n - k), "confidence": confidence,
                              "excluded_points": int((~ok).sum())}
    params: dict[str, Any] = {name: None for name in ("log_A", "a", "b")}
    if n <= k:
        result.update({"chi2_reduced": None, "params": params,
                       "error": f"{n} usable points for {k} parameters: nothing to fit"})
        return result
    y = np.log(value[ok])
    weights = (value[ok] / se[ok]) ** 2
    coef, chi2 = _wls(design, y, weights)
    dof = n - k
    chi2_red = chi2 / dof if dof > 0 else math.nan
    cov = np.linalg.inv(design.T @ (design * weights[:, None]))
    if dof > 0 and chi2_red > 1:
        cov *= chi2_red
    tq = stats.t.ppf(0.5 + confidence / 2, dof) if dof > 0 else math.inf
    theory_coef = _wls(design, np.log(theory[ok]), weights)[0] if theory is not None else None
    for i, name in enumerate(names):
        err = float(np.sqrt(cov[i, i]))
        lo, hi = float(coef[i] - tq * err), float(coef[i] + tq * err)
        th = float(theory_coef[i]) if theory_coef is not None else None
        params[name] = {
            "estimate": float(coef[i]), "stderr": err, "interval": [lo, hi],
            "theory": th, "leading_order": LEADING_ORDER.get(name),
            "theory_inside": (lo <= th <= hi) if th is not None else None,
        }
    result.update({"chi2_reduced": float(chi2_red), "params": params})
    return result


def groups(ds: xr.Dataset, fitted_axes: tuple[str, ...]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Split the points by the values of every swept axis that is not fitted.

    Points that differ in momentum, P/N, noise, … obey different laws; pooling them would mix
    amplitudes and exponents. Returns (group values, boolean mask over points) pairs.
    """
    swept = json.loads(ds.attrs.get("swept_axes", "[]"))
    other = [a for a in swept if a not in fitted_axes and a in ds.coords]
    if not other:
        return [({}, np.ones(ds.sizes["point"], bool))]
    keys = list(zip(*(ds[a].values.tolist() for a in other)))
    out = []
    for key in dict.fromkeys(keys):
        mask = np.array([k == key for k in keys])
        out.append((dict(zip(other, key)), mask))
    return out


def fit_ensemble(ds: xr.Dataset, fit_config: dict[str, Any]) -> dict[str, Any]:
    """Run the fits that ``fit_config`` (the config's ``fit`` section) enables on an ensemble.

    Returns ``{"power_law": [result per group of the other swept axes, each with "group"]}``.
    """
    out: dict[str, Any] = {}
    pl = fit_config.get("power_law", {})
    if pl.get("enabled", True):
        results = []
        diverged = ds["diverged"].values.astype(bool)
        for group, mask in groups(ds, ("lr", "batch_size")):
            keep = mask & ~diverged
            res = fit_power_law(ds["lr"].values[keep], ds["batch_size"].values[keep],
                                ds["weight_var"].values[keep], ds["weight_var_se"].values[keep],
                                ds["weight_var_theory"].values[keep], pl.get("confidence", 0.95))
            res["group"] = group
            res["excluded_diverged"] = int((mask & diverged).sum())
            results.append(res)
        out["power_law"] = results
    return out
