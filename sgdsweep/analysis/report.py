"""The self-contained HTML report: figures embedded as base64 PNG, tables, provenance.

The page leads with the sweep's question (``report.lead``, :mod:`sgdsweep.sweep.lead`): a
headline with the measured value, the theory value and their agreement, above the figure that
answers it (:mod:`sgdsweep.analysis.headline`); then one line on the points (done, diverged,
agreement with the exact theory), every fit's verdict in words with its headline numbers
(estimate [interval], exact theory, leading order, goodness of fit:
:mod:`sgdsweep.analysis.fit.verdict`), and for a sweep run in rounds (``precision:`` or
``search:``) one line on what they spent and reached. Then: the coverage map of the grid (only
when the grid has gaps or diverged points), the rounds' section (:mod:`sgdsweep.analysis.rounds`: per point spend and
targets, or the stability edge against the exact theory), one section per fit (table of estimate
± interval, theory, leading order, inside or not; figure with a residual panel), measured vs
theory (the weight variance against λ/S unless it leads) and spectra, the table of points,
theory formulas, run time per shard, provenance. With ``figures_dir`` every figure is also
written there as ``<name>.png`` (:data:`~sgdsweep.analysis.plotting.DPI`) and ``<name>.svg`` (the
workflow marks the PNGs for ``snakemake --report``). Nothing is wider than the window: wide
tables and the configuration scroll inside their own box.

A fit with more groups than :data:`MAX_GROUP_FIGURES` keeps every group's table, but only that
many groups get a figure of their own; one overview figure shows every group's estimates, and the
report says which groups are drawn. Figures are drawn after the page is assembled, in ``jobs``
processes when asked (:func:`figure_pool`; the page is the same for any number).
"""

from __future__ import annotations

import base64
import html
import json
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis import figures, plotting, rounds, spectra_figures
from sgdsweep.analysis import headline as headlines
from sgdsweep.analysis.figure_cache import FigureCache, figure_key
from sgdsweep.analysis.fit import family
from sgdsweep.analysis.fit.cache import WHOLE_SWEEP_ATTRS
from sgdsweep.analysis.fit.escape import LAW_NAMES, follows_sentence
from sgdsweep.analysis.fit.verdict import MAX_LISTED, NAMES, Verdict, assess, judge
from sgdsweep.analysis.status import status_line

log = logging.getLogger("sgdsweep.analysis.report")

_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:0.8em auto;padding:0 1em;color:#222;font-size:15px}"
          "h1{font-size:1.5em;margin:0.3em 0}h2{font-size:1.25em;margin:1em 0 0.4em}"
          "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
          "td,th{border:1px solid #bbb;padding:3px 7px;text-align:right}th{background:#eee}"
          ".good{color:#176317}.bad{color:#a31515}.neutral{color:#6b5200}img{max-width:100%}"
          ".verdict{border-left:5px solid #999;padding:2px 10px;margin:6px 0}"
          ".verdict.good{border-color:#2e8b2e}.verdict.bad{border-color:#c0392b}.verdict.neutral{border-color:#d4a017}"
          ".verdict ul{margin:2px 0;padding-left:1.2em;color:#222}.verdict li{margin:1px 0}"
          ".status{margin:0.3em 0;color:#333}.notrun{margin:0.3em 0;color:#555;font-size:13px}"
          ".scroll{overflow-x:auto;max-width:100%}.scroll table{margin:0.5em 0}pre{overflow-x:auto}"
          "figure{margin:0.6em 0}img{height:auto}"
          "#lead{margin:0.2em 0 0.6em}#lead figure{margin:0.3em 0}#lead img{max-height:440px;width:auto}"
          ".headline{border-left:6px solid #999;padding:4px 10px;margin:0.3em 0;font-size:15px;line-height:1.35}"
          ".headline.good{border-color:#2e8b2e}.headline.bad{border-color:#c0392b}"
          ".headline.neutral{border-color:#d4a017}.headline span{color:#222}")


def _fmt(x: Any, digits: int = 4) -> str:
    return html.escape(plotting.format_value(x, digits))


