"""The self-contained HTML report: figures embedded as base64 PNG, tables, provenance.

Sections: summary (status of every point, agreement with theory, one verdict per fit), the
coverage map of the grid, one section per fit (table of estimate ± interval, theory, leading
order, inside or not; figure with a residual panel), measured vs theory and spectra, the table
of points, theory formulas, run time per shard, provenance. With ``figures_dir`` every figure
is also written there as ``<name>.png`` (the workflow marks them for ``snakemake --report``).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import figures

_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
          "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
          "td,th{border:1px solid #bbb;padding:3px 7px;text-align:right}th{background:#eee}"
          ".good{color:#176317}.bad{color:#a31515}img{max-width:100%}")
_NAMES = {"power_law": "Power law weight_var = A·λ^a·S^b", "linear_scaling": "Linear scaling rule: collapse in λ/S",
          "momentum_scaling": "Momentum scaling: collapse in λ/((1−μ)S)",
          "escape": "Escape time: ln(λτ) against 1/λ", "wigner": "Random-matrix statistics of a degenerate pair",
          "wigner_width": "Pair width σ² = A·λ^a·S^b", "flatness": "Inverse variance–flatness exponent ψ"}


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


class _Figures:
    """Collects figures: embeds each as a data URI and, with a directory, writes it as PNG."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.names: list[str] = []
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def img(self, name: str, fig, alt: str) -> str:
        if fig is None:
            return ""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        figures.plt.close(fig)
        data = buf.getvalue()
        if self.directory is not None:
            (self.directory / f"{name}.png").write_bytes(data)
        self.names.append(name)
        uri = "data:image/png;base64," + base64.b64encode(data).decode()
        return f'<figure id="fig-{html.escape(name)}"><img alt="{html.escape(alt)}" src="{uri}"></figure>'


def _where(group: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in group.items()) or "all points"


def _param_rows(res: dict[str, Any], names: tuple[str, ...]) -> list[list[Any]]:
    rows = []
    for name in names:
        q = (res.get("params") or {}).get(name)
        if q is None:
            rows.append([_where(res["group"]), name, "not identifiable (single value)", None, None, None, None, None])
            continue
        lo, hi = q["interval"]
        est = f"{_fmt(q['estimate'])} [{_fmt(lo)}, {_fmt(hi)}]"
        rows.append([_where(res["group"]), name, est, q["stderr"], q["interval_method"], q["theory"],
                     q.get("leading_order"), q["theory_inside"]])
    return rows


_PARAM_HEADER = ["group", "parameter", "estimate [interval]", "std. error", "interval from",
                 "theory (same fit of the theory values)", "leading order", "theory inside interval"]


def _verdict(results: list[dict[str, Any]]) -> tuple[int, int]:
    """(parameters with a theory value, of which inside their interval)."""
    n = inside = 0
    for res in results:
        for q in (res.get("params") or {}).values():
            if q and q.get("theory_inside") is not None:
                n += 1
                inside += bool(q["theory_inside"])
    return n, inside


def _verdict_html(results: list[dict[str, Any]]) -> str:
    n, inside = _verdict(results)
    if n == 0:
        return "<p>No theory value to compare with.</p>"
    if inside == n:
        return f"<p><b class='good'>All {n} theory values lie inside their intervals.</b></p>"
    return f"<p><b class='bad'>{n - inside} of {n} theory values lie OUTSIDE their intervals.</b></p>"


def _subset(ds: xr.Dataset, group: dict[str, Any]) -> xr.Dataset:
    mask = np.ones(ds.sizes["point"], bool)
    for k, v in group.items():
        mask &= ds[k].values == v
    return ds.isel(point=np.flatnonzero(mask))


