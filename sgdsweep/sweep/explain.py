"""Why each point of a sweep would be simulated, and the plan as ``sgdsweep plan`` and
``sgdsweep run`` print it: :func:`explain` (hash → reason: new, changed and how, extended,
corrupt, misnamed, of an earlier layout, previously failed) and :func:`format_explanation`
(counts, one line per point, the cost). Reads the previous plan's sweep spec and the point stores; writes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgdsweep.errors import StoreError
from sgdsweep.store import packs
from sgdsweep.store.migrate import legacy_problem, legacy_stores
from sgdsweep.store.point_identity import HASH_ATTR, identity_problem
from sgdsweep.store.points import complete_points, failed_marker, point_path, read_attrs
from sgdsweep.sweep.config import Point, Sweep
from sgdsweep.sweep.cost import describe
from sgdsweep.sweep.plan import PlanFiles, axis_key
from sgdsweep.sweep.precision import extension_reasons


def explain(sweep: Sweep, done: set[str] | None = None) -> dict[str, str]:
    """Why each point without a complete store would be simulated (hash → reason); ``done``: the
    points with a complete store (:func:`sgdsweep.store.points.complete_points`), when the
    caller has just computed them.

    Reasons: ``extended`` (a round of a sweep with precision targets extends the point, and
    why: :func:`sgdsweep.sweep.precision.extension_reasons`), ``corrupt`` (a store exists but is
    incomplete or unreadable), ``misnamed`` (a complete store under the point's name is not its
    own: another point's results, copied or renamed there, or edited parameters; what differs is
    listed, and the store is moved to its own point's name or replaced when the point is
    simulated), ``earlier layout`` (its only store is of an earlier layout, which the run
    rewrites as ``.npz`` before it simulates anything: :mod:`sgdsweep.store.migrate`; a damaged
    one is ``corrupt``), ``previously failed`` (its last simulation raised; the error is
    quoted), ``changed`` (the previous plan had a point with the same axis values but other
    parameters; the differences are listed) or ``new``.
    Call it before the plan is rewritten (by the workflow's plan rules or :func:`write_plan`).
    """
    files = PlanFiles(sweep.directory)
    previous: dict[tuple, str] = {}
    try:
        for entry in json.loads(files.sweep_spec.read_text()).get("points", []):
            if "key" in entry:
                previous[tuple(entry["key"])] = entry["hash"]
    except (OSError, ValueError):
        pass
    reasons: dict[str, str] = {}
    if done is None:
        done = complete_points(files.points_dir, (p.hash for p in sweep.points))
    extended = extension_reasons(sweep)
    try:  # one listing: a point with no file of its own (the most, in a new sweep) needs no lookup
        present = {name.split(".", 1)[0] for name in os.listdir(files.points_dir)}
    except OSError:
        present = set()
    present |= set(packs.index(files.points_dir))
    legacy = legacy_stores(files.points_dir, (p.hash for p in sweep.points if p.hash not in done))
    for p in sweep.points:
        if p.hash in done:
            continue
        if p.hash in extended:
            reasons[p.hash] = "extended (" + extended[p.hash] + ")"
            continue
        old = previous.get(tuple(axis_key(p)))
        if p.hash not in present:
            reasons[p.hash] = "changed" + _param_diff(files.points_dir, old, p) if old not in (None, p.hash) else "new"
            continue
        store = point_path(files.points_dir, p.hash)
        marker = failed_marker(files.points_dir, p.hash)
        if store.exists():
            reasons[p.hash] = _store_problem(store, p)
        elif p.hash in legacy:
            earlier = legacy[p.hash][0]
            reasons[p.hash] = (f"earlier layout ({earlier.name}: rewritten as {store.name} when the run starts, "
                               "not simulated)" if legacy_problem(earlier) is None else
                               f"corrupt (incomplete or unreadable store of an earlier layout, {earlier.name}: "
                               "not migrated)")
        elif marker.exists():
            try:
                error = json.loads(marker.read_text()).get("error", "")
            except (OSError, ValueError):
                error = ""
            reasons[p.hash] = f"previously failed ({error})" if error else "previously failed"
        elif old is not None and old != p.hash:
            reasons[p.hash] = "changed" + _param_diff(files.points_dir, old, p)
        else:
            reasons[p.hash] = "new"
    return reasons


def _store_problem(store: Path, point: Point) -> str:
    """Why the existing store ``store`` does not count as ``point``'s: ``corrupt`` (incomplete or
    unreadable), or ``misnamed`` (:func:`sgdsweep.store.point_identity.identity_problem`) with
    the parameters in which the store's point differs from this one."""
    try:
        attrs = read_attrs(store)
    except StoreError:
        return "corrupt (incomplete or unreadable store)"
    why = identity_problem(point.hash, attrs)
    if why is None:  # complete and its own after all (written meanwhile)
        return "corrupt (incomplete or unreadable store)"
    held = attrs.get("params") if isinstance(attrs.get("params"), Mapping) else {}
    diffs = [f"{k} {' where this point has '.join(show_values(held.get(k), point.params.get(k)))}"
             for k in sorted(set(held) | set(point.params)) if held.get(k) != point.params.get(k)]
    other = attrs.get(HASH_ATTR)
    good = isinstance(other, str) and identity_problem(other, attrs) is None  # a good store of point `other`
    aside = f"moved to point {other}'s name if that point has no store, else replaced" if good else "replaced"
    return (f"misnamed ({store.name}: {why}" + (f": {', '.join(diffs)}" if diffs and held else "")
            + f"; the store is {aside} when this point is simulated)")


