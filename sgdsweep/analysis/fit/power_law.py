"""Power-law fit ``value = A · lr^a · batch_size^b`` with confidence intervals.

Weighted least squares of ``ln value`` on ``(1, ln lr, ln batch_size)`` with weights
``(value / se)²`` (the delta-method variance of the logarithm).

Intervals: with per-replica values the fit is repeated on bootstrap resamples of the replicas,
its weights recomputed from each resample's SEs, and the interval is ``estimate ± z·sd_boot``
(``interval_method: bootstrap``); fixed weights made the intervals 4 % too narrow
(``benchmarks/calibration.py``). Otherwise the
analytic covariance ``(JᵀWJ)⁻¹`` is used, scaled by the reduced χ² when that exceeds one (a
misspecified power law widens the intervals instead of hiding behind small standard errors),
with Student's t on the residual degrees of freedom (``interval_method: analytic``). Both are
reported; χ²/dof says whether a power law describes the data within their errors at all.

The *theory value* of each exponent is the same fit, with the same weights, applied to the
exact theory at the same points: the exact stationary variance is not an exact power law
(discreteness O(λω), multiplicative noise O(λσ_x²/S)), so "the theory predicts a = 1" is only
the leading order (also reported). A fit passes when the theory exponents lie inside the
intervals.

Goodness of fit. ``chi2_pvalue`` is P(χ²_dof ≥ χ²) of the power law itself: a small value rejects a
*pure* power law. With a theory, ``agreement_chi2_reduced`` and ``agreement_pvalue`` compare the
measurements with the exact theory point by point (χ² = Σ((value − theory)/se)² over the fitted
points, n degrees of freedom): when the power law is rejected but the measurements agree with the
exact theory, the deviations from a power law are those the exact theory predicts.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sgdsweep.analysis.fit.common import (
    boot_sd,
    parameter,
    resampled_means,
    t_as_normal,
    wls,
    wls_many,
)

#: Leading-order exponents of weight_var ∝ lr^a · batch_size^b (docs/physics.md §2).
LEADING_ORDER = {"a": 1.0, "b": -1.0}


def _chi2_pvalue(chi2: float, dof: int) -> float | None:
    """P(χ²_dof ≥ chi2): the goodness of fit (None without degrees of freedom; scipy.special's
    ``chdtrc``, which ``scipy.stats.chi2.sf`` calls: see :mod:`sgdsweep.analysis.fit.common`)."""
    from scipy import special

    return float(special.chdtrc(dof, chi2)) if dof > 0 else None


def fit_power_law(lr: np.ndarray, batch_size: np.ndarray, value: np.ndarray, se: np.ndarray,
                  theory: np.ndarray | None = None, confidence: float = 0.95, *,
                  replicas: np.ndarray | None = None, bootstrap: int = 0,
                  rng: np.random.Generator | None = None,
                  leading_order: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit ``value = A · lr^a · batch_size^b``; points with non-finite or non-positive values are dropped.

    Args:
        lr, batch_size: the axes, shape (n,).
        value, se: measured values and their standard errors, shape (n,).
        theory: exact theory at the same points (optional), shape (n,); when no point has a
            finite theory value the measurements are fitted alone (theory values None).
        confidence: level of the intervals, in (0, 1).
        replicas: per-replica values (n, R), finite values first (``common.replica_table``);
            ``value`` must be their mean. With ``bootstrap`` > 0 the intervals come from
            ``bootstrap`` resamples of the replicas.
        rng: random generator of the resampling (fixed seed → reproducible intervals).
        leading_order: leading-order exponents (default ``{"a": 1, "b": -1}``, docs/physics.md §2).

    Returns:
        A JSON-ready dict: per parameter (``log_A``, ``a``, ``b``) the estimate, standard error,
        interval (and the analytic one), theory value, leading-order value and whether the
        theory lies inside; plus ``n_points``, ``dof``, ``chi2_reduced``, ``chi2_pvalue`` and,
        with a theory, ``agreement_chi2_reduced`` and ``agreement_pvalue`` (module docstring).
        An exponent whose axis has a single value in the data is not identifiable: ``None``.
    """
    leading = LEADING_ORDER if leading_order is None else leading_order
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
    result: dict[str, Any] = {"model": "value = A * lr^a * batch_size^b", "n_points": int(n),
                              "dof": int(n - k), "confidence": confidence,
                              "excluded_points": int((~ok).sum())}
    params: dict[str, Any] = {name: None for name in ("log_A", "a", "b")}
    if n <= k:
        result.update({"chi2_reduced": None, "chi2_pvalue": None, "params": params,
                       "error": f"{n} usable points for {k} parameters: nothing to fit"})
        return result
    y = np.log(value[ok])
    weights = (value[ok] / se[ok]) ** 2
    coef, chi2 = wls(design, y, weights)
    dof = n - k
    chi2_red = chi2 / dof if dof > 0 else math.nan
    cov = np.linalg.inv(design.T @ (design * weights[:, None]))
    if dof > 0 and chi2_red > 1:
        cov *= chi2_red
    theory_coef = wls(design, np.log(theory[ok]), weights)[0] if theory is not None else None
    boot = None
    if replicas is not None and bootstrap > 0:
        means, ses = resampled_means(np.asarray(replicas, float)[ok], bootstrap,
                                     rng if rng is not None else np.random.default_rng(0))
        with np.errstate(invalid="ignore", divide="ignore"):
            logs, resampled_weights = np.log(means), (means / ses) ** 2
        good = np.all(np.isfinite(logs) & np.isfinite(resampled_weights) & (resampled_weights > 0), axis=1)
        if good.sum() >= 10:
            boot = boot_sd(wls_many(design, logs[good], resampled_weights[good]))
    for i, name in enumerate(names):
        th = float(theory_coef[i]) if theory_coef is not None else None
        analytic = parameter(float(coef[i]), float(np.sqrt(cov[i, i])), confidence, "analytic",
                             theory=th, leading_order=leading.get(name), dof=dof)
        if boot is not None:
            params[name] = parameter(float(coef[i]), float(boot[i]), confidence, "bootstrap",
                                     theory=th, leading_order=leading.get(name))
            params[name]["interval_analytic"] = analytic["interval"]
        else:
            params[name] = analytic
    if theory is not None:
        z = (value[ok] - theory[ok]) / se[ok]
        if replicas is not None:  # each z is Student's t on (replicas − 1): read it as a normal one
            z = t_as_normal(z, np.isfinite(np.asarray(replicas, float)[ok]).sum(axis=1) - 1)
        agreement = float(np.sum(z**2))
        result.update({"agreement_chi2_reduced": agreement / n, "agreement_pvalue": _chi2_pvalue(agreement, n)})
    result.update({"chi2_reduced": float(chi2_red),
                   "chi2_pvalue": _chi2_pvalue(chi2, dof),
                   "bootstrap": int(bootstrap) if boot is not None else 0, "params": params})
    return result