def _fit_sections(ds: xr.Dataset, fits: dict[str, Any], figs: _Figures) -> list[str]:
    parts: list[str] = []
    conf = fits.get("settings", {}).get("confidence", 0.95)
    for i, res in enumerate(fits.get("power_law", [])):
        parts.append(f"<h3>{_NAMES['power_law']} at {html.escape(_where(res['group']))}</h3>")
        if res.get("error"):
            parts.append(f"<p class='bad'>{html.escape(res['error'])}</p>")
            continue
        parts.append(_table(_PARAM_HEADER, _param_rows(res, ("a", "b", "log_A")), "fit"))
        parts.append(f"<p>{res['n_points']} points, χ²/dof = {_fmt(res['chi2_reduced'])} "
                     f"(p = {_fmt(res.get('chi2_pvalue'))}). The leading-order law (a = 1, b = −1) ignores the "
                     "discreteness and multiplicative-noise corrections that the exact theory includes.</p>")
        parts.append(_verdict_html([res]))
        parts.append(figs.img(f"power_law_{i}", figures.power_law(_subset(ds, res["group"]), res), "power-law fit"))
    for kind in ("linear_scaling", "momentum_scaling"):
        for i, res in enumerate(fits.get(kind, [])):
            parts.append(f"<h3>{_NAMES[kind]} at {html.escape(_where(res['group']))}</h3>")
            if res.get("error"):
                parts.append(f"<p>{html.escape(res['error'])}</p>")
                continue
            parts.append(_table(_PARAM_HEADER, _param_rows(res, ("spread2",)), "fit"))
            parts.append(f"<p>Δ² is the noise-corrected variance of ln(weight_var) among points with equal "
                         f"{html.escape(res['variable'])} ({res['n_classes']} classes, {res['n_points']} points); "
                         f"√Δ² = {_fmt(res['relative_spread'])} measured, {_fmt(res['relative_spread_theory'])} "
                         f"exact theory, 0 at leading order; measurement noise alone: "
                         f"{_fmt(res['noise_floor'])} per point.</p>")
            parts.append(_verdict_html([res]))
            parts.append(figs.img(f"{kind}_{i}", figures.collapse(_subset(ds, res["group"]), res), _NAMES[kind]))
    for i, res in enumerate(fits.get("escape", [])):
        parts.append(f"<h3>{_NAMES['escape']} at {html.escape(_where(res['group']))}</h3>")
        if res.get("error"):
            parts.append(f"<p>{html.escape(res['error'])}</p>")
            continue
        rows = _param_rows(res, ("slope", "intercept"))
        slope = res["params"]["slope"]
        rows.append([_where(res["group"]), "slope vs power law", rows[0][2], slope["stderr"],
                     slope["interval_method"], slope.get("theory_powerlaw"), None,
                     slope.get("theory_powerlaw_inside")])
        parts.append(_table(_PARAM_HEADER[:5] + ["theory", "leading order", "theory inside interval"], rows, "fit"))
        laws = res["supported_laws"]
        parts.append(f"<p>{res['n_points']} points ({res['excluded_points']} without escapes excluded). "
                     + ("<b class='good'>Supported: " + ", ".join(laws) + ".</b>" if laws
                        else "<b class='bad'>Neither escape law's slope lies inside the interval.</b>") + "</p>")
        parts.append(figs.img(f"escape_{i}", figures.escape(_subset(ds, res["group"]), res), "escape fit"))
    if fits.get("wigner"):
        rows = []
        for res in fits["wigner"]:
            if "params" not in res:
                rows.append([_where(res["group"]), res.get("error"), None, None, None, None, None])
                continue
            b, s = res["params"]["binder"], res["params"]["sigma"]
            rows.append([_where(res["group"]), f"{_fmt(b['estimate'])} [{_fmt(b['interval'][0])}, "
                         f"{_fmt(b['interval'][1])}]", b["theory_inside"], s["estimate"], res["ks_statistic"],
                         res["ks_pvalue"], res["wigner_consistent"]])
        parts.append(f"<h3>{_NAMES['wigner']}</h3>")
        parts.append(_table(["point", f"Binder cumulant [{conf:.0%}]", "−4/27 inside", "σ [weight²]",
                             "KS statistic vs Wigner surmise", "KS p-value (approximate)",
                             "consistent with the surmise"], rows, "fit"))
        parts.append(_verdict_html(fits["wigner"]))
        parts.append(figs.img("wigner", figures.wigner(ds, fits["wigner"]), "pair statistics"))
        parts.append(figs.img("wigner_width", figures.wigner_width(ds, fits["wigner"]), "pair width against √(λ/S)"))
        for res in fits.get("wigner_width", []):
            if "params" in res:
                parts.append(f"<h4>{_NAMES['wigner_width']} at {html.escape(_where(res['group']))}</h4>")
                parts.append(_table(_PARAM_HEADER, _param_rows(res, ("a", "b", "log_A")), "fit"))
    if fits.get("flatness"):
        parts.append(f"<h3>{_NAMES['flatness']}</h3>")
        rows = [r for res in fits["flatness"] for r in (_param_rows(res, ("psi",)) if "params" in res else [
            [_where(res["group"]), "psi", res.get("error"), None, None, None, None, None]])]
        parts.append(_table(_PARAM_HEADER, rows, "fit"))
        parts.append(_verdict_html(fits["flatness"]))
        parts.append(figs.img("flatness", figures.flatness(ds, fits["flatness"]), "variance against curvature"))
    if fits.get("skipped"):
        parts.append("<h3>Fits not run</h3><ul>" + "".join(
            f"<li>{html.escape(_NAMES.get(k, k))}: {html.escape(v)}</li>" for k, v in fits["skipped"].items())
                     + "</ul>")
    return parts


