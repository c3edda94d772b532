"""All of a sweep's fits in one call: :func:`fit_ensemble` (the fits are listed in
:mod:`sgdsweep.analysis.fit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.analysis.fit import family
from sgdsweep.analysis.fit.cache import FitCache, GroupKeys
from sgdsweep.analysis.fit.collapse import fit_collapse
from sgdsweep.analysis.fit.common import axis_values, groups, replica_order, replica_table
from sgdsweep.analysis.fit.escape import fit_escape
from sgdsweep.analysis.fit.points import point_checks, short_burn_in
from sgdsweep.analysis.fit.power_law import fit_power_law
from sgdsweep.analysis.fit.spectra import fit_flatness, fit_wigner

if TYPE_CHECKING:
    import xarray as xr

#: Why flatness does not run by default on a single-layer model.
SINGLE_LAYER_FLATNESS = ("a single-layer model has no inverse variance–flatness relation to test (no theory of "
                         "ψ); set fit.flatness.layer: all to fit ψ anyway")

#: Bootstrap seed: fits are a deterministic function of the ensemble and the fit config.
BOOTSTRAP_SEED = 20240101
#: Fits of the stationary state's weight variance: a group result counts its points whose burn-in
#: is short (``short_burn_in``, :func:`sgdsweep.analysis.fit.points.short_burn_in`), which its
#: verdict names when it is not "agrees".
STATIONARY = ("power_law", "linear_scaling", "momentum_scaling")


def _diverged(ds: xr.Dataset) -> np.ndarray:
    return ds["diverged"].values.astype(bool) if "diverged" in ds else np.zeros(ds.sizes["point"], bool)


def _has(ds: xr.Dataset, *names: str) -> bool:
    return all(n in ds and np.isfinite(np.asarray(ds[n].values, float)).any() for n in names)


def _resolve_collapses(out: dict[str, Any], collapses: dict[str, Any], indices: dict[str, list[np.ndarray]],
                       level: float) -> None:
    """Refit, drawing the null down to ``level`` (α/m, Holm's smallest threshold), each collapse
    whose p-value one batch of draws left above it unresolved (``pvalue_bound`` > level;
    :mod:`sgdsweep.analysis.fit.collapse`). The group's fit is then that of a fresh process with
    this family; the cache keeps the one-batch fit, which does not depend on the family."""
    for name, fit in collapses.items():
        for j, res in enumerate(out.get(name) or []):
            bound = ((res.get("params") or {}).get("spread2") or {}).get("pvalue_bound")
            if bound is not None and bound > level:
                out[name][j] = {**res, **fit(indices[name][j], level)}  # the group's annotations stay


def fit_ensemble(ds: xr.Dataset, fit_config: dict[str, Any], cache: FitCache | None = None) -> dict[str, Any]:
    """Run the fits that ``fit_config`` (the config's ``fit`` section, defaults filled) enables.
    With ``cache``, a group whose points and settings are those of a group fitted before with
    it takes that result instead of being fitted (:mod:`sgdsweep.analysis.fit.cache`): the same
    results.

    Returns ``{fit name: [result per group, each with "group"], "skipped": {fit name: reason}}``
    (a fit's key is absent when it is disabled or skipped).
    """
    conf = float(fit_config.get("confidence", 0.95))
    n_boot = int(fit_config.get("bootstrap", 0))
    enabled = {name: fit_config.get(name, {}).get("enabled", True)
               for name in ("power_law", "linear_scaling", "momentum_scaling", "escape", "wigner", "flatness")}
    diverged = _diverged(ds)
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    common = {"confidence": conf, "bootstrap": n_boot}
    wv_rep = replica_table(ds, "weight_var_replica")

    keys = GroupKeys(ds, fit_config) if cache is not None else None
    short = short_burn_in(ds)

    def rng() -> np.random.Generator:
        return np.random.default_rng(BOOTSTRAP_SEED)

    indices: dict[str, list[np.ndarray]] = {}  # each fit's groups' points, in the order of its results

    def run_groups(name: str, fitted: tuple[str, ...], one) -> None:
        results = []
        indices[name] = []
        for group, mask in groups(ds, fitted):
            index = np.flatnonzero(mask & ~diverged)
            indices[name].append(index)
            key = keys.key(name, index) if keys is not None else None
            res = cache.get(key) if key is not None else None
            if res is None:
                res = one(index)
                if key is not None:
                    cache.put(key, res)
            res["group"] = group
            res["excluded_diverged"] = int((mask & diverged).sum())
            if name in STATIONARY and short[index].any():  # said beside a verdict these points may sway
                res["short_burn_in"] = int(short[index].sum())
            results.append(res)
        if all("error" in r for r in results):
            skipped[name] = results[0]["error"]
        else:
            out[name] = results

    has_wv = _has(ds, "weight_var", "weight_var_se")
    if enabled["power_law"]:
        if not has_wv:
            skipped["power_law"] = "the ensemble has no weight_var"
        else:
            run_groups("power_law", ("lr", "batch_size"), lambda i: fit_power_law(
                ds["lr"].values[i], ds["batch_size"].values[i], ds["weight_var"].values[i],
                ds["weight_var_se"].values[i], ds["weight_var_theory"].values[i] if "weight_var_theory" in ds else None,
                replicas=wv_rep[i] if wv_rep is not None else None, rng=rng(), **common))
    counts = np.isfinite(wv_rep).sum(axis=1) if wv_rep is not None else None
    mom = axis_values(ds, "momentum", 0.0)
    collapses = {}  # fit name → its fit of one group, drawing the null to a given p-value level
    for name, fitted, variable in (("linear_scaling", ("lr", "batch_size"), "lr/batch_size"),
                                   ("momentum_scaling", ("lr", "batch_size", "momentum"),
                                    "lr/((1-momentum)*batch_size)")):
        if not enabled[name]:
            continue
        if not has_wv:
            skipped[name] = "the ensemble has no weight_var"
            continue
        if name == "momentum_scaling" and np.unique(mom).size < 2:
            skipped[name] = "momentum is not swept"
            continue
        x = ds["lr"].values / ds["batch_size"].values / (1 - mom if name == "momentum_scaling" else 1.0)
        collapses[name] = lambda i, target=1.0, x=x, variable=variable: fit_collapse(
            x[i], ds["weight_var"].values[i], ds["weight_var_se"].values[i],
            ds["weight_var_theory"].values[i] if "weight_var_theory" in ds else None,
            conf, variable=variable, replicas=counts[i] if counts is not None else None, target=target)
        run_groups(name, fitted, collapses[name])
    if enabled["escape"]:
        if not _has(ds, "escape_time"):
            skipped["escape"] = "no escape times in the ensemble (no landscape model, or no replica escaped)"
        else:
            times = replica_table(ds, "escape_time_replica")
            esc = None
            if times is not None and "escape_step" in ds:  # escape flags in the same replica order
                esc = np.take_along_axis(np.asarray(ds["escape_step"].values) >= 0,
                                         replica_order(ds, "escape_time_replica"), axis=1)

            def theory(name: str, i: np.ndarray) -> np.ndarray | None:
                return ds[name].values[i] if name in ds else None

            def missing(i: np.ndarray) -> dict[str, str]:
                """law → why its column is absent at these points (``missing_because``)."""
                if "missing_because" not in ds:
                    return {}
                why = ds["missing_because"]
                out = {}
                for law in ("arrhenius", "powerlaw"):
                    column = f"escape_time_theory_{law}"
                    if column in why["theory_column"].values:
                        reasons = sorted({str(r) for r in why.sel(theory_column=column).values[i] if r})
                        if reasons:
                            out[law] = " | ".join(reasons)
                return out

            # a sweep at fixed temperature zips batch_size with lr: one fit over both
            fitted = ("lr", "batch_size") if all(np.unique(ds["lr"].values[m]).size < 2 for _, m in groups(
                ds, ("lr",))) and np.unique(ds["lr"].values).size > 1 else ("lr",)
            run_groups("escape", fitted, lambda i: fit_escape(
                ds["lr"].values[i], ds["escape_time"].values[i], ds["escape_time_se"].values[i],
                theory_arrhenius=theory("escape_time_theory_arrhenius", i),
                theory_powerlaw=theory("escape_time_theory_powerlaw", i),
                theory_exact=theory("escape_time_theory_exact", i),
                theory_exact_matched=theory("escape_time_theory_exact_matched", i),
                lr_h=theory("lr_curvature", i), theory_missing=missing(i),
                times=times[i] if times is not None else None, escaped=esc[i] if esc is not None else None,
                rng=rng(), **common))
    if enabled["wigner"]:
        res = fit_wigner(ds, fit_config.get("wigner", {}), diverged, conf, n_boot, rng())
        if isinstance(res, str):
            skipped["wigner"] = res
        else:
            out["wigner"], out["wigner_width"] = res
    single_layer = "mode_curvature" in ds and not any(v.startswith("layer_mode_curvature_") for v in ds.data_vars)
    if enabled["flatness"] and single_layer and fit_config.get("flatness", {}).get("layer") is None:
        skipped["flatness"] = SINGLE_LAYER_FLATNESS
    elif enabled["flatness"]:
        res = fit_flatness(ds, fit_config.get("flatness", {}), diverged, conf)
        if isinstance(res, str):
            skipped["flatness"] = res
        else:
            out["flatness"] = res
    out["skipped"] = skipped
    checks = point_checks(ds, diverged)
    if checks:
        out["points"] = checks
    _resolve_collapses(out, collapses, indices, (1.0 - conf) / max(family.count(out), 1))
    family.control(out, conf)
    out["settings"] = {"confidence": conf, "bootstrap": n_boot, "bootstrap_seed": BOOTSTRAP_SEED,
                       "points_digest": ds.attrs.get("points_digest")}
    return out
