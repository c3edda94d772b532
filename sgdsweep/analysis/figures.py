"""The report's figures: each function takes the ensemble (and a fit result) and returns a
matplotlib figure, or None when the data hold nothing to draw. Axes carry names and units;
measured values carry ±1 standard-error bars; theory is drawn as lines. Every swept axis that
tells points apart is named in the titles or legends; a panel is drawn only when it has
something to show (no residual panel without a theory). The PNG of a figure is
:func:`sgdsweep.analysis.plotting.png`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr
from matplotlib.colors import ListedColormap

from sgdsweep.analysis.fit.spectra import ALL_WEIGHTS, flatness_columns
from sgdsweep.analysis.plotting import axis_label, integer_ticks, plt


def _ok(ds: xr.Dataset) -> np.ndarray:
    return ~ds["diverged"].values.astype(bool) if "diverged" in ds else np.ones(ds.sizes["point"], bool)


def _two_panels(height: float = 6.5):
    return plt.subplots(2, 1, figsize=(7, height), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})


#: Short names of the axes in legends and titles (others go by their own name).
SYMBOL = {"lr": "λ", "batch_size": "S", "momentum": "μ"}


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def label_of(axes: list[str], key: tuple) -> str:
    """``S = 4, hidden_width = 2``: the values ``key`` of ``axes``, with λ, S, μ for the usual ones."""
    return ", ".join(f"{SYMBOL.get(a, a)} = {_value(v)}" for a, v in zip(axes, key))


def _swept(ds: xr.Dataset) -> list[str]:
    return [a for a in json.loads(ds.attrs.get("swept_axes", "[]")) if a in ds.coords]


def split_by(ds: xr.Dataset, axes: list[str]) -> list[tuple[tuple, np.ndarray]]:
    """(values of ``axes``, boolean mask over points) for every combination present, in order."""
    keys = list(zip(*(ds[a].values.tolist() for a in axes))) if axes else [()] * ds.sizes["point"]
    return [(key, np.array([k == key for k in keys])) for key in dict.fromkeys(keys)]


def weight_var_against_ratio(ds: xr.Dataset) -> plt.Figure | None:
    """weight_var (measured ± SE, exact theory) against λ/S, one colour per combination of S and
    the swept axes other than λ, and measured/theory below when there is a theory."""
    if "weight_var" not in ds or not np.isfinite(ds["weight_var"].values).any():
        return None
    has_theory = "weight_var_theory" in ds and np.isfinite(ds["weight_var_theory"].values).any()
    fig, axes = (_two_panels(7) if has_theory else plt.subplots(figsize=(7, 5)))
    ax, axr = axes if has_theory else (axes, None)
    ratio = ds["lr"].values / ds["batch_size"].values
    ok = _ok(ds)
    by = ["batch_size"] + [a for a in _swept(ds) if a not in ("lr", "batch_size")]
    parts = split_by(ds, by)
    for (key, mask), c in zip(parts, plt.cm.viridis(np.linspace(0, 0.9, len(parts)))):
        sel = ok & mask
        order = np.argsort(ratio[sel])
        x, name = ratio[sel][order], label_of(by, key)
        meas, se = ds["weight_var"].values[sel][order], ds["weight_var_se"].values[sel][order]
        ax.errorbar(x, meas, yerr=se, fmt="o", color=c, ms=5, capsize=3, label=f"{name} measured")
        if has_theory:
            th = ds["weight_var_theory"].values[sel][order]
            ax.plot(x, th, "--", color=c, lw=1, label=f"{name} exact theory")
            axr.errorbar(x, meas / th, yerr=se / th, fmt="o", color=c, ms=4, capsize=3)
        if "weight_var_theory_continuous" in ds:
            ax.plot(x, ds["weight_var_theory_continuous"].values[sel][order], ":", color=c, lw=1)
    if (~ok).any():
        floor = np.nanmin(ds["weight_var"].values[ok]) if ok.any() else 1.0
        ax.plot(ratio[~ok], np.full((~ok).sum(), floor), "rx", label="diverged")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight variance Tr M / N  [weight²]")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Stationary weight variance: measured (±1 SE) vs exact theory (dashed)"
                 + ("; continuous-time (dotted)" if "weight_var_theory_continuous" in ds else "")
                 if has_theory else "Stationary weight variance, measured (±1 SE); no exact theory for this model",
                 fontsize=10)
    (axr or ax).set_xlabel("λ / S  [learning rate / batch size]")
    if has_theory:
        axr.axhline(1.0, color="k", lw=0.8)
        axr.set_ylabel("measured / theory")
    return fig


def power_law(ds: xr.Dataset, fit: dict[str, Any]) -> plt.Figure | None:
    """Measured weight_var against the fitted A·λ^a·S^b, with a residual panel in SE units."""
    p = fit.get("params", {})
    if not p or p.get("log_A") is None:
        return None
    a = p["a"]["estimate"] if p.get("a") else 0.0
    b = p["b"]["estimate"] if p.get("b") else 0.0
    ok = _ok(ds)
    lr, s = ds["lr"].values[ok], ds["batch_size"].values[ok]
    y, se = ds["weight_var"].values[ok], ds["weight_var_se"].values[ok]
    pred = np.exp(p["log_A"]["estimate"]) * lr**a * s**b
    fig, (ax, axr) = _two_panels(5.5)
    ax.errorbar(pred, y, yerr=se, fmt="o", ms=4, capsize=2, label="measured ±1 SE")
    if "weight_var_theory" in ds and np.isfinite(ds["weight_var_theory"].values[ok]).any():
        ax.plot(pred, ds["weight_var_theory"].values[ok], "k+", ms=7, label="exact theory")
    lim = [np.nanmin(pred) * 0.8, np.nanmax(pred) * 1.25]
    law = "·".join([f"λ^{a:.3f}" if p.get("a") else "", f"S^{b:.3f}" if p.get("b") else ""]).strip("·")
    fixed = [name for name, q in (("λ", "a"), ("S", "b")) if not p.get(q)]
    ax.plot(lim, lim, "k--", lw=0.8, label=f"fit: A·{law}" + (f" ({', '.join(fixed)} fixed)" if fixed else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight_var [weight²]")
    ax.legend(fontsize=8)
    group = label_of(list(fit.get("group", {})), tuple(fit.get("group", {}).values()))
    ax.set_title("Power-law fit: measured against fitted" + (f" ({group})" if group else ""))
    axr.errorbar(pred, (y - pred) / se, fmt="o", ms=4)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel("fitted A·λ^a·S^b [weight²]")
    axr.set_ylabel("residual / SE")
    return fig


def collapse(ds: xr.Dataset, fit: dict[str, Any]) -> plt.Figure | None:
    """weight_var against the scaling variable, one colour per batch size (or momentum), with
    each point's deviation from the mean of its class of equal x in the lower panel."""
    if "params" not in fit:
        return None
    ok = _ok(ds)
    momentum = "momentum" in fit["variable"]
    mu = ds["momentum"].values if "momentum" in ds.coords else np.zeros(ds.sizes["point"])
    x = ds["lr"].values / ds["batch_size"].values / ((1 - mu) if momentum else 1.0)
    y, se = ds["weight_var"].values, ds["weight_var_se"].values
    colour_by = mu if momentum else ds["batch_size"].values
    label = "μ" if momentum else "S"
    keys = np.array([float(f"{v:.9g}") for v in x])
    classes, member = np.unique(keys, return_inverse=True)
    class_mean = np.array([np.exp(np.nanmean(np.log(y[ok & (keys == k)]))) for k in classes])[member]
    fig, (ax, axr) = _two_panels()
    values = np.unique(colour_by[ok])
    for v, c in zip(values, plt.cm.plasma(np.linspace(0, 0.85, len(values)))):
        sel = ok & (colour_by == v)
        order = np.argsort(x[sel])
        ax.errorbar(x[sel][order], y[sel][order], yerr=se[sel][order], fmt="o-", color=c, ms=4, lw=0.8,
                    capsize=2, label=f"{label} = {v:g}")
        if "weight_var_theory" in ds:
            ax.plot(x[sel][order], ds["weight_var_theory"].values[sel][order], "--", color=c, lw=0.8)
        axr.errorbar(x[sel], y[sel] / class_mean[sel] - 1, yerr=se[sel] / class_mean[sel], fmt="o", color=c, ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight_var [weight²]")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"Collapse in {fit['variable']}: measured (±1 SE), exact theory dashed; "
                 f"spread √Δ² = {fit['relative_spread']:.3g}", fontsize=9)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel(fit["variable"].replace("lr", "λ").replace("batch_size", "S").replace("momentum", "μ") + "  [1]")
    axr.set_ylabel("value / class mean − 1")
    return fig