def _summary(ds: xr.Dataset, fits: dict[str, Any]) -> str:
    status = figures.point_status(ds)
    ok = status < 2
    text = (f"<p>Sweep <b>{html.escape(ds.attrs.get('sweep', ''))}</b>: {ds.sizes['point']} points — "
            f"{int((status == 0).sum())} done, {int((status == 1).sum())} with some diverged replicas (excluded from "
            f"averages), {int((status == 2).sum())} fully diverged (excluded from fits). ")
    if "weight_var_theory" in ds and ok.any() and np.isfinite(ds["weight_var_theory"].values[ok]).any():
        z = (ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]
        text += (f"Measured weight variance agrees with the exact theory within {np.nanmax(np.abs(z.values[ok])):.2f} "
                 "standard errors at every point with a theory value (max |measured − theory| / SE).")
    elif "weight_var_theory" in ds:
        why = ds["weight_var_theory"].attrs.get("missing_because", "no theory for this model")
        text += f"No exact weight-variance theory for these points ({html.escape(why)})."
    text += "</p>"
    lines = []
    for kind, name in _NAMES.items():
        results = fits.get(kind) or []
        n, inside = _verdict(results)
        if n:
            cls = "good" if inside == n else "bad"
            lines.append(f"<li>{html.escape(name)}: <b class='{cls}'>{inside} of {n} theory values inside "
                         "their intervals</b></li>")
    return text + ("<ul>" + "".join(lines) + "</ul>" if lines else "")


def _points_table(ds: xr.Dataset) -> str:
    axes = json.loads(ds.attrs.get("swept_axes", "[]")) or ["lr", "batch_size"]
    cols = [c for c in ("weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_theory", "diverged_replicas",
                        "burn_in") if c in ds]
    z = ((ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]).values if {
        "weight_var", "weight_var_theory", "weight_var_se"} <= set(ds.data_vars) else None
    rows = []
    for i in range(ds.sizes["point"]):
        rows.append([ds["point"].values[i]] + [_scalar(ds[a].values[i]) for a in axes]
                    + [_scalar(ds[c].values[i]) for c in cols] + ([z[i]] if z is not None else []))
    header = ["point"] + axes + [f"{c} [{ds[c].attrs.get('units', '')}]" for c in cols]
    return _table(header + (["(meas−theory)/SE"] if z is not None else []), rows, "points")


