"""Stability-edge search over rounds (``search:``, docs/precision.md): the almost-sure edge.

The measured edge is where the top Lyapunov exponent γ of SGD linearised about the minimum
crosses zero (:mod:`sgdsweep.sim.tangent`): below it a single replica has a stationary law, above
it ‖w − w*‖ grows as e^{γt}. Every point of a search carries ``lyapunov: true``, so its store
holds each replica's estimate γ_r (a renormalised tangent vector's growth rate after the burn-in)
and their mean and standard error. Each evaluated value is decided (:func:`decide`):

- ``stable`` when the two-sided :data:`CONFIDENCE` t-interval of the mean exponent over the
  replicas lies below 0, ``unstable`` when it lies above 0, else ``undecided``.

Whether a replica crossed ``dynamics.divergence_threshold`` plays no part: near the almost-sure
edge the stationary law has power-law tails, so replicas cross any fixed bound and come back, and
how often depends on the bound, the replicas and the steps.

For each combination of the other axes the grid's values of ``search.edge`` (lr or momentum) are
the first round. After each round the narrowest bracket between a stable value and an unstable
one is kept (:func:`bracket`), and its midpoint is the next round's point, until the bracket is
narrower than ``search.tolerance`` (relative) or ``search.max_rounds`` is reached. Every decided
value stable: the next looks beyond the largest (lr doubled, momentum halfway to 1); every one
unstable: below the smallest (halved). Undecided values inside the bracket lie within the
exponent's resolution of the edge: the round then bisects the gaps between them and the
bracket's ends, and once those gaps are narrower than a quarter of the tolerance it evaluates
the undecided values nearest the ends again with :data:`ESCALATION` times the replicas (a new
point, fresh streams), up to :data:`MAX_ESCALATION` times the configured replicas; beyond that
the combination stops, saying ``undecided at …`` (:func:`_targets`).

Error: each decision is wrong with probability at most (1 − :data:`CONFIDENCE`)/2 = 0.5 % (the
replicas' γ_r are independent, and each is a mean over many steps); a bracket misses the zero
crossing only if a decision on which it rests is wrong, so with n decisions it holds the crossing
with probability at least 1 − n · 0.5 % (decisions far from the edge are almost never wrong), for
an exponent that changes sign once along the axis near the edge. The bracket does not depend on
the divergence threshold, and on the replicas and steps only through this error. Decided only
from the stored results, like the precision rounds (:mod:`sgdsweep.sweep.precision`).

:func:`edge_summary` is the search's result as ``results/<sweep>/edge.json`` (docs/outputs.md),
beside the exact theory's mean-square edge (:mod:`sgdsweep.theory.edge`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgdsweep.errors import ConfigError, PointName
from sgdsweep.models import get_model
from sgdsweep.sweep.config import Point, Sweep, make_point
from sgdsweep.sweep.precision import stored_summary

#: Two-sided level of the t-interval of the mean exponent that decides a value.
CONFIDENCE = 0.99
#: Factor on the replicas of a value re-evaluated because it was undecided.
ESCALATION = 4
#: Most replicas of a re-evaluated value, as a multiple of the configured replicas.
MAX_ESCALATION = 64
#: The criterion, as the report and edge.json name it.
CRITERION = ("top Lyapunov exponent of SGD linearised about the minimum (renormalised tangent vector per "
             f"replica, after the burn-in): stable where the {100 * CONFIDENCE:g} % t-interval of the mean over "
             "replicas lies below 0, unstable where it lies above 0")


def half_width(se: float, replicas: int) -> float:
    """Half-width of the two-sided :data:`CONFIDENCE` t-interval of a mean with standard error
    ``se`` over ``replicas`` (>= 2) independent replicas."""
    from scipy.special import stdtrit

    return float(stdtrit(replicas - 1, 0.5 + CONFIDENCE / 2)) * se


def decide(summary: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The decision at one stored point (module docstring) from its ``summary``.

    Returns:
        ``{"lyapunov", "lyapunov_se", "half_width", "decision"}``; ``decision`` is ``stable``,
        ``unstable`` or ``undecided`` (also when the point has no exponent or fewer than two
        replicas: no interval).
    """
    gamma, se = summary.get("lyapunov"), summary.get("lyapunov_se")
    out: dict[str, Any] = {"lyapunov": gamma, "lyapunov_se": se, "half_width": None, "decision": "undecided"}
    if gamma is None or se is None or replicas < 2:
        return out
    h = half_width(se, replicas)
    out["half_width"] = h
    if gamma + h < 0:
        out["decision"] = "stable"
    elif gamma - h > 0:
        out["decision"] = "unstable"
    return out