def _group_label(group: dict[str, Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, (int, float)) else str(v) for v in group.values()) or "all"


#: Above this many groups the overview names none of them (rows in table order) and stops growing.
MAX_LABELLED_GROUPS = 40


def fit_overview(results: list[dict[str, Any]], names: tuple[str, ...], title: str) -> plt.Figure | None:
    """Every group's fit at a glance: one panel per parameter in ``names``, one row per group
    (labelled by its values of the group axes, up to :data:`MAX_LABELLED_GROUPS` groups), the
    estimate with its interval (bar), the theory value (black +) and the leading order (grey
    dashed). None when no group has an estimate."""
    rows = [r for r in results if any(((r.get("params") or {}).get(n) or {}).get("estimate") is not None
                                      for n in names)]
    if not rows:
        return None
    y = np.arange(len(rows))
    labelled = len(rows) <= MAX_LABELLED_GROUPS
    height = 1.2 + 0.22 * min(len(rows), MAX_LABELLED_GROUPS)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names) + 1.6, height), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names):
        qs = [((r.get("params") or {}).get(name) or {}) for r in rows]
        est = np.array([np.nan if q.get("estimate") is None else q["estimate"] for q in qs], float)
        lo, hi = (np.array([np.nan if q.get("interval", [None, None])[k] is None else q["interval"][k] for q in qs],
                           float) for k in (0, 1))
        ax.errorbar(est, y, xerr=[np.nan_to_num(est - lo), np.nan_to_num(hi - est)], fmt="o", ms=3, capsize=2,
                    label="estimate [interval]")
        theory = np.array([np.nan if q.get("theory") is None else q["theory"] for q in qs], float)
        if np.isfinite(theory).any():
            ax.plot(theory, y, "k+", ms=7, label="theory")
        leading = {q.get("leading_order") for q in qs} - {None}
        if len(leading) == 1:
            ax.axvline(leading.pop(), color="0.5", ls="--", lw=0.8, label="leading order")
        ax.set_xlabel(name)
        ax.legend(fontsize=7)
    if labelled:
        axes[0][0].set_yticks(y, [_group_label(r["group"]) for r in rows], fontsize=7)
        axes[0][0].set_ylabel(", ".join(rows[0]["group"]) or "group")
    else:  # too many to name: their order is the tables' order
        axes[0][0].set_ylabel("group (in the order of the tables)")
    axes[0][0].invert_yaxis()  # first group on top, as in the tables
    fig.suptitle(title, fontsize=10)
    return fig