def build_report(ds: xr.Dataset, fits: dict[str, Any], report_spec: dict[str, Any],
                 figures_dir: str | Path | None = None) -> str:
    """The report as one HTML string (no external resources); figures also go to ``figures_dir``."""
    figs = _Figures(Path(figures_dir) if figures_dir is not None else None)
    title = report_spec["report"]["title"]
    parts = [f"<h1>{html.escape(title)}</h1>", _summary(ds, fits)]
    parts.append("<h2>Coverage of the grid</h2>")
    parts.append(figs.img("coverage", figures.coverage(ds), "coverage map"))
    parts.append("<h2>Fits</h2>")
    parts.extend(_fit_sections(ds, fits, figs))
    parts.append("<h2>Measured vs theory</h2>")
    parts.append(figs.img("weight_var", figures.weight_var_against_ratio(ds), "weight variance against lr/batch_size"))
    parts.append(figs.img("spectra", figures.spectra(ds), "covariance spectra"))
    parts.append(figs.img("fdr_fourier", figures.fdr_fourier(ds), "Fourier profiles of the FDR"))
    swept = json.loads(ds.attrs.get("swept_axes", "[]"))
    for axis in swept:
        parts.append(figs.img(f"against_{axis}", figures.against_axis(ds, axis), f"observables against {axis}"))
        if axis not in ("lr", "batch_size"):
            for name in ("weight_cov_eigenvalues", "q_eigenvalues"):
                parts.append(figs.img(f"{name}_against_{axis}", figures.spectrum_against_axis(ds, axis, name),
                                      f"{name} against {axis}"))
    parts.append("<h2>Points</h2>")
    parts.append(_points_table(ds))
    shown = {"weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_theory", "diverged", "burn_in",
             "simulation_seconds", "diverged_replicas"}
    others = [v for v in ds.data_vars if ds[v].dims == ("point",) and v not in shown]
    if others:
        parts.append("<h2>Other observables</h2><p>Per point, as stored in <code>ensemble.zarr</code> "
                     "(units in each variable's attributes).</p>")
        header = ["point"] + [f"{v} [{ds[v].attrs.get('units', '')}]" for v in others]
        parts.append(_table(header, [[ds["point"].values[i]] + [_scalar(ds[v].values[i]) for v in others]
                                     for i in range(ds.sizes["point"])], "points"))
    theory_rows = [[v, ds[v].attrs.get("formula", ""), ds[v].attrs.get("missing_because", "")]
                   for v in ds.data_vars if "_theory" in v]
    if theory_rows:
        parts.append("<h2>Theory columns</h2>")
        parts.append(_table(["variable", "formula and approximation", "missing because"], theory_rows, "theory"))
    per_shard = ds["simulation_seconds"].groupby(ds["shard"]).sum()
    parts.append("<h2>Run time per shard</h2>")
    parts.append(_table(["shard", "points", "simulation time [s]"],
                        [[s, int((ds["shard"].values == s).sum()), float(v)]
                         for s, v in zip(per_shard["shard"].values, per_shard.values)]))
    parts.append(figs.img("shard_times", figures.shard_times(ds), "run time per shard"))
    prov = {k: ds.attrs.get(k) for k in ("sweep_hash", "code_version", "host", "created_utc", "python")}
    prov["config_hash"] = report_spec["config_hash"]
    prov.update({f"fit {k}": v for k, v in fits.get("settings", {}).items()})
    versions = json.loads(ds.attrs.get("package_versions", "{}"))
    parts.append("<h2>Provenance</h2>")
    parts.append(_table(["key", "value"], [[k, v] for k, v in prov.items()]
                        + [[f"version of {k}", v] for k, v in versions.items()]))
    parts.append("<details><summary>Resolved configuration</summary><pre>"
                 + html.escape(json.dumps(report_spec["config"], indent=2, sort_keys=True)) + "</pre></details>")
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(p for p in parts if p) + "</body></html>\n")
