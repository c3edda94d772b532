"""The self-contained HTML report: figures embedded as base64 PNG, tables, provenance.

Sections: summary (points, diverged, agreement with theory), power-law fit table (estimate ±
interval, exact theory for this grid, leading order, inside or not), measured vs theory against
λ/S with error bars and a residual panel, the table of points, run time per shard, provenance.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import numpy as np
import xarray as xr

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (float, np.floating)):
        return "—" if not np.isfinite(x) else f"{x:.{digits}g}"
    return html.escape(str(x))


def _scalar(value: Any) -> Any:
    """A numpy scalar as a Python value (strings stay strings)."""
    return value.item() if hasattr(value, "item") else value


def _table(header: list[str], rows: list[list[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def figure_weight_var(ds: xr.Dataset) -> str:
    """weight_var (measured ± SE, exact theory) and measured/theory against λ/S."""
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    ratio = ds["lr"].values / ds["batch_size"].values
    ok = ~ds["diverged"].values.astype(bool)
    sizes = np.unique(ds["batch_size"].values)
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(sizes)))
    for s, c in zip(sizes, colors):
        sel = ok & (ds["batch_size"].values == s)
        order = np.argsort(ratio[sel])
        x = ratio[sel][order]
        meas, se = ds["weight_var"].values[sel][order], ds["weight_var_se"].values[sel][order]
        th = ds["weight_var_theory"].values[sel][order]
        ax.errorbar(x, meas, yerr=se, fmt="o", color=c, ms=5, capsize=3, label=f"S = {s} measured")
        ax.plot(x, th, "--", color=c, lw=1, label=f"S = {s} exact theory")
        axr.errorbar(x, meas / th, yerr=se / th, fmt="o", color=c, ms=4, capsize=3)
    if (~ok).any():
        ax.plot(ratio[~ok], np.full((~ok).sum(), np.nanmin(ds["weight_var"].values[ok]) if ok.any() else 1),
                "rx", label="diverged")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("weight variance Tr M / N  [weight²]")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Stationary weight variance: measured (±1 SE) vs exact discrete-time theory")
    axr.axhline(1.0, color="k", lw=0.8)
    axr.set_xlabel("λ / S  [learning rate / batch size]")
    axr.set_ylabel("measured / theory")
    return _png(fig)


def figure_fit(ds: xr.Dataset, fit: dict[str, Any]) -> str | None:
    """Collapse: weight_var / (lr^a · batch_size^b) with the fitted exponents, against λ/S."""
    p = fit.get("params", {})
    if not p or p.get("log_A") is None:
        return None
    a = p["a"]["estimate"] if p.get("a") else 0.0
    b = p["b"]["estimate"] if p.get("b") else 0.0
    ok = ~ds["diverged"].values.astype(bool)
    lr, s = ds["lr"].values[ok], ds["batch_size"].values[ok]
    y, se = ds["weight_var"].values[ok], ds["weight_var_se"].values[ok]
    pred = np.exp(p["log_A"]["estimate"]) * lr**a * s**b
    fig, (ax, axr) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    ax.errorbar(pred, y, yerr=se, fmt="o", ms=4, capsize=2)
    lim = [np.nanmin(pred) * 0.8, np.nanmax(pred) * 1.25]
    ax.plot(lim, lim, "k--", lw=0.8, label=f"fit: A·λ^{a:.3f}·S^{b:.3f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("measured weight_var [weight²]")
    ax.legend()
    ax.set_title("Power-law fit: measured against fitted")
    axr.errorbar(pred, (y - pred) / se, fmt="o", ms=4)
    axr.axhline(0, color="k", lw=0.8)
    axr.set_xlabel("fitted A·λ^a·S^b [weight²]")
    axr.set_ylabel("residual / SE")
    return _png(fig)


def build_report(ds: xr.Dataset, fits: dict[str, Any], report_spec: dict[str, Any]) -> str:
    """The report as one HTML string (no external resources)."""
    title = report_spec["report"]["title"]
    ok = ~ds["diverged"].values.astype(bool)
    z = (ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]
    has_theory = bool(np.isfinite(ds["weight_var_theory"].values[ok]).any()) if ok.any() else False
    parts = [f"<h1>{html.escape(title)}</h1>"]
    summary = (f"<p>Sweep <b>{html.escape(ds.attrs['sweep'])}</b>: {ds.sizes['point']} points, "
               f"{int((~ok).sum())} diverged (excluded from fits). ")
    if has_theory:
        zmax = float(np.nanmax(np.abs(z.values[ok])))
        summary += (f"Measured weight variance agrees with the exact discrete-time theory within {zmax:.2f} "
                    "standard errors at every non-diverged point with a theory value (max |measured − theory| / SE).")
    else:
        why = ds["weight_var_theory"].attrs.get("missing_because", "no theory for this model")
        summary += f"No exact weight-variance theory for these points ({html.escape(why)})."
    parts.append(summary + "</p>")

    for pl in fits.get("power_law", []):
        where = ", ".join(f"{k} = {v}" for k, v in pl["group"].items())
        parts.append("<h2>Power-law fit: weight_var = A · λ<sup>a</sup> · S<sup>b</sup>"
                     + (f" at {html.escape(where)}" if where else "") + "</h2>")
        if pl.get("error"):
            parts.append(f"<p class='bad'>{html.escape(pl['error'])}</p>")
        else:
            rows = []
            for name in ("a", "b", "log_A"):
                q = pl["params"].get(name)
                if q is None:
                    rows.append([name, "not identifiable (single value)", None, None, None, None])
                    continue
                lo, hi = q["interval"]
                rows.append([name, f"{q['estimate']:.4f} [{lo:.4f}, {hi:.4f}]", q["stderr"], q["theory"],
                             q["leading_order"], q["theory_inside"]])
            parts.append(_table(["parameter", f"estimate [{pl['confidence']:.0%} interval]", "std. error",
                                 "exact theory (same fit of the theory values)", "leading order",
                                 "theory inside interval"], rows, "fit"))
            verdict = all(q["theory_inside"] for q in pl["params"].values() if q and q["theory_inside"] is not None)
            parts.append(f"<p>{pl['n_points']} points, χ²/dof = {_fmt(pl['chi2_reduced'])}. "
                         + ("<b class='good'>The exact-theory exponents lie inside the intervals.</b>" if verdict
                            else "<b class='bad'>The exact-theory value lies OUTSIDE an interval.</b>")
                         + " The leading-order law (a = 1, b = −1) ignores the discreteness and "
                         "multiplicative-noise corrections that the exact theory includes.</p>")
            mask = np.ones(ds.sizes["point"], bool)
            for k, v in pl["group"].items():
                mask &= ds[k].values == v
            fig = figure_fit(ds.isel(point=np.flatnonzero(mask)), pl)
            if fig:
                parts.append(f'<img alt="power-law fit" src="{fig}">')

    parts.append("<h2>Measured vs exact theory</h2>")
    parts.append(f'<img alt="weight variance against lr/batch_size" src="{figure_weight_var(ds)}">')

    axes = json.loads(ds.attrs.get("swept_axes", "[]")) or ["lr", "batch_size"]
    rows = []
    for i in range(ds.sizes["point"]):
        rows.append([ds["point"].values[i]] + [_scalar(ds[a].values[i]) for a in axes] + [
            ds["weight_var"].values[i], ds["weight_var_se"].values[i], ds["weight_var_theory"].values[i],
            z.values[i], ds["loss"].values[i], ds["loss_theory"].values[i], bool(ds["diverged"].values[i]),
            int(ds["burn_in"].values[i])])
    parts.append("<h2>Points</h2>")
    parts.append(_table(["point"] + axes + ["weight_var", "SE", "theory", "(meas−theory)/SE", "loss",
                                            "loss theory", "diverged", "burn-in [steps]"], rows, "points"))

    shown = {"weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_theory", "diverged", "burn_in",
             "simulation_seconds"}
    others = [v for v in ds.data_vars if ds[v].dims == ("point",) and v not in shown]
    if others:
        parts.append("<h2>Other observables</h2><p>Per point, as stored in <code>ensemble.zarr</code> "
                     "(units in each variable's attributes).</p>")
        header = ["point"] + [f"{v} [{ds[v].attrs.get('units', '')}]" for v in others]
        parts.append(_table(header, [[ds["point"].values[i]] + [_scalar(ds[v].values[i]) for v in others]
                                     for i in range(ds.sizes["point"])], "points"))

    per_shard = ds["simulation_seconds"].groupby(ds["shard"]).sum()
    parts.append("<h2>Run time per shard</h2>")
    parts.append(_table(["shard", "simulation time [s]"],
                        [[s, float(v)] for s, v in zip(per_shard["shard"].values, per_shard.values)]))

    prov = {k: ds.attrs.get(k) for k in ("sweep_hash", "code_version", "host", "created_utc", "python")}
    prov["config_hash"] = report_spec["config_hash"]
    versions = json.loads(ds.attrs.get("package_versions", "{}"))
    parts.append("<h2>Provenance</h2>")
    parts.append(_table(["key", "value"], [[k, v] for k, v in prov.items()]
                        + [[f"version of {k}", v] for k, v in versions.items()]))
    parts.append("<details><summary>Resolved configuration</summary><pre>"
                 + html.escape(json.dumps(report_spec["config"], indent=2, sort_keys=True)) + "</pre></details>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
             "td,th{border:1px solid #bbb;padding:3px 7px;text-align:right}th{background:#eee}"
             ".good{color:#176317}.bad{color:#a31515}img{max-width:100%}")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
