"""Stability-edge search over rounds (``search:``, docs/precision.md).

For each combination of the other axes, the grid's values of ``search.edge`` (lr or momentum)
are the first round. A point *diverges* when any of its replicas does. After each round the
narrowest bracket between a stable value and a diverging one is kept (:func:`bracket`), and its
midpoint is the next round's point, until the bracket is narrower than ``search.tolerance``
(relative) or ``search.max_rounds`` is reached. Every value stable: the next looks beyond the
largest (lr doubled, momentum halfway to 1); every value diverged: below the smallest (halved).
Decided only from the stored results, like the precision rounds
(:mod:`sgdsweep.sweep.precision`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sgdsweep.errors import ConfigError
from sgdsweep.models import get_model
from sgdsweep.sweep.config import Point, Sweep, describe_point, make_point
from sgdsweep.sweep.precision import stored_summary


def search_rounds(sweep: Sweep) -> Sweep:
    """The edge search's sweep at its current round: every point evaluated so far and the next
    midpoint of each combination still open, with :attr:`Sweep.rounds` describing each
    combination (module docstring).

    Raises:
        ConfigError: a combination of the other axes with fewer than two values of the edge's axis.
    """
    cfg = sweep.config["search"]
    axis, tol = cfg["edge"], cfg["tolerance"]
    model = get_model(sweep.config["model"]["kind"])
    groups: dict[str, list[Point]] = {}
    for p in sweep.points:
        key = repr(sorted((c, p.params.get(c)) for c in sweep.coords if c != axis))
        groups.setdefault(key, []).append(p)
    for members in groups.values():
        if len({p.params[axis] for p in members}) < 2:
            raise ConfigError(f"grid.{axis}", members[0].params[axis], f"at least two values of {axis}",
                              f"search.edge {axis} bisects between the smallest and largest value the grid gives "
                              f"it for each combination of the other axes; {describe_point(members[0].params)} "
                              "has one.")
    points: dict[str, Point] = {p.hash: p for p in sweep.points}
    info_groups = []
    max_round = 0
    for members in groups.values():
        evaluated = {float(p.params[axis]): p for p in members}
        status, k, ends, side = "pending", 0, (None, None), "below"
        for k in range(cfg["max_rounds"] + 1):
            outcome = {}
            for v, p in evaluated.items():
                summary = stored_summary(sweep, p)
                if summary is None:
                    break
                outcome[v] = int(summary.get("diverged_replicas") or 0) > 0
            if len(outcome) < len(evaluated):
                status = "pending"
                break
            s, d, side = bracket(outcome)
            ends = (s, d)
            if s is not None and d is not None and abs(d - s) <= tol * max(abs(d), abs(s)):
                status = "found"
                break
            if k == cfg["max_rounds"]:
                status = f"budget: max_rounds = {cfg['max_rounds']}"
                break
            if d is None:  # every value is stable: look beyond the largest
                new = 2 * s if axis == "lr" else (s + 1) / 2
            elif s is None:  # none is: look below the smallest
                new = d / 2
                if new < 1e-300:
                    status = f"diverges at every {axis}"
                    break
            else:
                new = (s + d) / 2
            base = members[0]
            params = {**base.params, axis: new}
            try:
                point = make_point(model, params, describe_point({axis: new}), sweep.footprints)  # type: ignore[arg-type]
            except ConfigError:
                params["burn_in"] = int(params["steps"]) // 2  # the auto burn-in does not fit: divergence needs none
                point = make_point(model, params, describe_point({axis: new}), sweep.footprints)  # type: ignore[arg-type]
            evaluated[new] = point
            points.setdefault(point.hash, point)
        max_round = max(max_round, k)
        first = members[0]
        info_groups.append({
            "axes": {c: first.params.get(c) for c in sweep.coords if c != axis},
            "status": status, "rounds": k, "stable": ends[0], "diverged": ends[1], "stable_side": side,
            "edge": ends[0] if status == "found" else None, "tolerance": tol,
            "evaluated": sorted(evaluated), "params": dict(first.params)})
    info = {"kind": "search", "axis": axis, "round": max_round, "groups": info_groups,
            "replica_steps": sum(int(p.params["replicas"]) * int(p.params["steps"]) for p in points.values())}
    return dataclasses.replace(sweep, points=tuple(points.values()), rounds=info, _shards={})


def bracket(outcome: Mapping[float, bool]) -> tuple[float | None, float | None, str]:
    """The narrowest bracket of the edge in ``outcome`` (value → whether a replica diverged):
    (stable end, diverged end, side). Side ``below``: stable below the edge (the smallest value
    is stable, the usual case for lr); ``above``: stable above it (the smallest value diverged
    and a larger one did not, as momentum beyond plain SGD's limit)."""
    values = sorted(outcome)
    if not outcome[values[0]]:
        d = next((v for v in values if outcome[v]), None)
        s = max(v for v in values if not outcome[v] and (d is None or v < d))
        return s, d, "below"
    s = next((v for v in values if not outcome[v]), None)
    if s is None:  # every value diverged: the edge lies below the smallest
        return None, values[0], "below"
    d = max(v for v in values if outcome[v] and v < s)
    return s, d, "above"
