"""Spectral fits: the random-matrix statistics of a degenerate pair (Park et al. 2024, docs/physics.md §5)
and the inverse variance–flatness exponent ψ (Gross et al. 2024, docs/physics.md §4).

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
theory eigenvalues, when the ensemble has them. Modes below the numerical floor
(:data:`NUMERICAL_FLOOR`: variance or curvature below 1e-10 times the largest mode's) are
round-off, not physics — e.g. a direction projected out of the covariance, at variance ±1e-18,
its sign the machine's — and are left out of both fits and counted (``excluded_modes``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.fit.common import boot_sd, groups, parameter, resample_indices
from sgdsweep.analysis.fit.power_law import fit_power_law

#: Modes whose variance (or curvature) is below this times the largest mode's are excluded from
#: the flatness fit: a variance is a sum over many steps of squared deviations and a curvature
#: vᵀHv a sum of products, each with float64 round-off of ~1e-16 relative to its largest terms,
#: growing at most in proportion to the number of terms: 1e-10 is above it up to 10⁶ terms.
NUMERICAL_FLOOR = 1e-10


def _above_floor(variance: np.ndarray, curvature: np.ndarray) -> tuple[np.ndarray, int]:
    """(modes with positive variance and curvature at or above :data:`NUMERICAL_FLOOR` times the
    largest magnitude of each, how many finite modes are round-off: variance or curvature below
    the floor in magnitude, of either sign — the sign of round-off is the machine's, not the
    physics')."""
    finite = np.isfinite(variance) & np.isfinite(curvature)
    if not finite.any():
        return finite, 0
    roundoff = finite & ((np.abs(variance) < NUMERICAL_FLOOR * np.abs(variance[finite]).max())
                         | (np.abs(curvature) < NUMERICAL_FLOOR * np.abs(curvature[finite]).max()))
    return finite & ~roundoff & (variance > 0) & (curvature > 0), int(roundoff.sum())


def _point_groups(ds: xr.Dataset) -> list[dict[str, Any]]:
    """Per point, the swept axes' values as Python scalars (a per-point fit's "group"); each
    axis is converted once for all points."""
    axes = [a for a in json.loads(ds.attrs.get("swept_axes", "[]")) if a in ds.coords]
    columns = [np.asarray(ds[a].values).tolist() for a in axes]
    return [dict(zip(axes, row)) for row in zip(*columns)] if axes else [{} for _ in range(ds.sizes["point"])]


def _point_names(ds: xr.Dataset) -> list[str]:
    """Every point's hash as a string."""
    return [str(p) for p in ds["point"].values]


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
    from sgdsweep.theory import rmt  # with SciPy's statistics: loaded only when this fit runs
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
    point_groups, point_names = _point_groups(ds), _point_names(ds)
    sigma = np.full(ds.sizes["point"], np.nan)
    sigma_se = np.full(ds.sizes["point"], np.nan)
    for i in np.flatnonzero(~diverged):
        x = sv[i][:, pair] ** 2
        x = x[np.all(np.isfinite(x), axis=1)]
        res: dict[str, Any] = {"group": point_groups[i], "point": point_names[i],
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
            if q and q["interval"][0] is not None:  # with its p-value, for the report's family
                res["params"][name] = parameter(q["estimate"], q["stderr"], confidence, q["interval_method"],
                                                theory=q["leading_order"], leading_order=q["leading_order"],
                                                dof=res["dof"])
        res["group"] = group
        width.append(res)
    return points, width


#: ``flatness.layer`` value for the whole weight vector of a single-layer model.
ALL_WEIGHTS = "all"


def flatness_columns(layer: str) -> dict[str, str | None]:
    """Ensemble variables of the flatness fit for ``layer``: measured variance and curvature along
    the covariance modes, and the theory's variance and curvature along the theory's modes (None:
    the theory spectrum is compared at the measured curvatures)."""
    if layer == ALL_WEIGHTS:
        return {"variance": "weight_cov_eigenvalues", "curvature": "mode_curvature",
                "theory_variance": "weight_cov_eigenvalues_theory", "theory_curvature": "mode_curvature_theory"}
    return {"variance": f"layer_cov_eigenvalues_{layer}", "curvature": f"layer_mode_curvature_{layer}",
            "theory_variance": f"layer_cov_eigenvalues_{layer}_theory", "theory_curvature": None}


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, its standard error, Pearson r) of the least-squares line of ``y`` on ``x``, for
    at least three points with distinct ``x``.

    The estimators and arithmetic of :func:`scipy.stats.linregress` (same values to the last
    bit), without its per-call dispatch and p-value: :func:`fit_flatness` fits two lines per
    point, thousands per sweep.
    """
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=1).flat
    if ssxm == 0.0 or ssym == 0.0:
        r = math.nan if ssxym == 0 else 0.0
    else:
        r = float(np.clip(ssxym / np.sqrt(ssxm * ssym), -1.0, 1.0))
    slope = ssxym / ssxm
    stderr = np.sqrt((1 - r**2) * ssym / ssxm / (x.size - 2))
    return float(slope), float(stderr), r


def flatness_exponent(variance: np.ndarray, curvature: np.ndarray, confidence: float = 0.95,
                      theory_variance: np.ndarray | None = None, leading_order: float | None = None,
                      theory_curvature: np.ndarray | None = None) -> dict[str, Any]:
    """ψ from ``ln variance = c + (ψ/2) ln curvature`` over modes with both positive and above
    the numerical floor (module docstring; :data:`NUMERICAL_FLOOR` relative to the largest mode's
    variance and curvature).

    The theory ψ is the same fit of ``theory_variance`` against ``theory_curvature`` (default: the
    measured curvature, mode by mode; the same floor applies to the theory spectrum).
    ``curvature_spread`` = max/min curvature over the modes used: a single layer has ψ ≈ 0
    because the curvature barely varies (Gross et al. Fig. 6). ``n_modes``: the modes fitted;
    ``excluded_modes``: those whose variance or curvature is below the floor in magnitude (of
    either sign).
    """
    v, c = np.asarray(variance, float), np.asarray(curvature, float)
    ok, excluded = _above_floor(v, c)
    res: dict[str, Any] = {"model": "variance ∝ flatness^-psi, flatness ∝ curvature^-1/2", "n_modes": int(ok.sum()),
                           "excluded_modes": excluded, "numerical_floor": NUMERICAL_FLOOR, "confidence": confidence}
    if ok.sum() < 3 or np.ptp(np.log(c[ok])) == 0:
        below = (f" ({excluded} more below the numerical floor, {NUMERICAL_FLOOR:g} × the largest mode's "
                 "variance or curvature, left out)" if excluded else "")
        res["error"] = (f"{int(ok.sum())} modes with positive variance and curvature{below}: need 3 with "
                        "distinct curvatures (per-mode spectra need d ≤ observe.cov_max_dim)")
        return res
    lc, lv = np.log(c[ok]), np.log(v[ok])
    slope, stderr, r = _line(lc, lv)
    dof = int(ok.sum()) - 2
    th = None
    if theory_variance is not None:
        tv = np.asarray(theory_variance, float)
        tc = c if theory_curvature is None else np.asarray(theory_curvature, float)
        tok = _above_floor(tv, tc)[0]
        if theory_curvature is None:
            tok = ok if np.all(tok[ok]) else np.zeros_like(ok)
        if tok.sum() >= 3 and np.ptp(np.log(tc[tok])) > 0:
            th = 2 * _line(np.log(tc[tok]), np.log(tv[tok]))[0]
    res["params"] = {"psi": parameter(2 * slope, 2 * stderr, confidence, "analytic",
                                      theory=th, leading_order=leading_order, dof=dof)}
    res["r_squared"] = float(r**2) if math.isfinite(r) else None  # 0/0 where every variance is equal
    res["curvature_spread"] = float(np.exp(np.ptp(lc)))
    res["variance_spread"] = float(np.exp(np.ptp(lv)))
    return res


def fit_flatness(ds: xr.Dataset, cfg: dict[str, Any], diverged: np.ndarray,
                 confidence: float) -> list[dict[str, Any]] | str:
    """ψ per point for one layer (``cfg["layer"]``; default the last layer of a multi-layer model,
    ``all`` for a single-layer one); a string says why it was skipped.

    Leading order: 2 for W2 of two layers (σᵢ² ∝ D1ᵢ/(D1ᵢ + D2) with D1ᵢ ≪ D2); 0 for a single
    layer (M ∝ I when C ∝ H); none for W1.
    """
    layer = _layer(ds, "layer_mode_curvature_", cfg.get("layer"))
    if layer is None and cfg.get("layer") in (None, ALL_WEIGHTS) and "mode_curvature" in ds \
            and "layer_mode_curvature_W1" not in ds:
        layer = ALL_WEIGHTS
    if layer is None:
        return ("no per-mode curvatures in the ensemble (measured for single-layer models with an exact Hessian "
                "and for two_layer, when d ≤ observe.cov_max_dim)")
    cols = flatness_columns(layer)
    var, curv = (np.asarray(ds[cols[k]].values, float) for k in ("variance", "curvature"))
    theory = np.asarray(ds[cols["theory_variance"]].values, float) if cols["theory_variance"] in ds else None
    theory_curv = (np.asarray(ds[cols["theory_curvature"]].values, float)
                   if cols["theory_curvature"] in ds else None)
    leading = {ALL_WEIGHTS: 0.0, "W2": 2.0 if "layer_mode_curvature_W1" in ds else None}.get(layer)
    out = []
    point_groups, point_names = _point_groups(ds), _point_names(ds)
    for i in np.flatnonzero(~diverged):
        res = flatness_exponent(var[i], curv[i], confidence, theory[i] if theory is not None else None, leading,
                                theory_curv[i] if theory_curv is not None else None)
        res.update({"group": point_groups[i], "point": point_names[i], "layer": layer})
        out.append(res)
    return out