def escape(ds: xr.Dataset, fit: dict[str, Any]) -> plt.Figure | None:
    """ln(λτ) against 1/λ: measured (±1 SE), the fitted line, Kramers and the power-law slope."""
    if "params" not in fit:
        return None
    ok = _ok(ds) & np.isfinite(ds["escape_time"].values)
    lr, tau, se = ds["lr"].values[ok], ds["escape_time"].values[ok], ds["escape_time_se"].values[ok]
    x, y, ye = 1 / lr, np.log(lr * tau), se / tau
    grid = np.linspace(x.min() * 0.95, x.max() * 1.05, 50)
    fit_line = fit["params"]["intercept"]["estimate"] + fit["params"]["slope"]["estimate"] * grid
    fig, (ax, axr) = _two_panels()
    ax.errorbar(x, y, yerr=ye, fmt="o", ms=5, capsize=3, label="measured ±1 SE (censored MLE)")
    ax.plot(grid, fit_line, "k-", lw=1, label=f"fit: slope {fit['params']['slope']['estimate']:.4g}")
    if "escape_time_theory_arrhenius" in ds and np.isfinite(ds["escape_time_theory_arrhenius"].values[ok]).all():
        th = ds["escape_time_theory_arrhenius"].values[ok]
        order = np.argsort(x)
        ax.plot(x[order], np.log(lr * th)[order], "b--", lw=1, label="Kramers (Arrhenius)")
    slope_pw = fit["params"]["slope"].get("theory_powerlaw")
    if slope_pw is not None:  # the power law predicts only the slope: anchor it at the data's centroid
        ax.plot(grid, y.mean() + slope_pw * (grid - x.mean()), "g:", lw=1.2, label="power law (slope only)")
    ax.set_ylabel("ln(λ τ)  [τ in steps; λτ in time units]")
    ax.legend(fontsize=8)
    ax.set_title("Escape time against inverse learning rate")
    pred = fit["params"]["intercept"]["estimate"] + fit["params"]["slope"]["estimate"] * x
    axr.errorbar(x, (y - pred) / ye, fmt="o", ms=4)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel("1/λ  [1/learning rate]")
    axr.set_ylabel("residual / SE")
    return fig


