"""ln τ against 1/λ: the escape-time fit and which escape law it supports (docs/physics.md §6).

In time units ``t = λ·steps`` both laws are straight lines in ``1/λ`` at fixed S:

- Arrhenius/Kramers with T = λσ²/(2S): ``ln(λτ) = ln(2π/√(k_a|k_b|)) + (2SΔL/σ²)·(1/λ)``;
- Mori's state-dependent law: ``ln(λτ) = const + (S ln(L_saddle/L_min)/h*)·(1/λ)`` (slope only).

So the fit is weighted least squares of ``ln(λ τ)`` on ``(1, 1/λ)``, τ the censored
maximum-likelihood mean escape time in steps, with weights ``(τ/se)²`` = number escaped.
Points where no replica escaped carry no finite estimate and are excluded (and counted). The
theory slopes are the same fit applied to each law's per-point prediction; a law is supported
when its slope lies inside the interval. A law whose column is absent at a fitted point (it does
not hold there — momentum, or noise it is not a law for; the ensemble's ``missing_because`` says
why) is not compared at all, and ``laws_absent`` carries the reason.

Beside the fit, :func:`escape_table` lists for each λ the measured τ, the exact discrete-chain τ
(theory/escape_exact.py) and each law's prediction, and :func:`exact_follows` says which law the
exact theory follows in which range of λh: the local slope
of ``ln(λτ_exact)`` in ``1/λ`` against the power law's, and τ itself against Kramers'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.analysis.fit.common import (
    boot_sd,
    parameter,
    resample_indices,
    wls,
    wls_many,
)

#: relative difference of local slopes within which the exact theory "follows" a law
FOLLOW_TOLERANCE = 0.2
LAW_NAMES = {"arrhenius": "Kramers", "powerlaw": "Mori's power law"}


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def escape_table(lr: np.ndarray, tau: np.ndarray, tau_se: np.ndarray, lr_h: np.ndarray | None,
                 laws: dict[str, np.ndarray | None]) -> list[dict[str, Any]]:
    """One row per point, by λ: ``lr``, ``lr_h``, ``tau``, ``tau_se`` (steps), each theory in
    ``laws`` (name → per-point values in steps, or None) and ``z_<name>`` = (τ − theory)/SE."""
    rows = []
    for i in np.argsort(lr, kind="stable"):
        row: dict[str, Any] = {"lr": float(lr[i]), "lr_h": _num(lr_h[i]) if lr_h is not None else None,
                               "tau": _num(tau[i]), "tau_se": _num(tau_se[i])}
        for name, values in laws.items():
            th = float(values[i]) if values is not None else math.nan
            row[name] = _num(th)
            with np.errstate(invalid="ignore", divide="ignore"):
                row[f"z_{name}"] = _num((tau[i] - th) / tau_se[i])
        rows.append(row)
    return rows


def exact_follows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranges of λh over the rows of :func:`escape_table` with an exact τ, and the law(s) the
    exact τ follows there (``laws`` empty: neither). Kramers predicts τ itself: followed where
    ``|τ_exact/τ_Kramers − 1| <`` :data:`FOLLOW_TOLERANCE` (it is only leading order in T/ΔL).
    The power law predicts only the slope of ln(λτ) in 1/λ: followed where the exact τ's local
    slope (to the next λ; the last row, to the previous) is within the tolerance of the law's."""
    pts = [r for r in rows if r.get("exact") and r["exact"] > 0]

    def slope(a: dict[str, Any], b: dict[str, Any], name: str) -> float | None:
        if a["lr"] == b["lr"] or not (a.get(name) and b.get(name) and a[name] > 0 and b[name] > 0):
            return None
        return (math.log(a["lr"] * a[name]) - math.log(b["lr"] * b[name])) / (1 / a["lr"] - 1 / b["lr"])

    out: list[dict[str, Any]] = []
    for i, r in enumerate(pts):
        laws = []
        if r.get("arrhenius") and abs(r["exact"] / r["arrhenius"] - 1) < FOLLOW_TOLERANCE:
            laws.append("arrhenius")
        if len(pts) > 1:
            a, b = (r, pts[i + 1]) if i + 1 < len(pts) else (pts[i - 1], r)
            s_exact, s_law = slope(a, b, "exact"), slope(a, b, "powerlaw")
            if s_exact is not None and s_law and abs(s_exact / s_law - 1) < FOLLOW_TOLERANCE:
                laws.append("powerlaw")
        if out and out[-1]["laws"] == laws:
            out[-1]["lr_h"][1] = r["lr_h"]
        else:
            out.append({"laws": laws, "lr_h": [r["lr_h"], r["lr_h"]]})
    return out


