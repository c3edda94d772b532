"""The report's account of a sweep run in rounds (``precision:`` or ``search:``).

Input: the ``rounds`` entry of ``plan/report.json`` (:func:`sgdsweep.sweep.plan.plan_texts`,
built by :func:`sgdsweep.sweep.precision.resolve_rounds`), the resolved config shown in the
report, the ensemble (its ``point`` coordinate holds each point's hash) and the fits.

- :func:`status_line`: one paragraph for the first screen, e.g. "Precision: 14 of 16 points met
  every target; 2 stopped at the budget (max_replicas = 4096); 3 extension rounds; 1.2e+09
  replica-steps."
- :func:`sections`: for ``precision``, the section "Rounds": per point its axis values, status,
  final replicas and steps, extensions, replica-steps (replicas × SGD steps simulated over every
  round) and measured relative standard error of every targeted observable against its target,
  with the reasons of each extension; then, per target, where it was met and where the budget
  stopped it. For ``search``, the section "Stability edge": per combination of the other axes
  the measured bracket of the almost-sure edge (:mod:`sgdsweep.sweep.search`: its stable and
  unstable ends, each decided from the replicas' Lyapunov exponents), the exact theory's
  mean-square edge (:func:`sgdsweep.models.edge.stability_edge`), the ratio of the bracket's
  midpoint to it and the status; the criterion; and, with more than one combination, the figure
  :func:`edge_figure`.

Status classes follow the report's verdicts: ``good`` (met, found), ``bad`` (budget, stopped,
unstable everywhere, undecided), ``neutral`` (pending: the current round still simulates it).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.figures import SYMBOL, label_of
from sgdsweep.analysis.plotting import format_value, plt

#: A cell of :func:`_table`: a value (formatted and escaped), or (text, CSS class) with the text
#: escaped, or a list of such lines (joined by line breaks).
Cell = Any

#: What the measured edge is, and how it relates to the theory's (sgdsweep/sweep/search.py,
#: sgdsweep/theory/edge.py).
EDGE_NOTE = ("The measured edge is the almost-sure one: where the top Lyapunov exponent of SGD linearised about "
             "the minimum crosses zero, each value decided from the replicas' exponents (criterion below), not from "
             "whether a replica crossed the divergence threshold (near the edge replicas cross any fixed bound and "
             "come back). The exact theory's edge is the mean-square one, where the second moment of the weights "
             "diverges (the spectral radius of the second-moment map reaches 1). The almost-sure edge lies at or "
             "above it: the two coincide when the linearised dynamics is not random (additive noise), and with "
             "sampled batches the almost-sure edge lies above, so measured / mean-square exceeds 1 there.")


def _fmt(x: Any, digits: int = 4) -> str:
    return format_value(x, digits, infinity=True)


def _cell(c: Cell) -> str:
    if isinstance(c, list):
        return "<br>".join(_cell(x) for x in c)
    if isinstance(c, tuple):
        text, cls = c
        return f"<span class='{cls}'>{html.escape(_fmt(text))}</span>"
    return html.escape(_fmt(c))


def _table(header: Sequence[str], rows: Sequence[Sequence[Cell]], cls: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def status_class(status: str) -> str:
    """``good``, ``bad`` or ``neutral`` for a point's or a combination's status."""
    if status in ("met", "found"):
        return "good"
    return "neutral" if status.startswith("pending") else "bad"


def _percent(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:.3g} %"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def status_line(info: Mapping[str, Any]) -> str:
    """The first screen's paragraph on the rounds: per status, how many points (precision) or
    combinations (search) ended there, the rounds after the first (extensions or bisections) and
    the replica-steps spent (replicas × SGD steps simulated, every round)."""
    word = "extension round" if info["kind"] == "precision" else "bisection round"
    spend = f"{_count(int(info['round']), word)}; {float(info['replica_steps']):.3g} replica-steps"
    if info["kind"] == "precision":
        statuses = [p["status"] for p in info["points"].values()]
        met = statuses.count("met")
        text = f"Precision: {met} of {_count(len(statuses), 'point')} met every target"
        budget = sorted({s.removeprefix("budget: ") for s in statuses if s.startswith("budget")})
        n_budget = sum(s.startswith("budget") for s in statuses)
        if n_budget:
            text += f"; {n_budget} stopped at the budget ({', '.join(budget)})"
        stopped = [s for s in statuses if s.startswith("stopped")]
        if stopped:
            text += f"; {len(stopped)} stopped (a target that no size can meet)"
        if "pending" in statuses:
            text += f"; {statuses.count('pending')} still pending in the current round"
        cls = "good" if met == len(statuses) else ("neutral" if "pending" in statuses else "bad")
    else:
        statuses = [g["status"] for g in info["groups"]]
        found = statuses.count("found")
        text = (f"Edge search ({SYMBOL.get(info['axis'], info['axis'])}): edge found for {found} of "
                f"{_count(len(statuses), 'combination')}")
        others = sorted({s for s in statuses if s != "found"})
        if others:
            text += "; " + ", ".join(f"{statuses.count(s)} {s}" for s in others)
        cls = status_class("found" if found == len(statuses) else ("pending" if "pending" in statuses else "bad"))
    return (f"<p class='status rounds'><b class='{cls}'>{html.escape(text)}</b>; "
            f"{html.escape(spend)}.</p>")


def _point_index(ds: xr.Dataset) -> dict[str, int]:
    return {str(h): i for i, h in enumerate(ds["point"].values.tolist())}


def _measured(ds: xr.Dataset, i: int | None, replicas: int, name: str,
              target: Mapping[str, float]) -> dict[str, float | None]:
    """Measured rel SE (and censored fraction for ``escape_time``) of ``name`` at point ``i`` of
    ``ds``, simulated with ``replicas`` replicas."""
    out: dict[str, float | None] = {}
    if i is None:
        return out
    if "rel_se" in target and name in ds and f"{name}_se" in ds:
        mean, se = float(ds[name].values[i]), float(ds[f"{name}_se"].values[i])
        out["rel_se"] = abs(se / mean) if mean and math.isfinite(mean) and math.isfinite(se) else None
    if "censored_fraction" in target and "escape_censored" in ds:
        alive = replicas - int(ds["diverged_replicas"].values[i] if "diverged_replicas" in ds else 0)
        out["censored_fraction"] = int(ds["escape_censored"].values[i]) / alive if alive > 0 else None
    return out


def _target_cells(measured: Mapping[str, float | None], target: Mapping[str, float]) -> list[Cell]:
    cells: list[Cell] = []
    for key, label in (("rel_se", "rel SE"), ("censored_fraction", "censored")):
        if key not in target:
            continue
        m = measured.get(key)
        ok = m is not None and m <= target[key]
        cells.append((f"{label} {_percent(m)} {'≤' if ok else '>'} {_percent(target[key])}",
                      "good" if ok else ("neutral" if m is None else "bad")))
    return cells


def _history(history: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"round {h['round']} → {h['replicas']} × {h['steps']}: " + "; ".join(h["reasons"]) for h in history]


def _precision(ds: xr.Dataset, info: Mapping[str, Any], config: Mapping[str, Any],
               fits: Mapping[str, Any]) -> list[str]:
    cfg = config.get("precision", {})
    targets: dict[str, dict[str, float]] = cfg.get("observables", {})
    index = _point_index(ds)
    axes = [a for a in _swept(ds) if a in ds.coords]
    header = ["point", *axes, "status", "replicas", "steps", "extensions", "replica-steps",
              *[f"{n} (target)" for n in targets], "extensions: round → replicas × steps: why"]
    rows, per_target = [], {n: {"met": 0, "unmet": {}} for n in targets}
    for h, p in info["points"].items():
        i = index.get(h)
        values = [ds[a].values[i] if i is not None else None for a in axes]
        values = [v.item() if hasattr(v, "item") else v for v in values]  # numbers and strings (noise)
        cells = []
        for name, target in targets.items():
            tc = _target_cells(_measured(ds, i, int(p["replicas"]), name, target), target)
            cells.append(tc)
            if tc and all(c[1] == "good" for c in tc):
                per_target[name]["met"] += 1
            elif p["status"] != "pending":
                per_target[name]["unmet"].setdefault(p["status"], []).append(label_of(axes, tuple(values)) or h[:10])
        rows.append([h[:10], *values, (p["status"], status_class(p["status"])), p["replicas"], p["steps"],
                     p["rounds"], f"{float(p['replica_steps']):.3g}", *cells, _history(p["history"]) or "—"])
    parts = ["<h2 id='rounds'>Rounds</h2>",
             (f"<p>Each point started at its configured replicas and steps; after every round the stored results "
             f"decided what it still needed (more replicas from the measured spread, more steps from censored "
             f"escapes or a window short against the autocorrelation time), and only that was simulated. "
             f"Replica-steps are replicas × SGD steps simulated at the point over every round. Budget: "
             f"{html.escape(_budget(cfg.get('budget', {})))}.</p>"),
             _table(header, rows, "rounds")]
    lines = []
    for name, target in targets.items():
        goal = ", ".join(f"{'rel SE' if k == 'rel_se' else 'censored fraction'} ≤ {_percent(v)}"
                         for k, v in target.items())
        t = per_target[name]
        text = f"{name} ({goal}): met at {_count(t['met'], 'point')}"
        for why, where in sorted(t["unmet"].items()):
            text += f"; not met at {len(where)} ({why}: {'; '.join(where)})"
        lines.append(f"<li>{html.escape(text)}</li>")
    lines.extend(f"<li>{html.escape(s)}</li>" for s in _fit_targets(cfg.get("fits", {}), fits))
    parts.append(f"<p>Targets:</p><ul>{''.join(lines)}</ul>")
    return parts


def _budget(budget: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {v:.3g}" if isinstance(v, float) else f"{k} = {v}" for k, v in budget.items()) or "none"


def _fit_targets(targets: Mapping[str, float], fits: Mapping[str, Any]) -> list[str]:
    """Per fit target ``kind.param: half-width``, the measured half-width of its interval in
    every group that fitted it."""
    out = []
    for key, goal in targets.items():
        kind, name = key.split(".", 1)
        widths = [(r.get("group") or {}, (q["interval"][1] - q["interval"][0]) / 2)
                  for r in fits.get(kind, []) if (q := (r.get("params") or {}).get(name)) and q.get("interval")]
        if not widths:
            out.append(f"{key} interval half-width ≤ {goal:g}: not fitted")
            continue
        met = sum(w <= goal for _, w in widths)
        worst = max(w for _, w in widths)
        out.append(f"{key} interval half-width ≤ {goal:g}: met in {met} of {_count(len(widths), 'group')} "
                   f"(widest {worst:.3g})")
    return out


def _swept(ds: xr.Dataset) -> list[str]:
    return json.loads(ds.attrs.get("swept_axes", "[]"))


def theory_edge(params: Mapping[str, Any], axis: str) -> dict[str, Any] | None:
    """The exact theory's (mean-square) edge along ``axis`` for a combination's resolved point
    ``params`` (:func:`sgdsweep.models.edge.stability_edge`), or None where the model has no such
    theory."""
    from sgdsweep.models import get_model
    from sgdsweep.models.edge import stability_edge

    model = get_model(params["model"])
    return stability_edge(model.make_problem(model.data_params(params)), params, axis)


def _search(info: Mapping[str, Any], img: Callable[..., str]) -> list[str]:
    axis, groups = info["axis"], info["groups"]
    sym = SYMBOL.get(axis, axis)
    names = list(groups[0]["axes"]) if groups else []
    varying = [a for a in names if len({repr(g["axes"][a]) for g in groups}) > 1]
    rows, drawn, methods = [], [], set()
    for g in groups:
        theory = theory_edge(g["params"], axis)
        # stable above the edge (momentum beyond plain SGD's limit): the theory's lower edge
        value = (theory.get("lower") if g.get("stable_side") == "above" else theory["value"]) if theory else None
        if theory:
            methods.add(theory["method"])
        s, u = g["stable"], g["unstable"]
        mid = (s + u) / 2 if s is not None and u is not None else None
        ratio = mid / value if mid is not None and value and math.isfinite(value) else None
        key = tuple(g["axes"][a] for a in varying)
        values = {r["value"] for r in g["evaluated"]}
        rows.append([*key, s, u, value, ratio, (g["status"], status_class(g["status"])), g["rounds"],
                     f"{len(values)} ({len(g['evaluated'])} evaluations)"])
        drawn.append({"key": key, "stable": s, "unstable": u, "theory": value})
    header = [*varying, f"stable {sym} (exponent < 0)", f"unstable {sym} (exponent > 0)",
              f"exact mean-square edge {sym}", "bracket midpoint / mean-square", "status", "rounds",
              "values evaluated"]
    tol = _percent(groups[0]["tolerance"]) if groups else "—"
    parts = ["<h2 id='stability-edge'>Stability edge</h2>",
             (f"<p>For each combination of the other axes, bisection on {html.escape(axis)} between the largest value "
              f"decided stable and the smallest decided unstable, until the bracket is narrower than the tolerance "
              f"({tol} of the edge); a value whose exponent's interval holds 0 is undecided, and is evaluated "
              f"again with more replicas once the bracket has closed in on it. {html.escape(EDGE_NOTE)}</p>"),
             _table(header, rows, "edge"),
             (f"<p>Criterion: {html.escape(str(info.get('criterion', '—')))}. Each decision is wrong with "
              f"probability at most {_percent((1 - float(info.get('confidence', 0.99))) / 2)}.</p>")]
    if methods:
        parts.append(f"<p>Theory (mean-square edge): {html.escape('; '.join(sorted(methods)))}.</p>")
    else:
        parts.append("<p>No exact edge theory for this model (its stability_edge hook gives none).</p>")
    if len(groups) > 1:
        parts.append(img("stability_edge", f"{axis} edge against the other axes", edge_figure, drawn, axis, varying))
    return parts


def edge_figure(rows: list[dict[str, Any]], axis: str, others: list[str]) -> plt.Figure | None:
    """The measured almost-sure edge along ``axis`` (bracket: stable to unstable value, as an
    error bar; open brackets as triangles) and the exact theory's mean-square edge (line with
    markers) against the first of ``others``, one colour per combination of the rest; None with
    fewer than two rows or no other axis. ``rows``: ``{"key": values of others, "stable",
    "unstable", "theory"}`` (None where unknown)."""
    if len(rows) < 2 or not others:
        return None
    x_axis, rest = others[0], others[1:]
    series: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(tuple(r["key"][1:]), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    numeric = all(isinstance(r["key"][0], (int, float)) and not isinstance(r["key"][0], bool) for r in rows)
    labels = sorted({r["key"][0] for r in rows}, key=repr) if not numeric else []
    sym = SYMBOL.get(axis, axis)
    for j, (rest_key, members) in enumerate(series.items()):
        colour = f"C{j}"
        name = label_of(rest, rest_key)
        members = sorted(members, key=lambda r: r["key"][0] if numeric else labels.index(r["key"][0]))
        x = np.array([r["key"][0] if numeric else labels.index(r["key"][0]) for r in members], float)
        for xi, r in zip(x, members):
            s, d = r["stable"], r["unstable"]
            if s is not None and d is not None:
                lo, hi = min(s, d), max(s, d)
                ax.errorbar([xi], [(lo + hi) / 2], yerr=[[(hi - lo) / 2], [(hi - lo) / 2]], fmt="o", ms=3,
                            color=colour, capsize=4)
            elif s is not None or d is not None:
                ax.plot([xi], [s if s is not None else d], "^" if d is None else "v", color=colour)
        theory = np.array([np.nan if r["theory"] is None else r["theory"] for r in members], float)
        finite = np.isfinite(theory)
        if finite.any():
            ax.plot(x[finite], theory[finite], "--x", color=colour, alpha=0.8,
                    label="exact mean-square edge" + (f", {name}" if name else ""))
        ax.plot([], [], "o", color=colour, label="measured almost-sure edge" + (f", {name}" if name else ""))
    if numeric:
        xs = np.array([r["key"][0] for r in rows], float)
        if (xs > 0).all() and xs.max() / xs.min() > 4:
            ax.set_xscale("log")
    else:
        ax.set_xticks(range(len(labels)), [str(v) for v in labels])
    ax.set_xlabel(SYMBOL.get(x_axis, x_axis) if x_axis in SYMBOL else x_axis)
    ax.set_ylabel(f"edge {sym}")
    ax.set_title(f"Stability edge in {sym}: measured (almost-sure) and exact mean-square")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sections(ds: xr.Dataset, info: Mapping[str, Any], config: Mapping[str, Any], fits: Mapping[str, Any],
             img: Callable[..., str]) -> list[str]:
    """The report's parts for ``info`` (module docstring): "Rounds" for precision, "Stability
    edge" for search. ``img(name, alt, make, *args)`` places a figure (the report's figure
    collector); ``config`` is the resolved config shown in the report."""
    if info["kind"] == "precision":
        return _precision(ds, info, config, fits)
    return _search(info, img)