def _point(model, sweep: Sweep, base: Point, axis: str, value: float, replicas: int | None = None) -> Point:
    params = {**base.params, axis: value}
    if replicas is not None:
        params["replicas"] = replicas
    where = PointName({axis: value})
    try:
        return make_point(model, params, where, sweep.footprints)  # type: ignore[arg-type]
    except ConfigError:
        # the auto burn-in does not fit (a slow or unstable mean dynamics): the exponent is measured
        # after a tenth of the run at least (sgdsweep.sim.tangent.tangent_burn_in)
        params["burn_in"] = int(params["steps"]) // 2
        return make_point(model, params, where, sweep.footprints)  # type: ignore[arg-type]


def _check(sweep: Sweep, model, axis: str, groups: Mapping[str, list[Point]]) -> None:
    for members in groups.values():
        if len({p.params[axis] for p in members}) < 2:
            raise ConfigError(f"grid.{axis}", members[0].params[axis], f"at least two values of {axis}",
                              f"search.edge {axis} bisects between the smallest and largest value the grid gives "
                              f"it for each combination of the other axes; {PointName(members[0].params)} "
                              "has one.")
    first = sweep.points[0].params
    if model.make_problem(model.data_params(first)).w_min is None:
        raise ConfigError("search.edge", axis, "a model with a unique minimum (linear, digits, matrix, quadratic, "
                          "landscape)",
                          f"The search measures the top Lyapunov exponent of SGD linearised about the minimum; "
                          f"model.kind {first['model']} has a manifold of minima. Remove search: for this model.")


