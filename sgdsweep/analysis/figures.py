"""The report's figures: each function takes the ensemble (and a fit result) and returns a
matplotlib figure, or None when the data hold nothing to draw. Axes carry names (Greek symbols in
mathtext) and real units only (:func:`sgdsweep.analysis.plotting.axis_label`); measured values
carry ±1 standard-error bars; theory is drawn as lines above the measurements (:data:`THEORY_Z`).
Every swept axis that tells points apart is named in the titles or legends, and every group or
panel is drawn, or the figure says how many are not and why; a panel is drawn only when it has
something to show (no residual panel without a theory). Diverged points are hollow grey
triangles at the bottom edge, in the legend as "diverged" (:func:`mark_diverged`). The PNG and
SVG of a figure are :func:`sgdsweep.analysis.plotting.render`'s. The figures of spectra are in
:mod:`sgdsweep.analysis.spectra_figures`, those that lead a report in :mod:`sgdsweep.analysis.lead_figures`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.colors import ListedColormap

from sgdsweep.analysis.plotting import axis_label, integer_ticks, math_text, plt

#: Drawing order: theory lines and markers above the measured points and bars (matplotlib draws
#: lines at 2), the diverged markers above both.
THEORY_Z = 4
DIVERGED_Z = 5
#: Legend text of the diverged markers.
DIVERGED = "diverged (no stationary value)"


def _ok(ds: xr.Dataset) -> np.ndarray:
    return ~ds["diverged"].values.astype(bool) if "diverged" in ds else np.ones(ds.sizes["point"], bool)


def _two_panels(height: float = 6.5):
    return plt.subplots(2, 1, figsize=(7, height), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})


#: Short names of the axes in the report's text (others go by their own name).
SYMBOL = {"lr": "λ", "batch_size": "S", "momentum": "μ"}
#: The same in figures (mathtext).
MATH_SYMBOL = {"lr": r"$\lambda$", "batch_size": "$S$", "momentum": r"$\mu$"}


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def label_of(axes: list[str], key: tuple) -> str:
    """``S = 4, hidden_width = 2``: the values ``key`` of ``axes``, with λ, S, μ for the usual ones."""
    return ", ".join(f"{SYMBOL.get(a, a)} = {_value(v)}" for a, v in zip(axes, key))


def legend_label(axes: list[str], key: tuple) -> str:
    """:func:`label_of` for a figure: ``$S$ = 4, $N_h$ = 2`` (mathtext symbols)."""
    return ", ".join(f"{MATH_SYMBOL.get(a, a)} = {_value(v)}" for a, v in zip(axes, key))


def _swept(ds: xr.Dataset) -> list[str]:
    return [a for a in json.loads(ds.attrs.get("swept_axes", "[]")) if a in ds.coords]


def group_codes(ds: xr.Dataset, axes: list[str]) -> tuple[np.ndarray, list[tuple]]:
    """(per point, the index of its combination of the values of ``axes``; the combinations as
    tuples of Python scalars), combinations numbered in the order they first occur among the
    points. Vectorised (no Python step per point): linear in the number of points."""
    n = ds.sizes["point"]
    codes = np.zeros(n, np.int64)
    for a in axes:
        inner, uniques = pd.factorize(np.asarray(ds[a].values), use_na_sentinel=False)
        codes = pd.factorize(codes * len(uniques) + inner, use_na_sentinel=False)[0]
    if not axes:
        return codes, [()] if n else []
    first = np.unique(codes, return_index=True)[1]  # codes are numbered by first occurrence
    columns = [np.asarray(ds[a].values)[first].tolist() for a in axes]
    return codes, list(zip(*columns))


def split_by(ds: xr.Dataset, axes: list[str]) -> list[tuple[tuple, np.ndarray]]:
    """(values of ``axes``, boolean mask over points) for every combination present, in order."""
    codes, keys = group_codes(ds, axes)
    return [(key, codes == j) for j, key in enumerate(keys)]


def distinct(ds: xr.Dataset, axis: str) -> int:
    """How many distinct values ``axis`` takes over the points."""
    return len(pd.unique(np.asarray(ds[axis].values).ravel()))


def mark_diverged(ax, x: np.ndarray) -> None:
    """Hollow grey triangles at the bottom edge of ``ax`` at the x values ``x`` (data
    coordinates) of diverged points, with the legend entry :data:`DIVERGED`: they hold no
    measured value, so they sit on no y value and do not change the y range."""
    x = np.asarray(x, float)
    if x.size == 0:
        return
    ax.plot(x, np.full(x.size, 0.03), linestyle="none", marker="v", ms=8, mfc="none", mec="0.45", mew=1.4,
            transform=ax.get_xaxis_transform(), clip_on=False, zorder=DIVERGED_Z, label=DIVERGED)


def not_shown(total: int, drawn: int, what: str, why: str) -> str:
    """The note a figure carries when it draws only ``drawn`` of ``total`` ``what`` (empty when
    it draws them all): e.g. "(3 of 9 points not shown: at most 6 panels)"."""
    return "" if drawn >= total else f" ({total - drawn} of {total} {what} not shown: {why})"


#: Above this many groups (combinations of the axes a figure tells apart by colour) a figure
#: draws a summary instead of a colour per group: every point as one grey cloud (no error bars)
#: and only the :data:`EXTREME_GROUPS` extreme groups in colour, its title saying how many
#: groups there are and which are drawn.
MAX_LINES = 12
#: How many groups a summary draws in colour: those of the lowest and the highest median.
EXTREME_GROUPS = 2


def extreme_groups(codes: np.ndarray, score: np.ndarray, k: int = EXTREME_GROUPS) -> list[int]:
    """The indices (into the groups numbered by ``codes``, :func:`group_codes`) of the ``k``
    groups whose median finite ``score`` is lowest and highest (half each, the lowest first;
    fewer when fewer groups have a finite score)."""
    finite = np.isfinite(score)
    if not finite.any():
        return []
    med = pd.Series(score[finite]).groupby(codes[finite]).median()
    order = med.sort_values(kind="stable").index.to_numpy()
    picked = list(order[: -(-k // 2)]) + list(order[::-1][: k // 2])
    return [int(g) for g in dict.fromkeys(picked)]


def summary_note(total: int, what: str, shown: list[str]) -> str:
    """The title line of a summary figure: "100 groups of S, μ: all points in grey (no error
    bars); in colour the extreme ones: …"."""
    return (f"{total} groups of {what}: every point in grey (no error bars); in colour the extreme ones: "
            + "; ".join(shown))


