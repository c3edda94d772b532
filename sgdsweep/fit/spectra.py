"""Spectral fits: the random-matrix statistics of a degenerate pair (Park et al. 2024, physics.md §5)
and the inverse variance–flatness exponent ψ (Gross et al. 2024, physics.md §4).

wigner (per point): the two eigenvalues x = s² of WᵀW (s the stored final singular values of a
layer) of every replica form one sample of the pair. Binder cumulant of the pooled δx against
−4/27, σ, the mean spacing against √π σ, and a Kolmogorov–Smirnov test of the normalised spacings
against the Wigner surmise (``sgdsweep.theory.rmt``); intervals from bootstrap resamples of the
replicas. Across points the widths are fitted as σ² = A·λ^a·S^b (linear scaling rule: a = 1,
b = −1).

flatness (per point): along the eigenvectors vᵢ of one layer's weight covariance, the variance
σᵢ² and the loss curvature cᵢ = vᵢᵀHvᵢ. With flatness Fᵢ ∝ cᵢ^{−1/2}, ``σᵢ² ∝ Fᵢ^{−ψ}`` is the line
``ln σᵢ² = const + (ψ/2) ln cᵢ`` over modes (ordinary least squares, t interval over modes). Two
layers: ψ = 2 for W2 at leading order (σᵢ² ∝ D1ᵢ/(D1ᵢ + D2), cᵢ ∝ D1ᵢ); a single layer has no such
relation (no theory value). The theory value is the same fit of the per-point within-layer
theory eigenvalues, when the ensemble has them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xarray as xr
from scipy import stats

from ..theory import rmt
from .common import boot_sd, groups, parameter, resample_indices
from .power_law import fit_power_law


def _point_group(ds: xr.Dataset, i: int) -> dict[str, Any]:
    """The swept axes' values at point i (a per-point fit's "group")."""
    values = {a: ds[a].values[i] for a in json.loads(ds.attrs.get("swept_axes", "[]")) if a in ds.coords}
    return {a: v.item() if hasattr(v, "item") else v for a, v in values.items()}


def _layer(ds: xr.Dataset, prefix: str, wanted: str | None) -> str | None:
    names = [v[len(prefix):] for v in ds.data_vars if v.startswith(prefix) and not v.endswith("_theory")]
    if wanted is not None:
        return wanted if wanted in names else None
    return names[-1] if names else None


def _pair_boot(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Binder, σ and mean spacing over bootstrap resamples of the rows of x (R, 2)."""
    idx = resample_indices(np.array([x.shape[0]]), x.shape[0], n_boot, rng)[:, 0, :]
    xb = x[idx]  # (B, R, 2)
    pooled = xb.reshape(n_boot, -1)
    d = pooled - pooled.mean(axis=1, keepdims=True)
    m2, m4 = (d**2).mean(axis=1), (d**4).mean(axis=1)
    n = x.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"binder": m4 / (3 * m2**2) - 1, "sigma": np.sqrt((d**2).sum(axis=1) / (3 * n - 1)),
                "mean_spacing": np.abs(xb[:, :, 0] - xb[:, :, 1]).mean(axis=1)}