def search_rounds(sweep: Sweep) -> Sweep:
    """The edge search's sweep at its current round: every point evaluated so far and the next
    point(s) of each combination still open, with :attr:`Sweep.rounds` describing each
    combination (module docstring): its status, the bracket ``[low, high]`` (None until one
    stable and one unstable value are known), its ``stable`` and ``unstable`` ends, the side
    that is stable, and every evaluation with its exponent and decision.

    Raises:
        ConfigError: a combination of the other axes with fewer than two values of the edge's
            axis, or a model without a unique minimum.
    """
    cfg = sweep.config["search"]
    axis, tol = cfg["edge"], cfg["tolerance"]
    model = get_model(sweep.config["model"]["kind"])
    groups: dict[str, list[Point]] = {}
    for p in sweep.points:
        key = repr(sorted((c, p.params.get(c)) for c in sweep.coords if c != axis))
        groups.setdefault(key, []).append(p)
    _check(sweep, model, axis, groups)
    points: dict[str, Point] = {p.hash: p for p in sweep.points}
    info_groups = []
    max_round = 0
    for members in groups.values():
        base = members[0]
        base_replicas = int(base.params["replicas"])
        evaluated = {float(p.params[axis]): p for p in members}  # value → its latest evaluation
        records: list[dict[str, Any]] = []
        status, k, ends, side = "pending", 0, (None, None), "below"
        for k in range(cfg["max_rounds"] + 1):
            latest: dict[float, dict[str, Any]] = {}
            for v, p in evaluated.items():
                summary = stored_summary(sweep, p)
                if summary is None:
                    break
                latest[v] = {"value": v, "replicas": int(p.params["replicas"]), "steps": int(p.params["steps"]),
                             **decide(summary, int(p.params["replicas"]))}
            if len(latest) < len(evaluated):
                status = "pending"
                break
            for r in latest.values():
                if r not in records:
                    records.append(r)
            outcome = {v: r["decision"] == "unstable" for v, r in latest.items() if r["decision"] != "undecided"}
            s, d, side = bracket(outcome) if outcome else (None, None, "below")
            ends = (s, d)
            if s is not None and d is not None and abs(d - s) <= tol * max(abs(d), abs(s)):
                status = "found"
                break
            if k == cfg["max_rounds"]:
                status = f"budget: max_rounds = {cfg['max_rounds']}"
                break
            targets = _targets(latest, s, d, axis, tol)
            if isinstance(targets, str):
                status = targets
                break
            stop = None
            for v in targets:
                if v in evaluated:  # undecided there: again, with more replicas
                    r = int(evaluated[v].params["replicas"]) * ESCALATION
                    if r > base_replicas * MAX_ESCALATION:
                        rec = latest[v]
                        stop = (f"undecided at {axis} = {v:.6g}: exponent {_num(rec['lyapunov'])} ± "
                                f"{_num(rec['half_width'])} at {rec['replicas']} replicas")
                        break
                    evaluated[v] = _point(model, sweep, base, axis, v, r)
                else:
                    evaluated[v] = _point(model, sweep, base, axis, v)
                points.setdefault(evaluated[v].hash, evaluated[v])
            if stop is not None:
                status = stop
                break
        max_round = max(max_round, k)
        s, d = ends
        info_groups.append({
            "axes": {c: base.params.get(c) for c in sweep.coords if c != axis},
            "status": status, "rounds": k, "stable": s, "unstable": d, "stable_side": side,
            "bracket": sorted((s, d)) if s is not None and d is not None else None, "tolerance": tol,
            "evaluated": sorted(records, key=lambda r: (r["value"], r["replicas"])), "params": dict(base.params)})
    info = {"kind": "search", "axis": axis, "round": max_round, "groups": info_groups, "criterion": CRITERION,
            "confidence": CONFIDENCE,
            "replica_steps": sum(int(p.params["replicas"]) * int(p.params["steps"]) for p in points.values())}
    return dataclasses.replace(sweep, points=tuple(points.values()), rounds=info, _shards={})


def _targets(latest: Mapping[float, Mapping[str, Any]], s: float | None, d: float | None, axis: str,
             tol: float) -> list[float] | str:
    """The values the next round evaluates (an undecided value among them is evaluated again
    with more replicas), or why there are none. ``latest``: value → its latest evaluation;
    ``s``, ``d``: the stable and unstable ends of the bracket (:func:`bracket`)."""
    if s is None and d is None:  # no value decided yet: more replicas at every one
        return sorted(latest)
    if d is None:  # every decided value is stable: look beyond the largest
        return [2 * s if axis == "lr" else (s + 1) / 2]
    if s is None:  # none is: look below the smallest
        return [d / 2] if d / 2 >= 1e-300 else f"unstable at every {axis}"
    lo, hi = min(s, d), max(s, d)
    inside = sorted(v for v, r in latest.items() if r["decision"] == "undecided" and lo < v < hi)
    if not inside:
        return [(s + d) / 2]
    # undecided values: the edge lies within the exponent's resolution of them. Narrow the bracket
    # from both ends towards them; once those gaps are small, more replicas at the nearest ones
    gaps = [(lo, inside[0]), (inside[-1], hi)]
    wide = [(a + b) / 2 for a, b in gaps if b - a > tol * max(abs(s), abs(d)) / 4]
    return wide or sorted({inside[0], inside[-1]})


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def bracket(outcome: Mapping[float, bool]) -> tuple[float | None, float | None, str]:
    """The narrowest bracket of the edge in ``outcome`` (value → whether it was decided
    unstable; only decided values): (stable end, unstable end, side). Side ``below``: stable
    below the edge (the smallest value is stable, the usual case for lr); ``above``: stable above
    it (the smallest value is unstable and a larger one is not, as momentum beyond plain SGD's
    limit)."""
    values = sorted(outcome)
    if not outcome[values[0]]:
        d = next((v for v in values if outcome[v]), None)
        s = max(v for v in values if not outcome[v] and (d is None or v < d))
        return s, d, "below"
    s = next((v for v in values if not outcome[v]), None)
    if s is None:  # every value is unstable: the edge lies below the smallest
        return None, values[0], "below"
    d = max(v for v in values if outcome[v] and v < s)
    return s, d, "above"


