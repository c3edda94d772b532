"""Collapse of curves onto one scaling variable: one number for the spread, with its uncertainty.

The linear scaling rule says the stationary weight variance depends on λ and S only through
``x = λ/S`` (and, with momentum, through ``λ/((1−μ)S)``). Points that share ``x`` then have equal
values. The statistic is the pooled variance of ``ln value`` among points with equal ``x``,
corrected for the measurement noise so that a perfect collapse has expectation 0::

    Δ² = Σ_c [ Σ_{i∈c} (ln v_i − mean_c ln v)² − (1 − 1/n_c) Σ_{i∈c} s_i² ] / Σ_c (n_c − 1)

with ``s_i = se_i / v_i`` and classes ``c`` of at least two points. ``√Δ²`` is the typical
relative deviation from the collapse (0.05 = 5 %). The theory value is the same statistic of
the exact theory at the same points (no noise to remove); the leading-order value is 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sgdsweep.analysis.fit.common import boot_sd, parameter, resampled_means


def collapse_classes(x: np.ndarray) -> list[np.ndarray]:
    """Indices of the points in each class of equal ``x`` (to 9 significant digits) with ≥ 2 points."""
    keys = np.array([float(f"{v:.9g}") for v in np.asarray(x, float)])
    out = []
    for k in dict.fromkeys(keys.tolist()):
        idx = np.flatnonzero(keys == k)
        if idx.size >= 2:
            out.append(idx)
    return out


def _spread2(logv: np.ndarray, rel_var: np.ndarray | None, classes: list[np.ndarray]) -> np.ndarray:
    """Δ² for log values logv (..., n); rel_var (n,) the noise variance of each log value (None: no correction)."""
    ss = np.zeros(logv.shape[:-1])
    dof = 0
    for idx in classes:
        y = logv[..., idx]
        ss = ss + ((y - y.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
        if rel_var is not None:
            ss = ss - (1 - 1 / idx.size) * rel_var[idx].sum()
        dof += idx.size - 1
    return ss / dof


def fit_collapse(x: np.ndarray, value: np.ndarray, se: np.ndarray, theory: np.ndarray | None = None,
                 confidence: float = 0.95, *, replicas: np.ndarray | None = None, bootstrap: int = 0,
                 rng: np.random.Generator | None = None, variable: str = "lr/batch_size") -> dict[str, Any]:
    """Spread Δ² of ``ln value`` among points with equal scaling variable ``x`` (module docstring).

    Args:
        x: the scaling variable per point (λ/S, or λ/((1−μ)S)), shape (n,).
        value, se: measured values (> 0) and standard errors, shape (n,).
        theory: exact theory at the same points, or None.
        replicas: per-replica values (n, R), finite first; with ``bootstrap`` > 0 the standard
            error of Δ² comes from resampling them, otherwise from Gaussian error propagation.
        variable: how ``x`` is built, for the summary.

    Returns:
        JSON-ready dict with ``params["spread2"]`` (estimate, interval, theory, leading order 0,
        inside), ``relative_spread`` (√Δ², or 0 when Δ² ≤ 0), ``n_classes``, ``n_points``, or
        ``error`` when no two usable points share ``x``.
    """
    x, value, se = (np.asarray(a, float) for a in (x, value, se))
    ok = np.isfinite(value) & np.isfinite(se) & (value > 0) & (se > 0) & np.isfinite(x)
    if theory is not None:
        theory = np.asarray(theory, float)
        has = np.isfinite(theory) & (theory > 0)
        if has[ok].any():
            ok &= has
        else:
            theory = None
    keep = np.flatnonzero(ok)
    classes = collapse_classes(x[keep])
    result: dict[str, Any] = {"statistic": "pooled variance of ln(value) among points with equal " + variable
                              + ", noise removed", "variable": variable, "confidence": confidence,
                              "n_classes": len(classes), "n_points": int(sum(c.size for c in classes))}
    if not classes:
        result["error"] = f"no two usable points share the same {variable}: nothing to collapse"
        return result
    v, s = value[keep], se[keep]
    rel_var = (s / v) ** 2
    est = float(_spread2(np.log(v), rel_var, classes))
    th = float(_spread2(np.log(theory[keep]), None, classes)) if theory is not None else None
    sd, method = math.nan, "analytic"
    if replicas is not None and bootstrap > 0:
        means = resampled_means(np.asarray(replicas, float)[keep], bootstrap,
                                rng if rng is not None else np.random.default_rng(0))
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = _spread2(np.log(means), rel_var, classes)
        if np.isfinite(boot).sum() >= 10:
            sd, method = float(boot_sd(boot)), "bootstrap"
    if method == "analytic":  # Gaussian noise: Var SS_c ≈ 2(n_c−1)s̄⁴ + 4 SS_c s̄²
        var, dof = 0.0, 0
        for idx in classes:
            y = np.log(v[idx])
            ss_c = float(((y - y.mean()) ** 2).sum())
            s2 = float(rel_var[idx].mean())
            var += 2 * (idx.size - 1) * s2**2 + 4 * max(ss_c, 0.0) * s2
            dof += idx.size - 1
        sd = math.sqrt(var) / dof
    result["params"] = {"spread2": parameter(est, sd, confidence, method, theory=th, leading_order=0.0)}
    result["relative_spread"] = math.sqrt(max(est, 0.0))
    result["relative_spread_theory"] = math.sqrt(max(th, 0.0)) if th is not None else None
    result["noise_floor"] = float(np.sqrt(rel_var[np.concatenate(classes)].mean()))
    return result