def _table(header: list[str], rows: list[list[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _scroll(part: str) -> str:
    """A table of the page (``part`` starting with ``<table``) in a box of the page's width that
    scrolls sideways when the table is wider; any other part as it is."""
    return f"<div class='scroll'>{part}</div>" if part.startswith("<table") else part


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels of a PNG, from its header."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


#: A drawn figure: its PNG, its SVG (None unless asked for) and its legends
#: (:func:`sgdsweep.analysis.plotting.legend_entries`); None when there was nothing to draw.
Drawn = tuple[bytes, bytes | None, dict[str, list[str]]] | None


def _png(make: Callable[..., Any], args: tuple[Any, ...], svg: bool = False) -> Drawn:
    """The figure ``make(*args)`` drawn (:data:`Drawn`; None when it returns None)."""
    fig = make(*args)
    if fig is None:
        return None
    try:
        legends = plotting.legend_entries(fig)
        png, vector = plotting.render(fig, plotting.DPI, svg=svg)
        return png, vector, legends
    finally:
        figures.plt.close(fig)


def figure_pool(jobs: int) -> ProcessPoolExecutor | None:
    """``jobs`` processes that draw figures, started now; None for ``jobs`` <= 1.

    Drawing is the report's cost (matplotlib spends ~0.5 s of CPU per figure) and figures are
    independent. While this process runs a single thread the workers are forked from it — call
    this after importing this module and before reading any Zarr store, and they inherit the
    imported figure code instead of importing it again (~2 s). Once another thread runs (Zarr's
    event loop: a lock it holds at fork would hang the child forever) they come from a fork
    server instead, a fresh single-threaded process that imports the figure code once. Where
    the platform has neither, None: figures are drawn one after the other.
    """
    if jobs <= 1:
        return None
    # xarray imports dask.array the first time it makes a variable (~1 s of CPU): here, once,
    # rather than in each worker as it unpickles its first figure's data
    import dask.array  # noqa: F401

    methods = multiprocessing.get_all_start_methods()
    if threading.active_count() == 1 and "fork" in methods:
        context = multiprocessing.get_context("fork")
    elif "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__, "dask.array"])
    else:
        return None
    pool = ProcessPoolExecutor(jobs, mp_context=context)
    pool.submit(int)  # starts every worker now (the executor forks them all at its first task)
    return pool


def _render(todo: list[tuple[Callable[..., Any], tuple[Any, ...]]],
            pool: ProcessPoolExecutor | None, svg: bool = False) -> list[Drawn]:
    """:func:`_png` of every (make, args), in order, with SVGs when ``svg``; in ``pool``'s
    processes when given (the arguments travel pickled)."""
    if pool is None or len(todo) <= 1:
        return [_png(make, args, svg) for make, args in todo]
    return list(pool.map(_png, *zip(*todo), [svg] * len(todo)))


class _Figures:
    """Collects the report's figures, draws them all at once (:func:`_render`) and embeds each
    as a data URI shown at :data:`~sgdsweep.analysis.plotting.SHOWN_DPI`; with a directory, also
    writes each there as ``<name>.png`` and ``<name>.svg``. ``legends`` keeps each drawn figure's
    legend entries by name."""

    def __init__(self, directory: Path | None, pool: ProcessPoolExecutor | None = None,
                 cache: FigureCache | None = None) -> None:
        self.directory = directory
        self.pool = pool
        self.cache = cache
        #: how many figures :meth:`fill` took from the cache, and how many it drew
        self.reused = self.drawn = 0
        self.names: list[str] = []
        self.legends: dict[str, dict[str, list[str]]] = {}
        #: the name of the figure that leads the report (drawn once, at the top)
        self.lead: str | None = None
        self._todo: list[tuple[str, str, Callable[..., Any], tuple[Any, ...]]] = []
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def img(self, name: str, alt: str, make: Callable[..., Any], *args: Any) -> str:
        """A placeholder (one element of the report's parts) for the figure ``make(*args)``;
        :meth:`fill` replaces it by the figure, or by nothing when ``make`` returns None. The
        lead figure (:attr:`lead`) is drawn once: later, a link to it."""
        if name == self.lead:
            return (f"<p class='notrun'>This section's figure leads the report (<a href='#fig-{html.escape(name)}'>"
                    "at the top</a>).</p>")
        self._todo.append((name, alt, make, args))
        return f"<!--figure {len(self._todo) - 1}-->"

    def fill(self, parts: list[str]) -> list[str]:
        """``parts`` with every placeholder replaced by its drawn figure (in document order). With
        a cache, a figure whose key is there is taken from it, the others are drawn and stored,
        and the cache then keeps this report's figures only."""
        svg = self.directory is not None
        todo = [(make, args) for _, _, make, args in self._todo]
        memo: dict[int, str] = {}  # one digest per dataset, however many figures show it
        keys = [figure_key(make, args, memo) if self.cache is not None else None for make, args in todo]
        drawn: list[Drawn] = [self.cache.get(k, svg) if self.cache is not None and k else None for k in keys]
        missing = [i for i, d in enumerate(drawn) if d is None]
        for i, data in zip(missing, _render([todo[i] for i in missing], self.pool, svg)):
            drawn[i] = data
            if self.cache is not None and keys[i] and data is not None:
                self.cache.put(keys[i], data)
        self.reused = len(todo) - len(missing)
        self.drawn = sum(drawn[i] is not None for i in missing)  # not those with nothing to draw
        if self.cache is not None:
            self.cache.keep_only(k for k in keys if k)
        html_of = {f"<!--figure {i}-->": self._embed(name, alt, data)
                   for i, ((name, alt, _, _), data) in enumerate(zip(self._todo, drawn))}
        self._todo = []
        return [html_of.get(p, p) for p in parts]

    def _embed(self, name: str, alt: str, data: Drawn) -> str:
        if data is None:
            return ""
        png, svg, legends = data
        if self.directory is not None:
            (self.directory / f"{name}.png").write_bytes(png)
            if svg is not None:
                (self.directory / f"{name}.svg").write_bytes(svg)
        self.names.append(name)
        self.legends[name] = legends
        width, height = _png_size(png)
        shown = plotting.SHOWN_DPI / plotting.DPI
        uri = "data:image/png;base64," + base64.b64encode(png).decode()
        return (f'<figure id="fig-{html.escape(name)}"><img alt="{html.escape(alt)}" width="{round(width * shown)}" '
                f'height="{round(height * shown)}" src="{uri}"></figure>')


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


#: The word beside a verdict's title, per status.
_BADGE = {"good": "agrees with the exact theory", "bad": "DISAGREES with the exact theory",
          "neutral": "no exact theory to judge by"}


def _verdict_box(v: Verdict, title: str | None = None) -> str:
    """One verdict: its title and status in colour, then its sentences."""
    head = html.escape(v.title if title is None else title)
    items = "".join(f"<li>{html.escape(s)}</li>" for s in v.sentences)
    badge = _BADGE[v.status] + (f" {v.scope}" if v.scope else "")
    return (f"<div class='verdict {v.status}'><b>{head}</b> — <b class='{v.status}'>{html.escape(badge)}</b>"
            f"<ul>{items}</ul></div>")


def _verdict_html(kind: str, results: list[dict[str, Any]]) -> str:
    """The verdict of a fit section: of its one group, of each of a few, or their summary."""
    if len(results) > MAX_LISTED:
        return _verdict_box(assess({kind: results})[0], "Verdict")
    return "".join(_verdict_box(judge(kind, r), "Verdict" if len(results) == 1 else None) for r in results)


def _subset(ds: xr.Dataset, group: dict[str, Any]) -> xr.Dataset:
    mask = np.ones(ds.sizes["point"], bool)
    for k, v in group.items():
        mask &= ds[k].values == v
    return ds.isel(point=np.flatnonzero(mask))


def _group_figure(ds: xr.Dataset, res: dict[str, Any]) -> tuple[xr.Dataset, dict[str, Any]]:
    """The inputs of one group's fit figure: the group's points without the attributes that
    describe the whole sweep, and its fit without the report-wide decisions
    (:func:`sgdsweep.analysis.fit.family.unjudged`). The figure draws neither, so when points of
    other groups are added its inputs, and so its figure cache key, stay the same."""
    sub = _subset(ds, res["group"])
    sub.attrs = {k: v for k, v in sub.attrs.items() if k not in WHOLE_SWEEP_ATTRS}
    return sub, family.unjudged(res)


#: Per fit kind, the figures of at most this many groups are drawn; with more groups an overview
#: figure shows every group's estimates instead (each group keeps its table).
MAX_GROUP_FIGURES = 4
#: Parameters of each per-group fit shown in its overview figure.
_OVERVIEW = {"power_law": ("a", "b"), "linear_scaling": ("spread2",), "momentum_scaling": ("spread2",),
             "escape": ("slope", "intercept")}


def _flagged(res: dict[str, Any]) -> bool:
    """Whether a theory value of the fit lies outside its interval."""
    return any(q and q.get("theory_inside") is False for q in (res.get("params") or {}).values())


def _drawn_groups(results: list[dict[str, Any]]) -> set[int]:
    """Indices of the groups whose figure is drawn: every group when there are at most
    :data:`MAX_GROUP_FIGURES`, else :data:`MAX_GROUP_FIGURES` of the fitted ones (no error): the
    first, then those with a theory value outside its interval, then the next ones in order."""
    if len(results) <= MAX_GROUP_FIGURES:
        return set(range(len(results)))
    fitted = [i for i, r in enumerate(results) if not r.get("error")]
    order = dict.fromkeys([*fitted[:1], *(i for i in fitted if _flagged(results[i])), *fitted])
    return set(list(order)[:MAX_GROUP_FIGURES])


def _overview(kind: str, results: list[dict[str, Any]], figs: _Figures) -> list[str]:
    """With more groups than :data:`MAX_GROUP_FIGURES`: a note saying which groups have a figure
    and one figure of every group's estimates; nothing otherwise."""
    if len(results) <= MAX_GROUP_FIGURES:
        return []
    drawn = sorted(_drawn_groups(results))
    where = "; ".join(_where(results[i]["group"]) for i in drawn)
    note = (f"<p>{len(results)} groups: each has its table below, but to keep the report quick to build and "
            f"to read only {len(drawn)} have a figure of their own ({html.escape(where)}: the first group, then "
            "groups with a theory value outside its interval, then the next ones). This figure shows every "
            "group's estimates.</p>")
    return [f"<h3>{NAMES[kind]}: all {len(results)} groups</h3>", note,
            figs.img(f"{kind}_overview", f"{kind} estimates of every group", figures.fit_overview, results,
                     _OVERVIEW[kind], NAMES[kind])]


def _fit_sections(ds: xr.Dataset, fits: dict[str, Any], figs: _Figures) -> list[str]:
    parts: list[str] = []
    conf = fits.get("settings", {}).get("confidence", 0.95)
    parts.extend(_overview("power_law", fits.get("power_law", []), figs))
    drawn = _drawn_groups(fits.get("power_law", []))
    for i, res in enumerate(fits.get("power_law", [])):
        parts.append(f"<h3>{NAMES['power_law']} at {html.escape(_where(res['group']))}</h3>")
        if res.get("error"):
            parts.append(f"<p class='bad'>{html.escape(res['error'])}</p>")
            continue
        parts.append(_table(_PARAM_HEADER, _param_rows(res, ("a", "b", "log_A")), "fit"))
        parts.append(f"<p>{res['n_points']} points, χ²/dof = {_fmt(res['chi2_reduced'])} "
                     f"(p = {_fmt(res.get('chi2_pvalue'))}). The leading-order law (a = 1, b = −1) ignores the "
                     "discreteness and multiplicative-noise corrections that the exact theory includes.</p>")
        parts.append(_verdict_html("power_law", [res]))
        if i in drawn:
            parts.append(figs.img(f"power_law_{i}", "power-law fit", figures.power_law, *_group_figure(ds, res)))
    for kind in ("linear_scaling", "momentum_scaling"):
        parts.extend(_overview(kind, fits.get(kind, []), figs))
        drawn = _drawn_groups(fits.get(kind, []))
        for i, res in enumerate(fits.get(kind, [])):
            parts.append(f"<h3>{NAMES[kind]} at {html.escape(_where(res['group']))}</h3>")
            if res.get("error"):
                parts.append(f"<p>{html.escape(res['error'])}</p>")
                continue
            parts.append(_table(_PARAM_HEADER, _param_rows(res, ("spread2",)), "fit"))
            parts.append(f"<p>Δ² is the noise-corrected variance of ln(weight_var) among points with equal "
                         f"{html.escape(res['variable'])} ({res['n_classes']} classes, {res['n_points']} points); "
                         f"√Δ² = {_fmt(res['relative_spread'])} measured, {_fmt(res['relative_spread_theory'])} "
                         f"exact theory, 0 at leading order; measurement noise alone: "
                         f"{_fmt(res['noise_floor'])} per point.</p>")
            parts.append(_verdict_html(kind, [res]))
            if i in drawn:
                parts.append(figs.img(f"{kind}_{i}", NAMES[kind], figures.collapse, *_group_figure(ds, res)))
    parts.extend(_overview("escape", fits.get("escape", []), figs))
    drawn = _drawn_groups(fits.get("escape", []))
    for i, res in enumerate(fits.get("escape", [])):
        parts.append(f"<h3>{NAMES['escape']} at {html.escape(_where(res['group']))}</h3>")
        if res.get("table"):  # per λ: measured τ, the exact discrete chain's τ and each law's (steps)
            parts.append(_table(["λ", "λh", "measured τ", "SE", "exact τ (discrete chain)",
                                 "Gaussian-matched τ (approximation)", "Kramers", "power law (unit prefactor)"],
                                [[r["lr"], r["lr_h"], r["tau"], r["tau_se"], r["exact"], r["exact_matched"],
                                  r["arrhenius"], r["powerlaw"]] for r in res["table"]], "fit"))
            if res.get("exact_follows"):
                parts.append(f"<p>{html.escape(follows_sentence(res['exact_follows'], res.get('laws_absent')))}.</p>")
        for law, why in (res.get("laws_absent") or {}).items():  # a law that does not hold here: no comparison
            parts.append(f"<p>{html.escape(LAW_NAMES[law])} not compared: {html.escape(why)}.</p>")
        if res.get("error"):
            parts.append(f"<p>{html.escape(res['error'])}</p>")
            continue
        rows = _param_rows(res, ("slope", "intercept"))
        slope = res["params"]["slope"]
        rows.append([_where(res["group"]), "slope vs power law", rows[0][2], slope["stderr"],
                     slope["interval_method"], slope.get("theory_powerlaw"), None,
                     slope.get("theory_powerlaw_inside")])
        parts.append(_table(_PARAM_HEADER[:5] + ["theory", "leading order", "theory inside interval"], rows, "fit"))
        parts.append(f"<p>{res['n_points']} points ({res['excluded_points']} without escapes excluded).</p>")
        parts.append(_verdict_html("escape", [res]))
        if i in drawn:
            parts.append(figs.img(f"escape_{i}", "escape fit", figures.escape, *_group_figure(ds, res)))
    if fits.get("wigner"):
        rows = []
        for res in fits["wigner"]:
            if "params" not in res:
                rows.append([_where(res["group"]), res.get("error"), None, None, None, None, None])
                continue
            b, s = res["params"]["binder"], res["params"]["sigma"]
            rows.append([_where(res["group"]), (f"{_fmt(b['estimate'])} [{_fmt(b['interval'][0])}, "
                         f"{_fmt(b['interval'][1])}]"), b["theory_inside"], s["estimate"], res["ks_statistic"],
                         res["ks_pvalue"], res["wigner_consistent"]])
        parts.append(f"<h3>{NAMES['wigner']}</h3>")
        parts.append(_table(["point", f"Binder cumulant [{conf:.0%}]", "−4/27 inside", "σ",
                             "KS statistic vs Wigner surmise", "KS p-value (approximate)",
                             "consistent with the surmise"], rows, "fit"))
        parts.append(_verdict_html("wigner", fits["wigner"]))
        parts.append(figs.img("wigner", "pair statistics", spectra_figures.wigner, ds, fits["wigner"]))
        parts.append(figs.img("wigner_width", "pair width against √(λ/S)", spectra_figures.wigner_width, ds,
                              fits["wigner"]))
        for res in fits.get("wigner_width", []):
            if "params" in res:
                parts.append(f"<h4>{NAMES['wigner_width']} at {html.escape(_where(res['group']))}</h4>")
                parts.append(_table(_PARAM_HEADER, _param_rows(res, ("a", "b", "log_A")), "fit"))
    if fits.get("flatness"):
        parts.append(f"<h3>{NAMES['flatness']}</h3>")
        rows = [r for res in fits["flatness"] for r in (_param_rows(res, ("psi",)) if "params" in res else [
            [_where(res["group"]), "psi", res.get("error"), None, None, None, None, None]])]
        parts.append(_table(_PARAM_HEADER, rows, "fit"))
        excluded = [res for res in fits["flatness"] if res.get("excluded_modes")]
        if excluded:  # round-off modes left out of the fits (sgdsweep.analysis.fit.spectra.NUMERICAL_FLOOR)
            parts.append(f"<p>At {len(excluded)} of {len(fits['flatness'])} points, "
                         f"{', '.join(str(r['excluded_modes']) for r in excluded)} mode(s) with variance or "
                         f"curvature below the numerical floor ({excluded[0].get('numerical_floor', 1e-10):g} × the "
                         "largest mode's) were excluded from the fit: round-off, not physics.</p>")
        parts.append(_verdict_html("flatness", fits["flatness"]))
        parts.append(figs.img("flatness", "variance against curvature", spectra_figures.flatness, ds,
                              fits["flatness"]))
    return parts


def _missing_because(ds: xr.Dataset, column: str) -> str:
    """Why the theory ``column`` is missing, each distinct reason with the number of points it
    applies to (the ensemble's ``missing_because``; its attribute for an ensemble without it)."""
    if "missing_because" not in ds or column not in ds["theory_column"].values:
        return ds[column].attrs.get("missing_because", "")
    reasons = [str(r) for r in ds["missing_because"].sel(theory_column=column).values]
    return "; ".join(f"{r} ({reasons.count(r)} of {len(reasons)} points)" for r in sorted(set(reasons)) if r)


def _answer(fits: dict[str, Any]) -> str:
    """Every fit's verdict with its headline numbers, then the fits that did not run (and why)."""
    conf = fits.get("settings", {}).get("confidence", 0.95)
    boxes = "".join(_verdict_box(v) for v in assess(fits)) or (
        "<p>No fit applies to this sweep (each is listed below with why); the headline above compares the "
        "measurements with the theory.</p>")
    skipped = fits.get("skipped") or {}
    notrun = ("<p class='notrun'>Not run: " + "; ".join(
        f"{html.escape(NAMES.get(k, k))} ({html.escape(why)})" for k, why in skipped.items()) + ".</p>"
              if skipped else "")
    control = family.sentence(fits.get("family"))
    return (f"<section id='answer'><h2>What the fits found</h2><p class='status'>Estimates with {conf:.0%} "
            "intervals [low, high], the same fit of the exact theory, and the leading-order value."
            + (f" {html.escape(control)}" if control else "") + "</p>"
            + boxes + notrun + "</section>")


def _rows(ds: xr.Dataset, names: list[str], extra: list[np.ndarray] = ()) -> list[list[Any]]:
    """One table row per point: the values of the per-point variables ``names``, then of the
    arrays ``extra``, as Python scalars (each column converted once, not cell by cell)."""
    columns = [np.asarray(ds[n].values).tolist() for n in names] + [np.asarray(e).tolist() for e in extra]
    return [list(row) for row in zip(*columns)]


#: The tables of points list at most this many rows (the first points); a line under the table
#: says how many more there are and sums them up (every point is in ``ensemble.zarr``).
MAX_TABLE_ROWS = 200


def _rest_note(ds: xr.Dataset, z: np.ndarray | None) -> str:
    """Under a table of the first :data:`MAX_TABLE_ROWS` points: how many are not listed, and of
    them how many diverged and their largest |measured − theory| / SE (empty when all are listed)."""
    n = ds.sizes["point"]
    if n <= MAX_TABLE_ROWS:
        return ""
    rest = slice(MAX_TABLE_ROWS, None)
    text = (f"<p class='notrun'>{n - MAX_TABLE_ROWS} more points not listed (the table shows the first "
            f"{MAX_TABLE_ROWS} of {n}; every point is in <code>ensemble.zarr</code>, and "
            "<code>sgdsweep export</code> writes them all)")
    status = figures.point_status(ds)[rest]
    text += f": {int((status == 2).sum())} of them fully diverged, {int((status == 1).sum())} partly"
    if z is not None and np.isfinite(z[rest]).any():
        text += f"; their largest |measured − theory| / SE is {np.nanmax(np.abs(z[rest])):.2f}"
    return text + ".</p>"


def _points_table(ds: xr.Dataset) -> str:
    axes = json.loads(ds.attrs.get("swept_axes", "[]")) or ["lr", "batch_size"]
    cols = [c for c in ("weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_theory", "diverged_replicas",
                        "burn_in") if c in ds]
    z = ((ds["weight_var"] - ds["weight_var_theory"]) / ds["weight_var_se"]).values if {
        "weight_var", "weight_var_theory", "weight_var_se"} <= set(ds.data_vars) else None
    first = ds.isel(point=slice(0, MAX_TABLE_ROWS))
    rows = _rows(first, ["point", *axes, *cols], [z[:MAX_TABLE_ROWS]] if z is not None else [])
    header = ["point"] + axes + [c + plotting.unit_suffix(plotting.shown_units(ds[c].attrs)) for c in cols]
    return _table(header + (["(meas−theory)/SE"] if z is not None else []), rows, "points") + _rest_note(ds, z)


def build_report(ds: xr.Dataset, fits: dict[str, Any], report_spec: dict[str, Any],
                 figures_dir: str | Path | None = None, jobs: int = 1,
                 pool: ProcessPoolExecutor | None = None,
                 legends: dict[str, dict[str, list[str]]] | None = None,
                 figure_cache: str | Path | None = None) -> str:
    """The report as one HTML string (no external resources); figures also go to ``figures_dir``.
    ``jobs`` processes draw the figures — those of ``pool`` (:func:`figure_pool`) when given,
    else a pool started here and shut down after. The report is the same for any number.
    ``legends``, when given, is filled with every drawn figure's legend entries by name
    (:func:`sgdsweep.analysis.plotting.legend_entries`). With ``figure_cache`` (a directory),
    figures whose inputs are those of a figure of the previous report built with it are taken
    from there instead of drawn (:mod:`sgdsweep.analysis.figure_cache`): the same page."""
    own = pool is None
    pool = figure_pool(jobs) if own else pool
    try:
        cache = FigureCache(figure_cache) if figure_cache is not None else None
        figs = _Figures(Path(figures_dir) if figures_dir is not None else None, pool, cache)
        page = _build(ds, fits, report_spec, figs)
        if legends is not None:
            legends.update(figs.legends)
        if cache is not None:
            log.info("report: %d figure(s) drawn, %d unchanged since the previous report taken from %s",
                     figs.drawn, figs.reused, figure_cache)
        return page
    finally:
        if own and pool is not None:
            pool.shutdown()


def _lead(ds: xr.Dataset, fits: dict[str, Any], report_spec: dict[str, Any], figs: _Figures) -> list[str]:
    """The first screen's section (parts of the page): the headline on the sweep's question
    (``report.lead``) in words with its numbers, above the figure that answers it
    (:mod:`sgdsweep.analysis.headline`)."""
    conf = float(fits.get("settings", {}).get("confidence", 0.95))
    head = headlines.headline(report_spec["report"].get("lead"), ds, fits, report_spec.get("config", {}), conf)
    badge = {"good": "Agrees with the exact theory.", "bad": "DISAGREES with the exact theory.",
             "neutral": "Measured; nothing exact to judge by."}[head.status]
    text = " ".join(html.escape(s[:1].upper() + s[1:]) + "." for s in head.sentences)
    notes = "".join(f"<p class='notrun'>{html.escape(n)}.</p>" for n in head.notes)
    figure = ""
    if head.figure is not None:
        name, alt, make, args = head.figure
        figure = figs.img(name, alt, make, *args)
        figs.lead = name
    return [(f"<section id='lead'><p class='headline {head.status}'><b class='{head.status}'>{badge}</b> "
            f"<span>{text}</span></p>{notes}"), figure, "</section>"]


def _build(ds: xr.Dataset, fits: dict[str, Any], report_spec: dict[str, Any], figs: _Figures) -> str:
    title = report_spec["report"]["title"]
    parts = [f"<h1>{html.escape(title)}</h1>", *_lead(ds, fits, report_spec, figs), status_line(ds), _answer(fits)]
    info = report_spec.get("rounds")  # precision or search: what the rounds spent and found
    if info:
        parts.append(rounds.status_line(info))
    if figures.coverage_worth_showing(ds):
        parts.append("<h2>Coverage of the grid</h2>")
        parts.append(figs.img("coverage", "coverage map", figures.coverage, ds))
    if info:
        parts.extend(rounds.sections(ds, info, report_spec["config"], fits, figs.img))
    parts.append("<h2>Fits</h2>")
    parts.extend(_fit_sections(ds, fits, figs))
    parts.append("<h2>Measured vs theory</h2>")
    parts.append(figs.img("weight_var", "weight variance against lr/batch_size", figures.weight_var_against_ratio, ds))
    parts.append(figs.img("spectra", "covariance spectra", spectra_figures.spectra, ds))
    parts.append(figs.img("fdr_fourier", "Fourier profiles of the FDR", spectra_figures.fdr_fourier, ds))
    swept = json.loads(ds.attrs.get("swept_axes", "[]"))
    for axis in swept:
        parts.append(figs.img(f"against_{axis}", f"observables against {axis}", figures.against_axis, ds, axis))
        if axis not in ("lr", "batch_size"):
            for name in ("weight_cov_eigenvalues", "q_eigenvalues"):
                parts.append(figs.img(f"{name}_against_{axis}", f"{name} against {axis}",
                                      spectra_figures.spectrum_against_axis, ds, axis, name))
    parts.append("<h2>Points</h2>")
    parts.append(_points_table(ds))
    shown = {"weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_theory", "diverged", "burn_in",
             "simulation_seconds", "diverged_replicas"}
    others = [v for v in ds.data_vars if ds[v].dims == ("point",) and v not in shown]
    if others:
        parts.append("<h2>Other observables</h2><p>Per point, as stored in <code>ensemble.zarr</code> "
                     "(units in each variable's attributes).</p>")
        header = ["point"] + [v + plotting.unit_suffix(plotting.shown_units(ds[v].attrs)) for v in others]
        parts.append(_table(header, _rows(ds.isel(point=slice(0, MAX_TABLE_ROWS)), ["point", *others]), "points")
                     + _rest_note(ds, None))
    theory_rows = [[v, ds[v].attrs.get("formula", ""), _missing_because(ds, v)]
                   for v in ds.data_vars if "_theory" in v]
    if theory_rows:
        parts.append("<h2>Theory columns</h2>")
        parts.append(_table(["variable", "formula and approximation", "missing because"], theory_rows, "theory"))
    per_shard = ds["simulation_seconds"].groupby(ds["shard"]).sum()
    parts.append("<h2>Run time per shard</h2>")
    parts.append(_table(["shard", "points", "simulation time [s]"],
                        [[s, int((ds["shard"].values == s).sum()), float(v)]
                         for s, v in zip(per_shard["shard"].values, per_shard.values)]))
    parts.append(figs.img("shard_times", "run time per shard", figures.shard_times, ds))
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
            + "\n".join(_scroll(p) for p in figs.fill(parts) if p) + "</body></html>\n")