def spectra(ds: xr.Dataset, max_points: int = 4) -> plt.Figure | None:
    """Covariance eigenvalues per mode for a few points: measured and every theory stored."""
    if "weight_cov_eigenvalues" not in ds:
        return None
    ok = np.flatnonzero(_ok(ds) & np.isfinite(ds["weight_cov_eigenvalues"].values).any(axis=1))
    if ok.size == 0:
        return None
    pick = ok[np.linspace(0, ok.size - 1, min(max_points, ok.size)).astype(int)]
    theories = [(n, s) for n, s in (("weight_cov_eigenvalues_theory", "k--"),
                                    ("weight_cov_eigenvalues_theory_continuous", "b:"),
                                    ("weight_cov_eigenvalues_theory_detailed_balance", "g-.")) if n in ds]
    named = ["lr", "batch_size"] + [a for a in _swept(ds) if a not in ("lr", "batch_size")]
    fig, axes = plt.subplots(1, pick.size, figsize=(3.2 * pick.size + 1, 3.6), squeeze=False, sharey=True)
    for ax, i in zip(axes[0], pick):
        vals = ds["weight_cov_eigenvalues"].values[i]
        modes = np.arange(1, np.isfinite(vals).sum() + 1)
        ax.plot(modes, vals[: modes.size], "o", ms=3, label="measured")
        for name, style in theories:
            th = ds[name].values[i][: modes.size]
            ax.plot(modes, th, style, lw=1, label=name.replace("weight_cov_eigenvalues_", "").replace("_", " "))
        ax.set_yscale("log")
        ax.set_xlabel("mode (largest first)")
        ax.set_title(label_of(named, tuple(ds[a].values[i:i + 1].tolist()[0] for a in named)), fontsize=8)
    axes[0][0].set_ylabel("covariance eigenvalue [weight²]")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Spectrum of the stationary weight covariance")
    return fig


def wigner(ds: xr.Dataset, results: list[dict[str, Any]], max_points: int = 3) -> plt.Figure | None:
    """Per point: histogram of δx/σ against the pair density, and of s/⟨s⟩ against the Wigner surmise."""
    from sgdsweep.theory import rmt  # with SciPy's statistics: loaded only for this figure

    good = [r for r in results if "params" in r][:max_points]
    if not good:
        return None
    fig, axes = plt.subplots(2, len(good), figsize=(3.4 * len(good) + 0.6, 6), squeeze=False)
    index = {str(p): i for i, p in enumerate(ds["point"].values)}
    for j, res in enumerate(good):
        sv = ds[f"singular_values_{res['layer']}"].values[index[res["point"]]][:, res["pair"]]
        x = sv[np.all(np.isfinite(sv), axis=1)] ** 2
        sigma = res["params"]["sigma"]["estimate"]
        dx = (x.ravel() - res["centre"]) / sigma
        grid = np.linspace(-4, 4, 200)
        ax = axes[0][j]
        ax.hist(dx, bins=30, density=True, alpha=0.6, label="measured")
        ax.plot(grid, rmt.pair_density(grid, 1.0), "k-", lw=1, label="pair density (β = 1)")
        ax.set_xlabel("δx / σ  [1]")
        where = ", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}" for k, v in res["group"].items())
        ax.set_title(f"{where}\nBinder {res['params']['binder']['estimate']:.3f} (theory −4/27)", fontsize=8)
        spacing = np.abs(x[:, 0] - x[:, 1])
        s = spacing / spacing.mean()
        ax = axes[1][j]
        sg = np.linspace(0, 3.5, 200)
        ax.hist(s, bins=25, density=True, alpha=0.6, label="measured")
        ax.plot(sg, rmt.wigner_surmise_pdf(sg), "k-", lw=1, label="Wigner surmise")
        ax.set_xlabel("spacing s / ⟨s⟩  [1]")
        ax.set_title(f"KS p = {res['ks_pvalue']:.3g}", fontsize=9)
    axes[0][0].set_ylabel("density")
    axes[1][0].set_ylabel("density")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle("Degenerate eigenvalue pair of WᵀW across replicas")
    fig.tight_layout()
    return fig