def follows_sentence(ranges: list[dict[str, Any]], absent: Mapping[str, str] | None = None) -> str:
    """The ranges of :func:`exact_follows` in words; ``absent`` (law → why, the fit's
    ``laws_absent``) names the laws that were not compared."""
    parts = []
    for r in ranges:
        lo, hi = r["lr_h"]
        where = ("λh " + (f"{lo:.2g}" if lo == hi else f"{lo:.2g}–{hi:.2g}")) if lo is not None else "these λ"
        parts.append(f"{where}: {' and '.join(LAW_NAMES[k] for k in r['laws']) or 'neither law'}")
    return ("the exact discrete-chain τ follows (Kramers: τ within "
            f"{100 * FOLLOW_TOLERANCE:.0f} %; power law: local slope of ln λτ in 1/λ within "
            f"{100 * FOLLOW_TOLERANCE:.0f} %) — " + "; ".join(parts)
            + (f" ({' and '.join(LAW_NAMES[k] for k in absent)}: not compared, "
               f"{'it does' if len(absent) == 1 else 'they do'} not hold here)" if absent else "")) if parts else ""


def absent_laws(laws: Mapping[str, np.ndarray | None], keep: np.ndarray,
                missing: Mapping[str, str] | None = None) -> dict[str, str]:
    """Law → why it is not compared: Kramers' or the power law's per-point values (``laws``)
    are not finite and positive at every fitted point ``keep``; the reason is ``missing[law]``
    (from the ensemble's ``missing_because``) or a generic one."""
    out = {}
    for law in LAW_NAMES:
        values = laws.get(law)
        if values is None or not np.all(np.isfinite(values[keep]) & (values[keep] > 0)):
            out[law] = (missing or {}).get(law) or "no finite prediction at every fitted point"
    return out