def fit_wigner(ds: xr.Dataset, cfg: dict[str, Any], diverged: np.ndarray, confidence: float, n_boot: int,
               rng: np.random.Generator) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | str:
    """Per-point pair statistics and the per-group power law of σ²; a string says why it was skipped."""
    layer = _layer(ds, "singular_values_", cfg.get("layer"))
    if layer is None:
        return (f"no singular values of layer {cfg.get('layer')!r} in the ensemble" if cfg.get("layer")
                else "no singular values in the ensemble")
    sv = np.asarray(ds[f"singular_values_{layer}"].values, float)
    pair = list(cfg.get("pair", [0, 1]))
    if sv.shape[2] < 2 and cfg.get("layer") is None:
        return f"no layer with two singular values (layer {layer} has {sv.shape[2]}): a pair needs a weight matrix"
    if sv.shape[2] <= max(pair):
        return (f"layer {layer} has {sv.shape[2]} singular value(s); the pair {pair} needs {max(pair) + 1} "
                "(set fit.wigner.layer to a layer with at least two)")
    points: list[dict[str, Any]] = []
    sigma = np.full(ds.sizes["point"], np.nan)
    sigma_se = np.full(ds.sizes["point"], np.nan)
    for i in np.flatnonzero(~diverged):
        x = sv[i][:, pair] ** 2
        x = x[np.all(np.isfinite(x), axis=1)]
        res: dict[str, Any] = {"group": _point_group(ds, i), "point": str(ds["point"].values[i]),
                               "layer": layer, "pair": pair, "confidence": confidence}
        try:
            st = rmt.pair_statistics(x)
        except ValueError as exc:
            res["error"] = str(exc)
            points.append(res)
            continue
        sd, method = {"binder": math.nan, "sigma": math.nan, "mean_spacing": math.nan}, "none"
        if n_boot > 0:
            b = _pair_boot(x, n_boot, rng)
            sd, method = {k: float(boot_sd(v)) for k, v in b.items()}, "bootstrap"
        res["params"] = {
            "binder": parameter(st["binder"], sd["binder"], confidence, method, theory=rmt.BINDER_PAIR,
                                leading_order=rmt.BINDER_PAIR),
            "sigma": parameter(st["sigma"], sd["sigma"], confidence, method),
            "mean_spacing": parameter(st["mean_spacing"], sd["mean_spacing"], confidence, method,
                                      theory=rmt.mean_spacing(st["sigma"])),
        }
        res.update({"n_replicas": int(st["n_replicas"]), "centre": st["centre"],
                    "ks_statistic": st["ks_statistic"], "ks_pvalue": st["ks_pvalue"],
                    "wigner_consistent": bool(st["ks_pvalue"] > 1 - confidence)})
        sigma[i], sigma_se[i] = st["sigma"], sd["sigma"]
        points.append(res)
    width = []
    for group, mask in groups(ds, ("lr", "batch_size")):
        keep = np.flatnonzero(mask & ~diverged)
        res = fit_power_law(ds["lr"].values[keep], ds["batch_size"].values[keep], sigma[keep] ** 2,
                            2 * sigma[keep] * sigma_se[keep], confidence=confidence)
        res["model"] = "sigma^2 = A * lr^a * batch_size^b (pair width of WᵀW eigenvalues)"
        for name in ("a", "b"):  # the theory is the linear scaling rule itself: σ² ∝ λ/S (Park et al. Eq. 9)
            q = (res.get("params") or {}).get(name)
            if q and q["interval"][0] is not None:
                q["theory"] = q["leading_order"]
                q["theory_inside"] = bool(q["interval"][0] <= q["theory"] <= q["interval"][1])
        res["group"] = group
        width.append(res)
    return points, width


def flatness_exponent(variance: np.ndarray, curvature: np.ndarray, confidence: float = 0.95,
                      theory_variance: np.ndarray | None = None, leading_order: float | None = None) -> dict[str, Any]:
    """ψ from ``ln variance = c + (ψ/2) ln curvature`` over modes with both positive (module docstring)."""
    v, c = np.asarray(variance, float), np.asarray(curvature, float)
    ok = np.isfinite(v) & np.isfinite(c) & (v > 0) & (c > 0)
    res: dict[str, Any] = {"model": "variance ∝ flatness^-psi, flatness ∝ curvature^-1/2", "n_modes": int(ok.sum()),
                           "confidence": confidence}
    if ok.sum() < 3 or np.ptp(np.log(c[ok])) == 0:
        res["error"] = f"{int(ok.sum())} modes with positive variance and curvature: need 3 with distinct curvatures"
        return res
    lc, lv = np.log(c[ok]), np.log(v[ok])
    fit = stats.linregress(lc, lv)
    dof = int(ok.sum()) - 2
    th = None
    if theory_variance is not None:
        tv = np.asarray(theory_variance, float)[ok]
        if np.all(np.isfinite(tv) & (tv > 0)):
            th = 2 * float(stats.linregress(lc, np.log(tv)).slope)
    tq = float(stats.t.ppf(0.5 + confidence / 2, dof)) if dof > 0 else math.inf
    res["params"] = {"psi": parameter(2 * float(fit.slope), 2 * float(fit.stderr), confidence, "analytic",
                                      theory=th, leading_order=leading_order, quantile=tq)}
    res["r_squared"] = float(fit.rvalue**2)
    return res


def fit_flatness(ds: xr.Dataset, cfg: dict[str, Any], diverged: np.ndarray,
                 confidence: float) -> list[dict[str, Any]] | str:
    """ψ per point for one layer; a string says why it was skipped."""
    layer = _layer(ds, "layer_mode_curvature_", cfg.get("layer"))
    if layer is None:
        return ("no per-layer mode curvatures in the ensemble (they are measured for models whose minima form a "
                "manifold: two_layer)")
    var = np.asarray(ds[f"layer_cov_eigenvalues_{layer}"].values, float)
    curv = np.asarray(ds[f"layer_mode_curvature_{layer}"].values, float)
    th_name = f"layer_cov_eigenvalues_{layer}_theory"
    theory = np.asarray(ds[th_name].values, float) if th_name in ds else None
    leading = 2.0 if layer == "W2" and "layer_mode_curvature_W1" in ds else None
    out = []
    for i in np.flatnonzero(~diverged):
        res = flatness_exponent(var[i], curv[i], confidence, theory[i] if theory is not None else None, leading)
        res.update({"group": _point_group(ds, i), "point": str(ds["point"].values[i]), "layer": layer})
        out.append(res)
    return out