def wigner_width(ds: xr.Dataset, results: list[dict[str, Any]]) -> plt.Figure | None:
    """Park et al. Fig. 3: the pair width σ of every point against √(λ/S) = √(α/|B|), marked by
    batch size; the linear scaling rule puts all points on one line through the origin (drawn:
    the least-squares slope through the origin)."""
    good = [r for r in results if "params" in r]
    if len(good) < 2:
        return None
    index = {str(p): i for i, p in enumerate(ds["point"].values)}
    rows = [index[r["point"]] for r in good]
    x = np.sqrt(ds["lr"].values[rows].astype(float) / ds["batch_size"].values[rows].astype(float))
    sig = np.array([r["params"]["sigma"]["estimate"] for r in good])
    lo = np.array([r["params"]["sigma"]["interval"][0] for r in good], dtype=float)
    hi = np.array([r["params"]["sigma"]["interval"][1] for r in good], dtype=float)
    batch = ds["batch_size"].values[rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for b, c in zip(np.unique(batch), plt.cm.viridis(np.linspace(0, 0.85, np.unique(batch).size))):
        m = batch == b
        ax.errorbar(x[m], sig[m], yerr=[sig[m] - lo[m], hi[m] - sig[m]], fmt="o", color=c, ms=4, capsize=2,
                    label=f"S = {b}")
    slope = float(x @ sig / (x @ x))
    xx = np.linspace(0, x.max() * 1.05, 20)
    ax.plot(xx, slope * xx, "k--", lw=0.8, label=f"σ = {slope:.3g}·√(λ/S)")
    ax.set_xlabel("√(λ/S) = √(α/|B|)  [1]")
    ax.set_ylabel("pair width σ  [weight²]")
    ax.set_title("Linear scaling rule: the width depends on λ/S only (one line through 0)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def flatness(ds: xr.Dataset, results: list[dict[str, Any]], max_points: int = 4) -> plt.Figure | None:
    """Variance against curvature along one layer's covariance modes (log–log) with the fitted line."""
    good = [r for r in results if "params" in r][:max_points]
    if not good:
        return None
    index = {str(p): i for i, p in enumerate(ds["point"].values)}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for res, c in zip(good, plt.cm.viridis(np.linspace(0, 0.85, len(good)))):
        i, cols = index[res["point"]], flatness_columns(res["layer"])
        v, k = ds[cols["variance"]].values[i], ds[cols["curvature"]].values[i]
        sel = np.isfinite(v) & np.isfinite(k) & (v > 0) & (k > 0)
        ax.plot(k[sel], v[sel], "o", color=c, ms=4,
                label=", ".join(f"{k} = {v:g}" if isinstance(v, float) else f"{k} = {v}"
                                for k, v in res["group"].items()) + f": ψ = {res['params']['psi']['estimate']:.2f}")
        slope = res["params"]["psi"]["estimate"] / 2
        kk = np.geomspace(k[sel].min(), k[sel].max(), 20)
        ax.plot(kk, np.exp(np.mean(np.log(v[sel]) - slope * np.log(k[sel]))) * kk**slope, "-", color=c, lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    where = "the weights'" if good[0]["layer"] == ALL_WEIGHTS else good[0]["layer"]
    ax.set_xlabel(f"curvature vᵢᵀHvᵢ along {where} covariance modes  [loss/weight²]")
    ax.set_ylabel("variance along the mode  [weight²]")
    ax.set_title("Variance against curvature: slope ψ/2 (ψ = 2: inverse variance–flatness)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


#: Status colours of the coverage map.
STATUS = ("done", "partly diverged", "diverged")


def point_status(ds: xr.Dataset) -> np.ndarray:
    """Per point: 0 done, 1 some replicas diverged, 2 every replica diverged."""
    n = ds.sizes["point"]
    if "diverged_replicas" not in ds:
        return np.where(_ok(ds), 0, 2)
    dr = ds["diverged_replicas"].values
    reps = int(ds.sizes.get("replica", 0)) or 1
    finite = np.isfinite(ds["weight_var_replica"].values).sum(axis=1) if "weight_var_replica" in ds else None
    total = dr + finite if finite is not None else np.full(n, reps)
    return np.where(dr == 0, 0, np.where(dr >= total, 2, 1))


def coverage_worth_showing(ds: xr.Dataset) -> bool:
    """Whether the coverage map says more than "every point of a full grid is done": some point
    has diverged replicas, or the swept values do not form a full product (gaps in the grid)."""
    if (point_status(ds) != 0).any():
        return True
    axes = list(dict.fromkeys(["lr", "batch_size", *_swept(ds)]))
    full = int(np.prod([len(set(ds[a].values.tolist())) for a in axes]))
    return len(split_by(ds, axes)) < full


def coverage(ds: xr.Dataset) -> plt.Figure:
    """Grid coverage: status of every (λ, S) cell, one panel per combination of the other swept axes."""
    swept = json.loads(ds.attrs.get("swept_axes", "[]"))
    others = [a for a in swept if a not in ("lr", "batch_size") and a in ds.coords]
    status = point_status(ds)
    keys = list(zip(*(ds[a].values.tolist() for a in others))) if others else [()] * ds.sizes["point"]
    panels = list(dict.fromkeys(keys))[:6]
    lrs, sizes = np.unique(ds["lr"].values), np.unique(ds["batch_size"].values)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(3.5, 1.2 + 0.5 * lrs.size) * len(panels),
                                                      2.4 + 0.35 * sizes.size), squeeze=False)
    cmap = ListedColormap(["#4c9a2a", "#e0a800", "#b22222"])
    for ax, key in zip(axes[0], panels):
        grid = np.full((sizes.size, lrs.size), np.nan)
        for i in np.flatnonzero([k == key for k in keys]):
            row, col = np.searchsorted(sizes, ds["batch_size"].values[i]), np.searchsorted(lrs, ds["lr"].values[i])
            grid[row, col] = status[i]
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=2, origin="lower", aspect="auto")
        ax.set_xticks(range(lrs.size), [f"{v:g}" for v in lrs], rotation=60, fontsize=7)
        ax.set_yticks(range(sizes.size), [f"{v:g}" for v in sizes], fontsize=7)
        ax.set_xlabel("λ (lr)")
        ax.set_title(", ".join(f"{a} = {v}" for a, v in zip(others, key)) or "all points", fontsize=8)
    axes[0][0].set_ylabel("S (batch_size)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(3)]
    fig.suptitle("Coverage of the grid (blank: not in the sweep)", fontsize=9)
    fig.tight_layout()
    fig.legend(handles, [f"{s} ({int((status == i).sum())})" for i, s in enumerate(STATUS)], fontsize=7,
               loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def shard_times(ds: xr.Dataset) -> plt.Figure:
    """Simulation time per shard (bar chart)."""
    per_shard = ds["simulation_seconds"].groupby(ds["shard"]).sum()
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.3 * per_shard.sizes["shard"]))
    ax.barh([str(s)[:12] for s in per_shard["shard"].values], per_shard.values)
    ax.set_xlabel("simulation time [s]")
    ax.set_title("Run time per shard", fontsize=9)
    return fig


def _theories(ds: xr.Dataset, name: str) -> list[tuple[str, str]]:
    """(variable, line style) of every theory of ``name`` present with a finite value."""
    styles = {"": "k--", "_continuous": "b:", "_detailed_balance": "g-."}
    out = []
    for suffix, style in styles.items():
        var = f"{name}_theory{suffix}"
        if var in ds and np.isfinite(np.asarray(ds[var].values, float)).any():
            out.append((var, style))
    return out


def _x_axis(ax, ds: xr.Dataset, axis: str, x: np.ndarray, log_ratio: float) -> None:
    """Label the x axis of ``ax`` with ``axis`` (no pseudo-unit for an integer axis); log scale
    when the values span more than ``log_ratio``; an integer axis gets ticks at its values."""
    ax.set_xlabel(axis_label(ds[axis].attrs, axis, ds[axis].dtype.kind))
    if np.all(x > 0) and x.max() / x.min() > log_ratio:
        ax.set_xscale("log")
    if ds[axis].dtype.kind in "iu":
        integer_ticks(ax, x)


def _dodge(x: np.ndarray, j: int, n: int) -> np.ndarray:
    """``x`` shifted a little for the ``j``-th of ``n`` groups drawn at the same values, so their
    markers stay apart (by a fraction of the smallest gap between distinct values)."""
    distinct = np.unique(x[np.isfinite(x)])
    if n < 2 or distinct.size < 2:
        return x
    gap = np.diff(distinct).min()
    return x + 0.25 * gap * (j - (n - 1) / 2) / (n - 1)


def against_axis(ds: xr.Dataset, axis: str, max_groups: int = 6) -> plt.Figure | None:
    """weight_var and loss (measured ± SE) with every theory of them against one swept axis, one
    colour per combination of the other swept axes (named in the legend); measured/exact theory
    below for the observables that have an exact theory (no lower panel for those without)."""
    names = [n for n in ("weight_var", "loss") if n in ds and f"{n}_se" in ds
             and np.isfinite(np.asarray(ds[n].values, float)).any()]
    if not names or axis not in ds.coords or ds[axis].dtype.kind not in "fiu":
        return None
    others = [a for a in _swept(ds) if a != axis]
    groups_ = split_by(ds, others)[:max_groups]
    x_all = np.asarray(ds[axis].values, float)
    ok = _ok(ds)
    exact = {n: f"{n}_theory" in ds and np.isfinite(np.asarray(ds[f"{n}_theory"].values, float)).any()
             for n in names}
    rows = 2 if any(exact.values()) else 1
    fig, axes = plt.subplots(rows, len(names), figsize=(6 * len(names), 6.5 if rows == 2 else 4.8), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3][:rows]}, layout="constrained")
    colours = plt.cm.viridis(np.linspace(0, 0.85, len(groups_)))
    for col, name in enumerate(names):
        ax = axes[0][col]
        axr = axes[1][col] if rows == 2 and exact[name] else None
        if rows == 2 and not exact[name]:
            fig.delaxes(axes[1][col])
        for j, ((key, sel), c) in enumerate(zip(groups_, colours)):
            order = np.argsort(x_all[sel])
            x = _dodge(x_all[sel][order], j, len(groups_)) if ds[axis].dtype.kind in "iu" else x_all[sel][order]
            good = ok[sel][order]
            y, se = ds[name].values[sel][order], ds[f"{name}_se"].values[sel][order]
            ax.errorbar(x[good], y[good], yerr=se[good], fmt="o", color=c, ms=4, capsize=2,
                        label=("measured " + label_of(others, key)).strip())
            if (~good).any():
                ax.plot(x[~good], np.full((~good).sum(), np.nanmin(y[good]) if good.any() else 1.0), "rx")
            for var, style in _theories(ds, name):
                ax.plot(x, ds[var].values[sel][order], linestyle=style[1:], color=c, lw=1,
                        label=var.replace(name + "_", "") if j == 0 else None)
            if axr is not None:
                th = ds[f"{name}_theory"].values[sel][order]
                axr.errorbar(x[good], (y / th)[good], yerr=(se / th)[good], fmt="o", color=c, ms=4)
        measured = np.asarray(ds[name].values, float)[ok]
        if np.nanmin(measured) > 0 and np.nanmax(measured) / np.nanmin(measured) > 10:
            ax.set_yscale("log")
        ax.set_ylabel(axis_label(ds[name].attrs, name))
        ax.legend(fontsize=7)
        if axr is not None:
            axr.sharex(ax)
            ax.tick_params(labelbottom=False)
            axr.axhline(1.0, color="k", lw=0.8)
            axr.set_ylabel("measured / exact theory")
        _x_axis(axr if axr is not None else ax, ds, axis, x_all, 20)
    fig.suptitle(f"Measured (±1 SE){' and theory' if any(exact.values()) else ''} against {axis}"
                 + ("; red x: diverged" if (~ok).any() else ""), fontsize=10)
    return fig