def _param_diff(points_dir: Path, old_hash: str, point: Point) -> str:
    try:
        old = read_attrs(point_path(points_dir, old_hash))["params"]
    except StoreError:
        return ""
    diffs = [f"{k} {' → '.join(show_values(old.get(k), point.params.get(k)))}"
             for k in sorted(set(old) | set(point.params)) if old.get(k) != point.params.get(k)]
    return f": {', '.join(diffs)}" if diffs else ""


def show_value(value: Any, digits: int = 5) -> str:
    """A parameter value as the plan prints it: a float to ``digits`` significant digits (``0.1``,
    not ``0.10000000000000002``), a mapping as ``{key: value, …}``, a list as ``[…]``, None as
    ``none``, anything else as its text."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show_value(v, digits)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_value(v, digits) for v in value) + "]"
    return str(value)


def show_values(old: Any, new: Any) -> tuple[str, str]:
    """Two different values as :func:`show_value` prints them, with more digits where 5 would
    print them alike (up to 17, which tell any two floats apart)."""
    for digits in (5, 9, 17):
        shown = show_value(old, digits), show_value(new, digits)
        if shown[0] != shown[1]:
            break
    return shown


def _shown_coordinate(shown: dict[tuple[str, type, Any], str], name: str, value: Any) -> str:
    """``name=value`` as :func:`show_value` prints it, kept in ``shown`` (by name, type and value:
    ``True``, ``1`` and ``1.0`` are equal keys otherwise; -0.0 never reaches a point's axes,
    which :func:`sgdsweep.sweep.grid.coerce` makes 0.0)."""
    try:
        key = (name, type(value), value)
        text = shown.get(key)
    except TypeError:  # a value that is not hashable (a mapping or list)
        return f"{name}={show_value(value)}"
    if text is None:
        text = shown[key] = f"{name}={show_value(value)}"
    return text


def format_explanation(sweep: Sweep, reasons: dict[str, str], verbose: bool = True,
                       max_lines: int | None = None, cost: bool = False) -> str:
    """Human-readable plan: counts by reason, then (verbose) one line per point to simulate
    (at most ``max_lines`` of them), then (``cost``) the estimated cost of simulating them
    (:func:`sgdsweep.sweep.cost.describe`: replica-steps, memory, and time at a kernel rate measured
    now)."""
    counts: dict[str, int] = {}
    for r in reasons.values():
        kind = r.split(" (")[0].split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    head = (f"sgdsweep plan for sweep '{sweep.name}': {len(sweep.points)} points, "
            f"{len(sweep.points) - len(reasons)} stored, {len(reasons)} to simulate")
    if counts:
        head += " (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")"
    if sweep.rounds:
        head += f"; round {sweep.rounds['round']} of its {sweep.rounds['kind']}"
    lines = [head]
    if verbose:
        by_hash = {p.hash: p for p in sweep.points}
        shown: dict[tuple[str, type, Any], str] = {}  # a sweep's points repeat each axis' few values
        for i, (h, reason) in enumerate(reasons.items()):
            if max_lines is not None and i >= max_lines:
                lines.append(f"  … and {len(reasons) - max_lines} more (sgdsweep plan CONFIG lists all)")
                break
            params = by_hash[h].params
            coords = ", ".join(_shown_coordinate(shown, c, params[c]) for c in sweep.coords if c in params)
            lines.append(f"  {h}  {coords}: {reason}")
    if cost:
        lines += describe(sweep, reasons)
    return "\n".join(lines)