def weight_var_against_ratio(ds: xr.Dataset) -> plt.Figure | None:
    """weight_var (measured ± SE, exact theory) against λ/S, one colour per combination of S and
    the swept axes other than λ, and measured/theory below when there is a theory. None when λ/S
    takes a single value (the figures against the swept axes show those points). Above
    :data:`MAX_LINES` groups: every point as a grey cloud and the extreme groups
    (:func:`extreme_groups` of measured/theory, or of the measured value without a theory) in
    colour, the title saying how many groups there are."""
    if "weight_var" not in ds or not np.isfinite(ds["weight_var"].values).any():
        return None
    ratio = ds["lr"].values / ds["batch_size"].values
    if np.unique(ratio).size < 2:
        return None
    has_theory = "weight_var_theory" in ds and np.isfinite(ds["weight_var_theory"].values).any()
    fig, axes = (_two_panels(7) if has_theory else plt.subplots(figsize=(7, 5)))
    ax, axr = axes if has_theory else (axes, None)
    ok = _ok(ds)
    by = ["batch_size"] + [a for a in _swept(ds) if a not in ("lr", "batch_size")]
    codes, keys = group_codes(ds, by)
    parts = [(key, codes == j) for j, key in enumerate(keys)]
    note = ""
    if len(parts) > MAX_LINES:  # a summary: the cloud of every point, the extreme groups in colour
        wv = np.asarray(ds["weight_var"].values, float)
        score = wv / ds["weight_var_theory"].values if has_theory else wv
        chosen = extreme_groups(codes, np.where(ok, score, np.nan))
        ax.plot(ratio[ok], wv[ok], ".", color="0.65", ms=2, zorder=1, label=f"measured, all {len(parts)} groups")
        if has_theory:
            th_all = ds["weight_var_theory"].values
            axr.plot(ratio[ok], (wv / th_all)[ok], ".", color="0.65", ms=2, zorder=1)
        note = "\n" + summary_note(len(parts), ", ".join(SYMBOL.get(a, a) for a in by),
                                    [label_of(by, keys[g]) for g in chosen])
        parts = [parts[g] for g in chosen]
    for j, ((key, mask), c) in enumerate(zip(parts, plt.cm.viridis(np.linspace(0, 0.9, len(parts))))):
        sel = ok & mask
        order = np.argsort(ratio[sel])
        x, name = ratio[sel][order], legend_label(by, key)
        meas, se = ds["weight_var"].values[sel][order], ds["weight_var_se"].values[sel][order]
        ax.errorbar(x, meas, yerr=se, fmt="o", color=c, ms=5, capsize=3, label=f"{name} measured")
        if has_theory:  # one legend entry per kind of line; its colour is its group's
            th = ds["weight_var_theory"].values[sel][order]
            ax.plot(x, th, "--", color=c, lw=1.2, zorder=THEORY_Z, label="exact theory" if j == 0 else None)
            axr.errorbar(x, meas / th, yerr=se / th, fmt="o", color=c, ms=4, capsize=3)
        if "weight_var_theory_continuous" in ds:
            ax.plot(x, ds["weight_var_theory_continuous"].values[sel][order], ":", color=c, lw=1.2, zorder=THEORY_Z,
                    label="continuous time" if j == 0 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    mark_diverged(ax, ratio[~ok])
    ax.set_ylabel(r"weight variance Tr $M/N$")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(("Stationary weight variance: measured (±1 SE) vs exact theory (dashed)"
                  + ("; continuous-time (dotted)" if "weight_var_theory_continuous" in ds else "")
                  if has_theory else "Stationary weight variance, measured (±1 SE); no exact theory for this model")
                 + note, fontsize=10)
    (axr or ax).set_xlabel(r"$\lambda/S$")
    if has_theory:
        axr.axhline(1.0, color="k", lw=0.8, zorder=THEORY_Z)
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
        ax.plot(pred, ds["weight_var_theory"].values[ok], "k+", ms=7, zorder=THEORY_Z, label="exact theory")
    lim = [np.nanmin(pred) * 0.8, np.nanmax(pred) * 1.25]
    law = r"\,".join(([rf"\lambda^{{{a:.3f}}}"] if p.get("a") else []) + ([rf"S^{{{b:.3f}}}"] if p.get("b") else []))
    fixed = [name for name, q in ((r"$\lambda$", "a"), ("$S$", "b")) if not p.get(q)]
    ax.plot(lim, lim, "k--", lw=0.8, label=rf"fit: $A\,{law}$" + (f" ({', '.join(fixed)} fixed)" if fixed else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight variance")
    ax.legend(fontsize=8)
    group = legend_label(list(fit.get("group", {})), tuple(fit.get("group", {}).values()))
    ax.set_title("Power-law fit: measured against fitted" + (f" ({group})" if group else ""))
    axr.errorbar(pred, (y - pred) / se, fmt="o", ms=4)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel(r"fitted $A\,\lambda^a S^b$")
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
    label = r"$\mu$" if momentum else "$S$"
    keys = np.array([float(f"{v:.9g}") for v in x])
    classes, member = np.unique(keys, return_inverse=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_y = np.where(ok, np.log(y), np.nan)
    class_mean = np.exp(pd.Series(log_y).groupby(member).mean().reindex(range(classes.size)).to_numpy())[member]
    fig, (ax, axr) = _two_panels()
    values = np.unique(colour_by[ok])
    note = ""
    if len(values) > MAX_LINES:  # a summary: the cloud of every point, the extreme values in colour
        ax.plot(x[ok], y[ok], ".", color="0.65", ms=2, zorder=1, label=f"measured, all {len(values)} values")
        axr.plot(x[ok], (y / class_mean - 1)[ok], ".", color="0.65", ms=2, zorder=1)
        codes = np.searchsorted(values, colour_by)
        chosen = extreme_groups(codes, np.where(ok, y / class_mean, np.nan))
        note = "\n" + summary_note(len(values), label, [f"{label} = {values[g]:g}" for g in chosen])
        values = values[chosen]
    for v, c in zip(values, plt.cm.plasma(np.linspace(0, 0.85, len(values)))):
        sel = ok & (colour_by == v)
        order = np.argsort(x[sel])
        ax.errorbar(x[sel][order], y[sel][order], yerr=se[sel][order], fmt="o-", color=c, ms=4, lw=0.8,
                    capsize=2, label=f"{label} = {v:g}")
        if "weight_var_theory" in ds:  # above the measured lines, one legend entry for all
            ax.plot(x[sel][order], ds["weight_var_theory"].values[sel][order], "--", color=c, lw=1.4,
                    zorder=THEORY_Z, label="exact theory (dashed)" if v == values[0] else None)
        axr.errorbar(x[sel], y[sel] / class_mean[sel] - 1, yerr=se[sel] / class_mean[sel], fmt="o", color=c, ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight variance")
    ax.legend(fontsize=7, ncol=2)
    variable = COLLAPSE_VARIABLE.get(fit["variable"], fit["variable"])
    ax.set_title(f"Collapse in {variable}: measured (±1 SE), exact theory dashed; "
                 rf"spread $\sqrt{{\Delta^2}}$ = {fit['relative_spread']:.3g}" + note, fontsize=9)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel(variable)
    axr.set_ylabel("value / class mean − 1")
    return fig


#: The scaling variables of the collapse fits, in mathtext.
COLLAPSE_VARIABLE = {"lr/batch_size": r"$\lambda/S$", "lr/((1-momentum)*batch_size)": r"$\lambda/((1-\mu)S)$"}


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
            ax.plot(theory, y, "k+", ms=7, zorder=THEORY_Z, label="theory")
        leading = {q.get("leading_order") for q in qs} - {None}
        if len(leading) == 1:
            ax.axvline(leading.pop(), color="0.5", ls="--", lw=0.8, zorder=THEORY_Z, label="leading order")
        ax.set_xlabel(math_text({"spread2": "Δ²", "psi": "ψ"}.get(name, name)))
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
    """ln(λτ) against 1/λ: measured (±1 SE), the fitted line, the exact discrete chain's τ,
    Kramers and the power-law slope (theories above the measurements)."""
    if "params" not in fit:
        return None
    ok = _ok(ds) & np.isfinite(ds["escape_time"].values)
    lr, tau, se = ds["lr"].values[ok], ds["escape_time"].values[ok], ds["escape_time_se"].values[ok]
    x, y, ye = 1 / lr, np.log(lr * tau), se / tau
    order = np.argsort(x)
    grid = np.linspace(x.min() * 0.95, x.max() * 1.05, 50)
    fit_line = fit["params"]["intercept"]["estimate"] + fit["params"]["slope"]["estimate"] * grid
    fig, (ax, axr) = _two_panels()
    ax.errorbar(x, y, yerr=ye, fmt="o", ms=5, capsize=3, label="measured ±1 SE (censored MLE)")
    ax.plot(grid, fit_line, "k-", lw=1, label=f"fit: slope {fit['params']['slope']['estimate']:.4g}")
    for name, style, label in (("escape_time_theory_exact", "r--", "exact discrete chain"),
                               ("escape_time_theory_arrhenius", "b--", "Kramers (Arrhenius)")):
        if name in ds and np.isfinite(ds[name].values[ok]).all():
            ax.plot(x[order], np.log(lr * ds[name].values[ok])[order], style, lw=1.2, zorder=THEORY_Z, label=label)
    slope_pw = fit["params"]["slope"].get("theory_powerlaw")
    if slope_pw is not None:  # the power law predicts only the slope: anchor it at the data's centroid
        ax.plot(grid, y.mean() + slope_pw * (grid - x.mean()), "g:", lw=1.2, zorder=THEORY_Z,
                label="power law (slope only)")
    ax.set_ylabel(r"$\ln(\lambda\tau)$, $\tau$ in steps")
    ax.legend(fontsize=8)
    ax.set_title("Escape time against inverse learning rate")
    pred = fit["params"]["intercept"]["estimate"] + fit["params"]["slope"]["estimate"] * x
    axr.errorbar(x, (y - pred) / ye, fmt="o", ms=4)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel(r"$1/\lambda$")
    axr.set_ylabel("residual / SE")
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
    axes = [a for a in dict.fromkeys(["lr", "batch_size", *_swept(ds)]) if a in ds.coords]
    full = int(np.prod([distinct(ds, a) for a in axes], dtype=float))
    return len(group_codes(ds, axes)[1]) < full


#: The coverage map draws at most this many panels (the title says how many more there are).
MAX_COVERAGE_PANELS = 12


def _coverage_axes(ds: xr.Dataset) -> list[str]:
    """The axes that take more than one value, λ and S first, then the other swept ones."""
    axes = list(dict.fromkeys(["lr", "batch_size", *_swept(ds)]))
    return [a for a in axes if a in ds.coords and distinct(ds, a) > 1]


def coverage(ds: xr.Dataset) -> plt.Figure:
    """Grid coverage: the status of every point in a map of the first two axes that vary (λ and
    S first; one row when only one varies), one panel per combination of the others, every
    panel drawn up to :data:`MAX_COVERAGE_PANELS` (the title says how many are not). The
    legend counts every point's status."""
    varying = _coverage_axes(ds)
    x_axis, y_axis, others = (varying + [None, None])[0], (varying + [None, None])[1], varying[2:]
    status = point_status(ds)
    n = ds.sizes["point"]
    codes, every = group_codes(ds, others)
    panels = every[:MAX_COVERAGE_PANELS]
    xs = np.unique(ds[x_axis].values) if x_axis else np.array([""])
    ys = np.unique(ds[y_axis].values) if y_axis else np.array([""])
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(max(3.2, 1.3 + 0.45 * xs.size) * cols,
                                                                 (1.6 + 0.35 * ys.size) * rows + 0.6))
    cmap = ListedColormap(["#4c9a2a", "#e0a800", "#b22222"])
    col_of = np.searchsorted(xs, ds[x_axis].values) if x_axis else np.zeros(n, int)
    row_of = np.searchsorted(ys, ds[y_axis].values) if y_axis else np.zeros(n, int)
    for j, (ax, key) in enumerate(zip(axes.ravel(), panels)):
        grid = np.full((ys.size, xs.size), np.nan)
        sel = codes == j
        grid[row_of[sel], col_of[sel]] = status[sel]
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=2, origin="lower", aspect="auto")
        ax.set_xticks(range(xs.size), [_value(v) for v in xs.tolist()], rotation=60 if xs.size > 6 else 0, fontsize=7)
        ax.set_yticks(range(ys.size), [_value(v) for v in ys.tolist()], fontsize=7)
        if x_axis:
            ax.set_xlabel(MATH_SYMBOL.get(x_axis, x_axis), fontsize=8)
        if y_axis:
            ax.set_ylabel(MATH_SYMBOL.get(y_axis, y_axis), fontsize=8)
        ax.set_title(legend_label(others, key) or "all points", fontsize=8)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(3)]
    fig.suptitle("Coverage of the grid (blank: not in the sweep)"
                 + not_shown(len(every), len(panels), "panels", f"at most {MAX_COVERAGE_PANELS}; the legend counts "
                             "every point"), fontsize=9)
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


#: Line style, marker on a categorical axis, and legend text of each theory column's suffix.
THEORY_STYLES = {"": ("k--", "_", "exact theory"), "_continuous": ("b:", "x", "continuous time"),
                 "_detailed_balance": ("g-.", "+", "detailed balance")}


def _theories(ds: xr.Dataset, name: str) -> list[tuple[str, str]]:
    """(variable, line style) of every theory of ``name`` present with a finite value."""
    out = []
    for suffix, (style, _, _) in THEORY_STYLES.items():
        var = f"{name}_theory{suffix}"
        if var in ds and np.isfinite(np.asarray(ds[var].values, float)).any():
            out.append((var, style))
    return out


def theory_label(name: str, var: str) -> str:
    """The legend text of the theory column ``var`` of ``name`` (e.g. "continuous time")."""
    return THEORY_STYLES.get(var[len(f"{name}_theory"):], ("", "", var))[2]


def _theory_marker(name: str, var: str) -> str:
    return THEORY_STYLES.get(var[len(f"{name}_theory"):], ("", "_", ""))[1]


def _x_axis(ax, ds: xr.Dataset, axis: str, x: np.ndarray, log_ratio: float) -> None:
    """Label the x axis of ``ax`` with ``axis`` (:func:`axis_label`); log scale when the values
    span more than ``log_ratio``; an integer axis gets ticks at its values, a categorical one
    (``x`` the index of each category) its categories' names."""
    ax.set_xlabel(axis_label(ds[axis].attrs, axis, ds[axis].dtype.kind))
    if ds[axis].dtype.kind not in "fiu":
        categories = _categories(ds, axis)  # one word a line, so that neighbours' names do not collide
        ax.set_xticks(range(len(categories)), [c.replace("_", "\n") for c in categories], fontsize=8)
        ax.set_xlim(-0.6, len(categories) - 0.4)
        return
    if np.all(x > 0) and x.max() / x.min() > log_ratio:
        ax.set_xscale("log")
    if ds[axis].dtype.kind in "iu":
        integer_ticks(ax, x)


def _categories(ds: xr.Dataset, axis: str) -> list[str]:
    """The values of a categorical (string) axis in their order in the sweep."""
    return [str(v) for v in dict.fromkeys(ds[axis].values.tolist())]


def axis_positions(ds: xr.Dataset, axis: str) -> np.ndarray:
    """Per point, where it sits along ``axis``: its value (numeric axis) or the index of its
    category (string axis, in the sweep's order)."""
    if ds[axis].dtype.kind in "fiu":
        return np.asarray(ds[axis].values, float)
    categories = _categories(ds, axis)
    return pd.Categorical([str(v) for v in ds[axis].values.tolist()], categories=categories).codes.astype(float)


def _dodge(x: np.ndarray, j: int, n: int) -> np.ndarray:
    """``x`` shifted a little for the ``j``-th of ``n`` groups drawn at the same values, so their
    markers stay apart (by a fraction of the smallest gap between distinct values)."""
    distinct = np.unique(x[np.isfinite(x)])
    if n < 2 or distinct.size < 2:
        return x
    gap = np.diff(distinct).min()
    return x + 0.25 * gap * (j - (n - 1) / 2) / (n - 1)


#: Figures against an axis draw at most this many groups of the other axes (one colour each);
#: beyond, the title says how many are not shown.
MAX_GROUPS = 8


def against_axis(ds: xr.Dataset, axis: str, max_groups: int = MAX_GROUPS,
                 names: tuple[str, ...] = ("weight_var", "loss")) -> plt.Figure | None:
    """The observables ``names`` (measured ± SE) with every theory of them against one swept
    axis (numeric, or categorical: one position per category), one colour per combination of
    the other swept axes (named in the legend; at most ``max_groups``, the title says how many
    more there are); measured/exact theory below for the observables that have an exact theory
    (no lower panel for those without); diverged points as :func:`mark_diverged`."""
    names = [n for n in names if n in ds and f"{n}_se" in ds and np.isfinite(np.asarray(ds[n].values, float)).any()]
    if not names or axis not in ds.coords:
        return None
    categorical = ds[axis].dtype.kind not in "fiu"
    others = [a for a in _swept(ds) if a != axis]
    every = split_by(ds, others)
    groups_ = every[:max_groups]
    x_all = axis_positions(ds, axis)
    ok = _ok(ds)
    exact = {n: f"{n}_theory" in ds and np.isfinite(np.asarray(ds[f"{n}_theory"].values, float)).any()
             for n in names}
    rows = 2 if any(exact.values()) else 1
    fig, axes = plt.subplots(rows, len(names), figsize=(6 * len(names) + 1, 6.5 if rows == 2 else 4.8),
                             squeeze=False, gridspec_kw={"height_ratios": [3, 1.3][:rows]}, layout="constrained")
    colours = plt.cm.viridis(np.linspace(0, 0.85, len(groups_)))
    for col, name in enumerate(names):
        ax = axes[0][col]
        axr = axes[1][col] if rows == 2 and exact[name] else None
        if rows == 2 and not exact[name]:
            fig.delaxes(axes[1][col])
        for j, ((key, sel), c) in enumerate(zip(groups_, colours)):
            order = np.argsort(x_all[sel], kind="stable")
            x = (_dodge(x_all[sel][order], j, len(groups_)) if categorical or ds[axis].dtype.kind in "iu"
                 else x_all[sel][order])
            good = ok[sel][order]
            y, se = ds[name].values[sel][order], ds[f"{name}_se"].values[sel][order]
            ax.errorbar(x[good], y[good], yerr=se[good], fmt="o", color=c, ms=4, capsize=2,
                        label=("measured " + legend_label(others, key)).strip())
            mark_diverged(ax, x[~good])
            for var, style in _theories(ds, name):  # on a categorical axis: a marker per category
                th = ds[var].values[sel][order]
                ax.plot(x, th, linestyle="none" if categorical else style[1:],
                        marker=_theory_marker(name, var) if categorical else None, ms=10, mew=1.4, color=c, lw=1.2,
                        zorder=THEORY_Z, label=theory_label(name, var) if j == 0 else None)
            if axr is not None:
                th = ds[f"{name}_theory"].values[sel][order]
                axr.errorbar(x[good], (y / th)[good], yerr=(se / th)[good], fmt="o", color=c, ms=4)
        measured = np.asarray(ds[name].values, float)[ok]
        if measured.size and np.nanmin(measured) > 0 and np.nanmax(measured) / np.nanmin(measured) > 10:
            ax.set_yscale("log")
        ax.set_ylabel(axis_label(ds[name].attrs, name))
        ax.legend(fontsize=7)
        if axr is not None:
            axr.sharex(ax)
            ax.tick_params(labelbottom=False)
            axr.axhline(1.0, color="k", lw=0.8, zorder=THEORY_Z)
            axr.set_ylabel("measured / exact theory")
        _x_axis(axr if axr is not None else ax, ds, axis, x_all, 20)
    what = " and ".join(math_text(str(ds[n].attrs.get("long_name", n))) for n in names)
    fig.suptitle(f"{what[:1].upper() + what[1:]}: measured (±1 SE){' and theory' if any(exact.values()) else ''} "
                 f"against {MATH_SYMBOL.get(axis, axis)}"
                 + not_shown(len(every), len(groups_), "groups", f"at most {max_groups} colours"), fontsize=10)
    return fig