def theory_edge(params: Mapping[str, Any], axis: str, stable_side: str = "below") -> dict[str, Any] | None:
    """The exact theory's mean-square edge for a combination's point ``params`` along ``axis``
    (:func:`sgdsweep.models.edge.stability_edge`): ``{"value", "method"}``, ``value`` the lower
    edge (``lower``) where the stable side lies above it; None where the model has no such
    theory (or, stable above, no lower edge)."""
    from sgdsweep.models.edge import stability_edge

    model = get_model(params["model"])
    out = stability_edge(model.make_problem(model.data_params(params)), params, axis)
    if out is None:
        return None
    value = out.get("lower") if stable_side == "above" else out["value"]
    return {"value": value, "method": out["method"]}


def edge_summary(sweep_name: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """The content of ``results/<sweep>/edge.json`` from a search's rounds ``info``
    (:attr:`Sweep.rounds`, kept in ``plan/report.json``): per combination of the other axes its
    axis values, status, the measured ``bracket`` [low, high] of the almost-sure edge (None until
    found or bracketed), the ``criterion``, the exact theory's ``mean_square_edge`` (None where
    there is no theory) and every evaluation (value, replicas, steps, exponent, its SE and
    interval half-width, decision)."""
    axis = info["axis"]
    groups = []
    for g in info["groups"]:
        theory = theory_edge(g["params"], axis, g["stable_side"])
        value = theory["value"] if theory else None
        groups.append({
            "axes": g["axes"], "status": g["status"], "bracket": g["bracket"], "stable_side": g["stable_side"],
            "criterion": info["criterion"],
            "mean_square_edge": value if value is not None and math.isfinite(value) else None,
            "mean_square_method": theory["method"] if theory else None,
            "rounds": g["rounds"], "evaluated": g["evaluated"]})
    return {"sweep": sweep_name, "axis": axis, "criterion": info["criterion"], "confidence": info["confidence"],
            "tolerance": info["groups"][0]["tolerance"] if info["groups"] else None, "groups": groups}


def write_edge_summary(report_spec: str | Path, out: str | Path, log: str | Path | None = None) -> dict[str, Any]:
    """Write :func:`edge_summary` of the search in ``report_spec`` (``plan/report.json``) to
    ``out`` (``results/<sweep>/edge.json``) atomically, and one line saying how many
    combinations were found to ``log`` (the rule's log) when given; return the summary.

    Raises:
        ValueError: the spec is not that of an edge search.
    """
    from sgdsweep.core.paths import atomic_write_text

    spec = json.loads(Path(report_spec).read_text())
    info = spec.get("rounds") or {}
    if info.get("kind") != "search":
        raise ValueError(f"{report_spec} is not the report spec of an edge search (no search rounds in it)")
    summary = edge_summary(spec["config"]["sweep"], info)
    atomic_write_text(out, json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if log is not None:
        found = sum(g["status"] == "found" for g in summary["groups"])
        atomic_write_text(log, f"wrote {out}: {found} of {len(summary['groups'])} combinations found\n")
    return summary
