"""The report's figures of spectra and per-mode quantities: covariance spectra per point and
against a swept axis, the degenerate pair's random-matrix statistics and width (Park et al.), the
variance–flatness relation (Gross et al.) and the Fourier profiles of the fluctuation–dissipation
relation (Han et al.). Conventions as :mod:`sgdsweep.analysis.figures`: theory above the
measurements, mathtext labels, real units only, every panel or group drawn or the title says
how many are not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.figures import (
    MATH_SYMBOL,
    MAX_GROUPS,
    THEORY_Z,
    _dodge,
    _ok,
    _swept,
    _theories,
    _x_axis,
    legend_label,
    not_shown,
    split_by,
    theory_label,
)
from sgdsweep.analysis.fit.spectra import ALL_WEIGHTS, flatness_columns
from sgdsweep.analysis.plotting import axis_label, integer_ticks, math_text, plt


def spectra(ds: xr.Dataset, max_points: int = 4) -> plt.Figure | None:
    """Covariance eigenvalues per mode for at most ``max_points`` points spread over the sweep
    (the title says how many are not shown): measured and every theory stored, the theories
    above the measurements and as markers where a point has a single mode."""
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
        ax.plot(modes, vals[: modes.size], "o", ms=4, label="measured")
        for name, style in theories:  # a single mode has no line to draw: a bar marker instead
            th = ds[name].values[i][: modes.size]
            ax.plot(modes, th, style, lw=1.2, zorder=THEORY_Z, marker="_" if modes.size == 1 else None, ms=16,
                    mew=1.6, label=name.replace("weight_cov_eigenvalues_", "").replace("_", " "))
        ax.set_yscale("log")
        ax.set_xlabel("mode (largest first)")
        if modes.size == 1:
            integer_ticks(ax, modes)
        ax.set_title(legend_label(named, tuple(ds[a].values[i:i + 1].tolist()[0] for a in named)), fontsize=8)
    axes[0][0].set_ylabel("covariance eigenvalue")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Spectrum of the stationary weight covariance"
                 + not_shown(ok.size, pick.size, "points", f"at most {max_points} panels, spread over the sweep"),
                 fontsize=10)
    return fig


def wigner(ds: xr.Dataset, results: list[dict[str, Any]], max_points: int = 3) -> plt.Figure | None:
    """Per point: histogram of δx/σ against the pair density, and of s/⟨s⟩ against the Wigner surmise."""
    from sgdsweep.theory import rmt  # with SciPy's statistics: loaded only for this figure

    fitted = [r for r in results if "params" in r]
    good = fitted[:max_points]
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
        ax.plot(grid, rmt.pair_density(grid, 1.0), "k-", lw=1.2, zorder=THEORY_Z, label=r"pair density ($\beta$ = 1)")
        ax.set_xlabel(r"$\delta x/\sigma$")
        where = legend_label(list(res["group"]), tuple(res["group"].values()))
        ax.set_title(f"{where}\nBinder {res['params']['binder']['estimate']:.3f} (theory −4/27)", fontsize=8)
        spacing = np.abs(x[:, 0] - x[:, 1])
        s = spacing / spacing.mean()
        ax = axes[1][j]
        sg = np.linspace(0, 3.5, 200)
        ax.hist(s, bins=25, density=True, alpha=0.6, label="measured")
        ax.plot(sg, rmt.wigner_surmise_pdf(sg), "k-", lw=1.2, zorder=THEORY_Z, label="Wigner surmise")
        ax.set_xlabel(r"spacing $s/\langle s\rangle$")
        ax.set_title(f"KS p = {res['ks_pvalue']:.3g}", fontsize=9)
    axes[0][0].set_ylabel("density")
    axes[1][0].set_ylabel("density")
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle(r"Degenerate eigenvalue pair of $W^\top W$ across replicas"
                 + not_shown(len(fitted), len(good), "points", f"the first {max_points}"), fontsize=10)
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
                    label=f"$S$ = {b}")
    slope = float(x @ sig / (x @ x))
    xx = np.linspace(0, x.max() * 1.05, 20)
    ax.plot(xx, slope * xx, "k--", lw=1.0, zorder=THEORY_Z, label=rf"$\sigma$ = {slope:.3g} $\sqrt{{\lambda/S}}$")
    ax.set_xlabel(r"$\sqrt{\lambda/S}$ ($=\sqrt{\alpha/|B|}$)")
    ax.set_ylabel(r"pair width $\sigma$")
    ax.set_title("Linear scaling rule: the width depends on λ/S only (one line through 0)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


#: The flatness figure draws at most this many points (the title says how many more there are).
MAX_FLATNESS_POINTS = 10


def flatness(ds: xr.Dataset, results: list[dict[str, Any]],
             max_points: int = MAX_FLATNESS_POINTS) -> plt.Figure | None:
    """Variance against curvature along one layer's covariance modes (log–log), every fitted
    point (up to ``max_points``; the title says how many are not shown) with its fitted line
    (solid, slope ψ/2) and the exact theory's slope (dashed, through the same centre)."""
    fitted = [r for r in results if "params" in r]
    good = fitted[:max_points]
    if not good:
        return None
    index = {str(p): i for i, p in enumerate(ds["point"].values)}
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for j, (res, c) in enumerate(zip(good, plt.cm.viridis(np.linspace(0, 0.9, len(good))))):
        i, cols = index[res["point"]], flatness_columns(res["layer"])
        v, k = ds[cols["variance"]].values[i], ds[cols["curvature"]].values[i]
        sel = np.isfinite(v) & np.isfinite(k) & (v > 0) & (k > 0)
        psi = res["params"]["psi"]
        ax.plot(k[sel], v[sel], "o", color=c, ms=4, label=legend_label(list(res["group"]), tuple(res["group"].values()))
                + rf": $\psi$ = {psi['estimate']:.2f}")
        kk = np.geomspace(k[sel].min(), k[sel].max(), 20)
        centre = np.mean(np.log(v[sel]) - psi["estimate"] / 2 * np.log(k[sel]))
        ax.plot(kk, np.exp(centre) * kk ** (psi["estimate"] / 2), "-", color=c, lw=0.8)
        if psi.get("theory") is not None:
            mid = np.exp(np.mean(np.log(k[sel])))
            level = np.exp(centre) * mid ** (psi["estimate"] / 2)
            ax.plot(kk, level * (kk / mid) ** (psi["theory"] / 2), "--", color=c, lw=1.2, zorder=THEORY_Z,
                    label=r"exact theory's $\psi$ (dashed)" if j == 0 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    where = "the weights'" if good[0]["layer"] == ALL_WEIGHTS else good[0]["layer"]
    ax.set_xlabel(rf"curvature $v_i^\top H v_i$ along {where} covariance modes")
    ax.set_ylabel("variance along the mode")
    ax.set_title(r"Variance against curvature: slope $\psi/2$ ($\psi$ = 2: inverse variance–flatness)"
                 + not_shown(len(fitted), len(good), "points", f"at most {max_points}"), fontsize=9)
    ax.legend(fontsize=7)
    return fig


def spectrum_against_axis(ds: xr.Dataset, axis: str, name: str = "weight_cov_eigenvalues",
                          scale: np.ndarray | None = None, ylabel: str | None = None,
                          max_groups: int = MAX_GROUPS) -> plt.Figure | None:
    """Every eigenvalue of ``name`` per point (dots) and its theories (lines, above the dots)
    against a swept axis, one colour per combination of the other swept axes (named in the
    legend; at most ``max_groups``, the title says how many more), divided by ``scale`` per
    point when given (e.g. λσ²/(2S): Gross Fig. 5b)."""
    if name not in ds or axis not in ds.coords or ds[axis].dtype.kind not in "fiu":
        return None
    x_all = np.asarray(ds[axis].values, float)
    scale = np.ones(x_all.size) if scale is None else np.asarray(scale, float)
    vals = np.asarray(ds[name].values, float) / scale[:, None]
    if vals.shape[1] < 2 or not np.any(np.isfinite(vals) & (vals > 0)):
        return None  # one mode (the against-axis figure shows it) or nothing positive to draw
    others = [a for a in _swept(ds) if a != axis]
    every = split_by(ds, others)
    groups_ = every[:max_groups]
    fig, ax = plt.subplots(figsize=(7, 5))
    for j, ((key, sel), c) in enumerate(zip(groups_, plt.cm.viridis(np.linspace(0, 0.85, len(groups_))))):
        order = np.argsort(x_all[sel])
        x = _dodge(x_all[sel][order], j, len(groups_)) if ds[axis].dtype.kind in "iu" else x_all[sel][order]
        v = vals[sel][order]
        ax.plot(np.repeat(x, v.shape[1]), v.ravel(), "o", color=c, ms=3,
                label=("measured " + legend_label(others, key)).strip())
        for var, style in _theories(ds, name):
            th = np.asarray(ds[var].values, float)[sel][order] / scale[sel][order][:, None]
            for k in range(th.shape[1]):
                ax.plot(x, th[:, k], style[1:], color=c, lw=1.0, zorder=THEORY_Z,
                        label=theory_label(name, var) if j == 0 and k == 0 else None)
    ax.set_yscale("log")
    _x_axis(ax, ds, axis, x_all, 5)
    ax.set_ylabel(ylabel or axis_label(ds[name].attrs, name))
    ax.legend(fontsize=8)
    ax.set_title(f"{math_text(str(ds[name].attrs.get('long_name', name)))} against {MATH_SYMBOL.get(axis, axis)}"
                 + not_shown(len(every), len(groups_), "groups", f"at most {max_groups} colours"), fontsize=10)
    return fig


def fdr_fourier(ds: xr.Dataset, max_points: int = 3) -> plt.Figure | None:
    """Han et al. 2021 Fig. 2 (bottom): normalised Fourier profiles of ΣxxΣ_WW + Σ_WWΣxx and of
    D(0) along k = (k_x, 0), for the first ``max_points`` points (the title says how many more);
    they coincide where the fluctuation–dissipation relation holds."""
    if "fdr_fourier_lhs" not in ds:
        return None
    every = [i for i in range(ds.sizes["point"]) if np.isfinite(ds["fdr_fourier_lhs"].values[i]).any()]
    rows = every[:max_points]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (i, c) in enumerate(zip(rows, plt.cm.viridis(np.linspace(0, 0.85, len(rows))))):
        lhs, noise = ds["fdr_fourier_lhs"].values[i], ds["fdr_fourier_noise"].values[i]
        j = np.arange(lhs.size)
        ax.plot(j, noise, "o-", color=c, ms=3, lw=0.8, label=rf"$D(0)$, $\lambda$ = {ds['lr'].values[i]:g}")
        ax.plot(j, lhs, "s--", color=c, ms=3, lw=0.8, mfc="none",
                label=r"$\Sigma_{xx}\Sigma_{WW} + \Sigma_{WW}\Sigma_{xx}$ (hollow, dashed)" if n == 0 else None)
    ax.set_xlabel(r"$k_x$ / ($2\pi$ / number of pixels)")
    ax.set_ylabel(r"$|\hat A(k_x, 0)| / |\hat A(0, 0)|$")
    ax.set_title("Fourier profiles of the two sides of the fluctuation–dissipation relation"
                 + not_shown(len(every), len(rows), "points", f"the first {max_points}"), fontsize=10)
    ax.legend(fontsize=7)
    return fig