def spectrum_against_axis(ds: xr.Dataset, axis: str, name: str = "weight_cov_eigenvalues",
                          scale: np.ndarray | None = None, ylabel: str | None = None,
                          max_groups: int = 6) -> plt.Figure | None:
    """Every eigenvalue of ``name`` per point (dots) and its theories (lines) against a swept axis,
    one colour per combination of the other swept axes (named in the legend), divided by ``scale``
    per point when given (e.g. λσ²/(2S): Gross Fig. 5b)."""
    if name not in ds or axis not in ds.coords or ds[axis].dtype.kind not in "fiu":
        return None
    x_all = np.asarray(ds[axis].values, float)
    scale = np.ones(x_all.size) if scale is None else np.asarray(scale, float)
    vals = np.asarray(ds[name].values, float) / scale[:, None]
    if vals.shape[1] < 2 or not np.any(np.isfinite(vals) & (vals > 0)):
        return None  # one mode (the against-axis figure shows it) or nothing positive to draw
    others = [a for a in _swept(ds) if a != axis]
    groups_ = split_by(ds, others)[:max_groups]
    fig, ax = plt.subplots(figsize=(7, 5))
    for j, ((key, sel), c) in enumerate(zip(groups_, plt.cm.viridis(np.linspace(0, 0.85, len(groups_))))):
        order = np.argsort(x_all[sel])
        x = _dodge(x_all[sel][order], j, len(groups_)) if ds[axis].dtype.kind in "iu" else x_all[sel][order]
        v = vals[sel][order]
        ax.plot(np.repeat(x, v.shape[1]), v.ravel(), "o", color=c, ms=3,
                label=("measured " + label_of(others, key)).strip())
        for var, style in _theories(ds, name):
            th = np.asarray(ds[var].values, float)[sel][order] / scale[sel][order][:, None]
            for k in range(th.shape[1]):
                ax.plot(x, th[:, k], style[1:], color=c, lw=0.8,
                        label=var.replace(name + "_", "") if j == 0 and k == 0 else None)
    ax.set_yscale("log")
    _x_axis(ax, ds, axis, x_all, 5)
    ax.set_ylabel(ylabel or axis_label(ds[name].attrs, name))
    ax.legend(fontsize=8)
    ax.set_title(f"{ds[name].attrs.get('long_name', name)} against {axis}", fontsize=10)
    return fig