def resampled_escape_times(times: np.ndarray, escaped: np.ndarray, n_boot: int, rng: np.random.Generator,
                           with_counts: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Censored MLE τ = Σ times / Σ escaped over bootstrap resamples of each point's replicas.

    ``times`` (n, R): per-replica escape time (censored ones at the cap), finite values first;
    ``escaped`` (n, R): whether the replica escaped. Returns (n_boot, n), inf without escapes;
    with ``with_counts``, also each resample's number of escapes (n_boot, n).
    """
    counts = np.isfinite(times).sum(axis=1)
    idx = resample_indices(counts, times.shape[1], n_boot, rng)
    used = np.arange(times.shape[1])[None, None, :] < counts[None, :, None]
    t = np.take_along_axis(np.broadcast_to(np.nan_to_num(times), (n_boot,) + times.shape), idx, axis=2)
    e = np.take_along_axis(np.broadcast_to(escaped, (n_boot,) + times.shape), idx, axis=2)
    count = np.where(used, e, 0).sum(axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        taus = np.where(used, t, 0).sum(axis=2) / count
    return (taus, count) if with_counts else taus


def fit_escape(lr: np.ndarray, tau: np.ndarray, tau_se: np.ndarray, *, theory_arrhenius: np.ndarray | None = None,
               theory_powerlaw: np.ndarray | None = None, confidence: float = 0.95,
               times: np.ndarray | None = None, escaped: np.ndarray | None = None, bootstrap: int = 0,
               rng: np.random.Generator | None = None, theory_exact: np.ndarray | None = None,
               theory_exact_matched: np.ndarray | None = None,
               lr_h: np.ndarray | None = None, theory_missing: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Fit ``ln(λτ) = intercept + slope/λ`` (module docstring).

    Args:
        lr: learning rates, shape (n,); tau, tau_se: mean escape time in steps and its SE.
        theory_arrhenius, theory_powerlaw: per-point predictions in steps (NaN where absent).
        theory_exact, theory_exact_matched: the exact discrete-chain τ and its Gaussian-matched
            approximation, per point in steps (NaN where absent); lr_h: λ times the largest
            curvature at the minimum. They fill ``table`` (:func:`escape_table`), ``exact_follows``
            (:func:`exact_follows`) and ``exact_agreement``: the largest |τ − τ_exact|/SE.
        times, escaped: per-replica escape times in steps (censored at the cap, finite first)
            and escape flags, shape (n, R), for bootstrap intervals.
        theory_missing: law (``arrhenius``, ``powerlaw``) → why its column is absent at some of
            these points (the ensemble's ``missing_because``), for ``laws_absent``.

    Returns:
        JSON-ready dict: ``params`` slope and intercept (theory = Arrhenius fit; the slope also
        has ``theory_powerlaw`` and ``theory_powerlaw_inside``) and, where the exact discrete-chain
        τ exists at every fitted point, ``slope_exact`` (the same slope, its theory the exact
        chain's: the only exact comparison; the laws are approximations), ``supported_laws``,
        ``n_points``, ``excluded_points`` (no escape, or no finite SE), ``chi2_reduced``,
        ``laws_absent`` (law → why it was not compared: :func:`absent_laws`).
    """
    lr, tau, tau_se = (np.asarray(a, float) for a in (lr, tau, tau_se))
    ok = np.isfinite(tau) & (tau > 0) & np.isfinite(tau_se) & (tau_se > 0) & (lr > 0)
    keep = np.flatnonzero(ok)
    result: dict[str, Any] = {"model": "ln(lr * escape_time) = intercept + slope / lr", "confidence": confidence,
                              "n_points": int(keep.size), "excluded_points": int((~ok).sum())}
    laws = {"exact": theory_exact, "exact_matched": theory_exact_matched, "arrhenius": theory_arrhenius,
            "powerlaw": theory_powerlaw}
    laws = {k: (np.asarray(v, float) if v is not None and np.any(np.isfinite(v)) else None) for k, v in laws.items()}
    result["laws_absent"] = absent_laws(laws, keep, theory_missing)
    if any(v is not None for v in (laws["exact"], laws["exact_matched"])):
        result["table"] = escape_table(lr, tau, tau_se, None if lr_h is None else np.asarray(lr_h, float), laws)
        result["exact_follows"] = exact_follows(result["table"])
        zs = [abs(r["z_exact"]) for r in result["table"] if r.get("z_exact") is not None]
        result["exact_agreement"] = max(zs) if zs else None
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
        taus, counts = resampled_escape_times(np.asarray(times, float)[keep], np.asarray(escaped, bool)[keep],
                                              bootstrap, rng if rng is not None else np.random.default_rng(0),
                                              with_counts=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            ys = np.log(lr[keep][None, :] * taus)
        good = np.all(np.isfinite(ys) & (counts > 0), axis=1)
        if good.sum() >= 10:  # each resample weighted by its own escape counts, as the estimate is
            sd, method = boot_sd(wls_many(design, ys[good], counts[good].astype(float))), "bootstrap"
    dof_used = dof if method == "analytic" else None
    params = {
        "intercept": parameter(float(coef[0]), float(sd[0]), confidence, method,
                               theory=float(arr[0]) if arr is not None else None, dof=dof_used),
        "slope": parameter(float(coef[1]), float(sd[1]), confidence, method,
                           theory=float(arr[1]) if arr is not None else None, dof=dof_used),
    }
    exact = theory_fit(theory_exact)
    if exact is not None:  # the exact discrete chain's slope: the comparison the report's verdicts decide
        params["slope_exact"] = parameter(float(coef[1]), float(sd[1]), confidence, method, theory=float(exact[1]),
                                          dof=dof_used)
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
