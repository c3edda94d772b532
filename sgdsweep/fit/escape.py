"""ln τ against 1/λ: the escape-time fit and which escape law it supports (physics.md §6).

In time units ``t = λ·steps`` both laws are straight lines in ``1/λ`` at fixed S:

- Arrhenius/Kramers with T = λσ²/(2S): ``ln(λτ) = ln(2π/√(k_a|k_b|)) + (2SΔL/σ²)·(1/λ)``;
- Mori's state-dependent law: ``ln(λτ) = const + (S ln(L_saddle/L_min)/h*)·(1/λ)`` (slope only).

So the fit is weighted least squares of ``ln(λ τ)`` on ``(1, 1/λ)``, τ the censored
maximum-likelihood mean escape time in steps, with weights ``(τ/se)²`` = number escaped.
Points where no replica escaped carry no finite estimate and are excluded (and counted). The
theory slopes are the same fit applied to each law's per-point prediction; a law is supported
when its slope lies inside the interval.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .common import boot_sd, parameter, resample_indices, t_quantile, wls, wls_many


def resampled_escape_times(times: np.ndarray, escaped: np.ndarray, n_boot: int,
                           rng: np.random.Generator) -> np.ndarray:
    """Censored MLE τ = Σ times / Σ escaped over bootstrap resamples of each point's replicas.

    ``times`` (n, R): per-replica escape time (censored ones at the cap), finite values first;
    ``escaped`` (n, R): whether the replica escaped. Returns (n_boot, n), inf without escapes.
    """
    counts = np.isfinite(times).sum(axis=1)
    idx = resample_indices(counts, times.shape[1], n_boot, rng)
    used = np.arange(times.shape[1])[None, None, :] < counts[None, :, None]
    t = np.take_along_axis(np.broadcast_to(np.nan_to_num(times), (n_boot,) + times.shape), idx, axis=2)
    e = np.take_along_axis(np.broadcast_to(escaped, (n_boot,) + times.shape), idx, axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(used, t, 0).sum(axis=2) / np.where(used, e, 0).sum(axis=2)


def fit_escape(lr: np.ndarray, tau: np.ndarray, tau_se: np.ndarray, *, theory_arrhenius: np.ndarray | None = None,
               theory_powerlaw: np.ndarray | None = None, confidence: float = 0.95,
               times: np.ndarray | None = None, escaped: np.ndarray | None = None, bootstrap: int = 0,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Fit ``ln(λτ) = intercept + slope/λ`` (module docstring).

    Args:
        lr: learning rates, shape (n,); tau, tau_se: mean escape time in steps and its SE.
        theory_arrhenius, theory_powerlaw: per-point predictions in steps (NaN where absent).
        times, escaped: per-replica escape times in steps (censored at the cap, finite first)
            and escape flags, shape (n, R), for bootstrap intervals.

    Returns:
        JSON-ready dict: ``params`` slope and intercept (theory = Arrhenius fit; the slope also
        has ``theory_powerlaw`` and ``theory_powerlaw_inside``), ``supported_laws``,
        ``n_points``, ``excluded_points`` (no escape, or no finite SE), ``chi2_reduced``.
    """
    lr, tau, tau_se = (np.asarray(a, float) for a in (lr, tau, tau_se))
    ok = np.isfinite(tau) & (tau > 0) & np.isfinite(tau_se) & (tau_se > 0) & (lr > 0)
    keep = np.flatnonzero(ok)
    result: dict[str, Any] = {"model": "ln(lr * escape_time) = intercept + slope / lr", "confidence": confidence,
                              "n_points": int(keep.size), "excluded_points": int((~ok).sum())}
    if np.unique(lr[keep]).size < 2:
        result["error"] = f"{np.unique(lr[keep]).size} distinct learning rate(s) with escapes: nothing to fit"
        return result
    design = np.column_stack([np.ones(keep.size), 1.0 / lr[keep]])
    y = np.log(lr[keep] * tau[keep])
    weights = (tau[keep] / tau_se[keep]) ** 2
    coef, chi2 = wls(design, y, weights)
    dof = keep.size - 2
    cov = np.linalg.inv(design.T @ (design * weights[:, None]))
    chi2_red = chi2 / dof if dof > 0 else math.nan
    if dof > 0 and chi2_red > 1:
        cov *= chi2_red
    tq = t_quantile(0.5 + confidence / 2, dof) if dof > 0 else math.inf

    def theory_fit(th: np.ndarray | None) -> np.ndarray | None:
        if th is None:
            return None
        th = np.asarray(th, float)[keep]
        if not np.all(np.isfinite(th) & (th > 0)):
            return None
        return wls(design, np.log(lr[keep] * th), weights)[0]

    arr, pw = theory_fit(theory_arrhenius), theory_fit(theory_powerlaw)
    sd, method = np.sqrt(np.diag(cov)), "analytic"
    if times is not None and escaped is not None and bootstrap > 0:
        taus = resampled_escape_times(np.asarray(times, float)[keep], np.asarray(escaped, bool)[keep], bootstrap,
                                      rng if rng is not None else np.random.default_rng(0))
        with np.errstate(divide="ignore", invalid="ignore"):
            ys = np.log(lr[keep][None, :] * taus)
        good = np.all(np.isfinite(ys), axis=1)
        if good.sum() >= 10:
            sd, method = boot_sd(wls_many(design, ys[good], weights)), "bootstrap"
    quantile = tq if method == "analytic" else None
    params = {
        "intercept": parameter(float(coef[0]), float(sd[0]), confidence, method,
                               theory=float(arr[0]) if arr is not None else None, quantile=quantile),
        "slope": parameter(float(coef[1]), float(sd[1]), confidence, method,
                           theory=float(arr[1]) if arr is not None else None, quantile=quantile),
    }
    lo, hi = params["slope"]["interval"]
    params["slope"]["theory_powerlaw"] = float(pw[1]) if pw is not None else None
    params["slope"]["theory_powerlaw_inside"] = (bool(lo <= pw[1] <= hi) if pw is not None and lo is not None
                                                 else None)
    supported = [name for name, inside in (("arrhenius", params["slope"]["theory_inside"]),
                                           ("powerlaw", params["slope"]["theory_powerlaw_inside"])) if inside]
    result.update({"params": params, "dof": int(dof), "chi2_reduced": float(chi2_red) if dof > 0 else None,
                   "supported_laws": supported,
                   "bootstrap": int(bootstrap) if method == "bootstrap" else 0})
    return result
