"""Figures that lead a report (:mod:`sgdsweep.sweep.lead`) where no section figure answers the
sweep's question: the variance against momentum with the exact stability edge, the two layers'
joint fluctuation spectrum against its isotropic value, and every group's escape times in one
panel. Conventions as :mod:`sgdsweep.analysis.figures`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.figures import (
    MATH_SYMBOL,
    THEORY_Z,
    _ok,
    _swept,
    legend_label,
    mark_diverged,
    not_shown,
    split_by,
)
from sgdsweep.analysis.plotting import integer_ticks, plt


def momentum(ds: xr.Dataset, edges: list[dict[str, Any]], curves: list[dict[str, Any]]) -> plt.Figure | None:
    """Weight variance (measured ± SE) against μ, one colour per combination of the other swept
    axes; the exact theory at each point (dashes) and, where given, as a curve over μ (line);
    the exact stability edge of each combination as a vertical line with its unstable side
    shaded; diverged points as :func:`~sgdsweep.analysis.figures.mark_diverged`; measured/theory
    below.

    Args:
        ds: the ensemble (``momentum`` a coordinate).
        edges: per combination ``{"key": values of the other axes, "lower": μ below which the
            second moment diverges or None, "upper": μ above which it does or None}``.
        curves: per combination ``{"key", "mu": array, "theory": array}`` (may be empty).
    """
    if "momentum" not in ds.coords or "weight_var" not in ds:
        return None
    others = [a for a in _swept(ds) if a != "momentum"]
    groups = split_by(ds, others)
    mu_all = np.asarray(ds["momentum"].values, float)
    ok = _ok(ds)
    has_theory = "weight_var_theory" in ds and np.isfinite(ds["weight_var_theory"].values[ok]).any()
    fig, axes = plt.subplots(2 if has_theory else 1, 1, figsize=(7, 6.2 if has_theory else 4.6), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [3, 1.2][:2 if has_theory else 1]})
    ax, axr = axes[0][0], (axes[1][0] if has_theory else None)
    colours = plt.cm.viridis(np.linspace(0, 0.8, len(groups)))
    tops: list[float] = []
    for j, ((key, sel), c) in enumerate(zip(groups, colours)):
        order = np.argsort(mu_all[sel])
        mu, good = mu_all[sel][order], ok[sel][order]
        y, se = ds["weight_var"].values[sel][order], ds["weight_var_se"].values[sel][order]
        name = legend_label(others, key)
        ax.errorbar(mu[good], y[good], yerr=se[good], fmt="o", color=c, ms=5, capsize=3,
                    label=("measured " + name).strip())
        curve = next((cv for cv in curves if tuple(cv["key"]) == tuple(key)), None)
        line = "k" if len(groups) == 1 else c
        if curve is not None and len(curve["mu"]):
            ax.plot(curve["mu"], curve["theory"], "-", color=line, lw=1.2, zorder=THEORY_Z,
                    label="exact theory" if j == 0 else None)
        if has_theory:
            th = ds["weight_var_theory"].values[sel][order]
            if curve is None or not len(curve["mu"]):  # no curve: the theory at each point
                ax.plot(mu[good], th[good], "_", color=line, ms=16, mew=1.8, zorder=THEORY_Z,
                        label="exact theory" if j == 0 else None)
            axr.errorbar(mu[good], (y / th)[good], yerr=(se / th)[good], fmt="o", color=c, ms=4, capsize=2)
            top = np.nanmax(np.r_[y[good] + se[good], th[good]]) if good.any() else np.nan
            tops.append(top)
        mark_diverged(ax, mu[~good])
        edge = next((e for e in edges if tuple(e["key"]) == tuple(key)), None)
        if edge is not None:
            for side, value in (("lower", edge.get("lower")), ("upper", edge.get("upper"))):
                if value is None or not np.isfinite(value):
                    continue
                ax.axvline(value, color="C3", ls="--", lw=1.4, zorder=THEORY_Z,
                           label=rf"exact edge $\mu$ = {value:.4g}" + (f" ({name})" if name else ""))
                lo, hi = ax.get_xlim()
                span = (min(lo, value), value) if side == "lower" else (value, max(hi, value))
                ax.axvspan(*span, color="C3", alpha=0.07, lw=0)
                ax.set_xlim(lo, hi)
    ax.set_yscale("log")
    if tops and np.isfinite(tops).any():  # the theory diverges at the edge: it leaves through the top
        bottom, _ = ax.get_ylim()
        ax.set_ylim(bottom, max(np.nanmax(tops) * 30, bottom * 10))
    ax.set_ylabel(r"weight variance Tr $M/N$")
    ax.legend(fontsize=8)
    ax.set_title(r"Weight variance against $\mu$: measured (±1 SE), exact theory, stability edge"
                 "\n(shaded: no stationary variance)", fontsize=9)
    if axr is not None:
        axr.axhline(1.0, color="k", lw=0.8, zorder=THEORY_Z)
        axr.set_ylabel("measured / theory")
    (axr if axr is not None else ax).set_xlabel(r"momentum $\mu$")
    return fig


def isotropy(ds: xr.Dataset, max_points: int = 9) -> plt.Figure | None:
    """Two layers (Gross et al.): per point the eigenvalues of the joint covariance on the range
    of Γ divided by the isotropic theory λ⟨r²⟩/(2S) (one at every mode when isotropic, drawn as
    a line above the points), for at most ``max_points`` points (the title says how many more);
    and the mean eigenvalue of the stiff directions, measured ± SE over theory, against the
    first swept axis."""
    if "range_cov_eigenvalues" not in ds or "joint_eigenvalue_theory" not in ds:
        return None
    ok = _ok(ds) & np.isfinite(np.asarray(ds["joint_eigenvalue_theory"].values, float))
    rows = np.flatnonzero(ok)
    if rows.size == 0:
        return None
    drawn = rows[:max_points]
    swept = _swept(ds)
    fig, (ax, axm) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.4, 1]})
    theory = np.asarray(ds["joint_eigenvalue_theory"].values, float)
    for i, c in zip(drawn, plt.cm.viridis(np.linspace(0, 0.85, drawn.size))):
        vals = np.asarray(ds["range_cov_eigenvalues"].values[i], float)
        vals = vals[np.isfinite(vals)] / theory[i]
        ax.plot(np.arange(1, vals.size + 1), vals, "o-", color=c, ms=3, lw=0.6,
                label=legend_label(swept, tuple(ds[a].values[i] for a in swept)) or "all points")
    ax.axhline(1.0, color="k", ls="--", lw=1.2, zorder=THEORY_Z,
               label=r"isotropic theory $\lambda\langle r^2\rangle/(2S)$")
    ax.set_yscale("log")
    modes = np.asarray(ds["range_cov_eigenvalues"].values, float)[drawn]
    integer_ticks(ax, np.arange(1, int(np.isfinite(modes).sum(axis=1).max()) + 1))
    ax.set_xlabel(r"mode of the joint covariance on the range of $\Gamma$ (largest first)")
    ax.set_ylabel("eigenvalue / isotropic theory")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Joint fluctuation spectrum" + not_shown(rows.size, drawn.size, "points", f"the first {max_points}"),
                 fontsize=9)
    axis = next((a for a in swept if len(set(ds[a].values.tolist())) > 1), swept[0] if swept else "lr")
    others = [a for a in swept if a != axis]
    for (key, sel), c in zip(split_by(ds, others), plt.cm.plasma(np.linspace(0, 0.8, len(split_by(ds, others))))):
        m = sel & ok
        x = np.asarray(ds[axis].values, float)[m]
        y = np.asarray(ds["joint_eigenvalue"].values, float)[m] / theory[m]
        se = np.asarray(ds["joint_eigenvalue_se"].values, float)[m] / theory[m]
        order = np.argsort(x)
        axm.errorbar(x[order], y[order], yerr=se[order], fmt="o", color=c, ms=4, capsize=2,
                     label=("measured " + legend_label(others, key)).strip())
    axm.axhline(1.0, color="k", ls="--", lw=1.2, zorder=THEORY_Z, label="theory")
    axm.set_xlabel(MATH_SYMBOL.get(axis, axis))
    axm.set_ylabel("mean stiff eigenvalue / theory")
    axm.legend(fontsize=7)
    axm.set_title(r"Stiff directions' mean eigenvalue against " + MATH_SYMBOL.get(axis, axis), fontsize=9)
    fig.tight_layout()
    return fig


def escape_overview(ds: xr.Dataset, results: list[dict[str, Any]]) -> plt.Figure | None:
    """ln(λτ) against 1/λ for every fitted group of the escape fit in one panel: measured ± SE
    (points), the exact discrete chain's τ (dashed) and Kramers' law (dotted) of each group
    above them."""
    fitted = [r for r in results if r.get("params")]
    if not fitted or "escape_time" not in ds:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ok = _ok(ds) & np.isfinite(np.asarray(ds["escape_time"].values, float))
    colours = plt.cm.viridis(np.linspace(0, 0.8, len(fitted)))
    labelled: set[str] = set()  # each theory's legend entry once, on its first line
    for res, c in zip(fitted, colours):
        sel = ok.copy()
        for k, v in res.get("group", {}).items():
            sel &= ds[k].values == v
        lr = np.asarray(ds["lr"].values, float)[sel]
        order = np.argsort(1 / lr)
        lr = lr[order]
        tau = np.asarray(ds["escape_time"].values, float)[sel][order]
        se = np.asarray(ds["escape_time_se"].values, float)[sel][order]
        name = legend_label(list(res.get("group", {})), tuple(res.get("group", {}).values()))
        ax.errorbar(1 / lr, np.log(lr * tau), yerr=se / tau, fmt="o", color=c, ms=5, capsize=3,
                    label=("measured " + name).strip())
        for var, style, label in (("escape_time_theory_exact", "--", "exact discrete chain"),
                                  ("escape_time_theory_arrhenius", ":", "Kramers (Arrhenius)")):
            if var in ds:
                th = np.asarray(ds[var].values, float)[sel][order]
                if np.isfinite(th).any():
                    ax.plot(1 / lr, np.log(lr * th), style, color=c, lw=1.3, zorder=THEORY_Z,
                            label=None if label in labelled else label)
                    labelled.add(label)
    ax.set_xlabel(r"$1/\lambda$")
    ax.set_ylabel(r"$\ln(\lambda\tau)$, $\tau$ in steps")
    ax.legend(fontsize=8)
    ax.set_title("Escape time against inverse learning rate: measured (±1 SE) and theory", fontsize=10)
    return fig