def fdr_fourier(ds: xr.Dataset, max_points: int = 3) -> plt.Figure | None:
    """Han et al. 2021 Fig. 2 (bottom): normalised Fourier profiles of ΣxxΣ_WW + Σ_WWΣxx and of
    D(0) along k = (k_x, 0), per point; they coincide where the fluctuation–dissipation relation holds."""
    if "fdr_fourier_lhs" not in ds:
        return None
    rows = [i for i in range(ds.sizes["point"]) if np.isfinite(ds["fdr_fourier_lhs"].values[i]).any()][:max_points]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, c in zip(rows, plt.cm.viridis(np.linspace(0, 0.85, len(rows)))):
        lhs, noise = ds["fdr_fourier_lhs"].values[i], ds["fdr_fourier_noise"].values[i]
        j = np.arange(lhs.size)
        ax.plot(j, noise, "o-", color=c, ms=3, lw=0.8, label=f"D(0), λ = {ds['lr'].values[i]:g}")
        ax.plot(j, lhs, "s--", color=c, ms=3, lw=0.8, mfc="none", label="ΣxxΣ_WW + Σ_WWΣxx")
    ax.set_xlabel("k_x / (2π / number of pixels)")
    ax.set_ylabel("|Â(k_x, 0)| / |Â(0, 0)|")
    ax.set_title("Fourier profiles of the two sides of the fluctuation–dissipation relation", fontsize=10)
    ax.legend(fontsize=7)
    return fig
