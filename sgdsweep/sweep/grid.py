"""Expanding the ``grid`` and ``points`` sections of a config into a list of points.

Lists form a cartesian product, except axes named together in a ``zip`` group, which move
together (their lists must have equal lengths). A single value is a fixed axis. Explicit
``points`` are added after the grid; a point takes every axis it does not set from the grid,
which must then hold a single value for it. The order of points is deterministic: axes in
:data:`GRID_KEYS` order, values in the order given, whatever the key order of the YAML.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from sgdsweep.core.identity import canonical_value
from sgdsweep.errors import ConfigError

#: The six named axes, in the order used for coordinates and point ordering.
AXES = ("lr", "batch_size", "momentum", "samples_per_param", "hidden_width", "noise")
#: Model and dynamics keys that may be gridded too.
EXTRA_GRID_KEYS = ("n_inputs", "label_noise", "steps", "replicas")
GRID_KEYS = AXES + EXTRA_GRID_KEYS
#: Keys whose numbers are floats: ``lr: 1`` and ``lr: 1.0`` are the same value.
FLOAT_KEYS = frozenset({"lr", "momentum", "samples_per_param", "label_noise", "burn_in_relaxations",
                        "divergence_threshold"})


#: Keys whose numbers are integers (JSON Schema also accepts 4.0 for an integer).
INT_KEYS = frozenset({"batch_size", "hidden_width", "n_inputs", "steps", "replicas", "seed", "burn_in"})


def coerce(key: str, value: Any) -> Any:
    """One type per key, so that equal values are equal (and hash alike): ``lr: 1`` is 0.1's
    kind (float), ``batch_size: 4.0`` is 4, and a float key's -0.0 is 0.0 (canonical JSON, and so
    a point's hash, would tell them apart)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if key in FLOAT_KEYS:
        return float(value) + 0.0  # -0.0 + 0.0 is 0.0; every other float unchanged
    if key in INT_KEYS and float(value).is_integer():
        return int(value)
    return value


def axis_values(grid: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Each grid key (``zip`` excluded) as a list of values, checked for duplicates.

    Axes in a zip group may repeat values (the group's tuples must be distinct, which the
    duplicate-point check enforces).
    """
    zipped = {name for group in grid.get("zip", []) for name in group}
    out: dict[str, list[Any]] = {}
    for key in GRID_KEYS:
        if key not in grid:
            continue
        value = grid[key]
        values = [coerce(key, v) for v in (list(value) if isinstance(value, list) else [value])]
        if key in zipped:
            out[key] = values
            continue
        seen: dict[Any, Any] = {}
        for v in values:
            canon = canonical_value(coerce(key, v))
            if canon in seen:
                raise ConfigError(f"grid.{key}", value, "distinct values",
                                  f"{seen[canon]!r} and {v!r} are the same value; remove one.")
            seen[canon] = v
        out[key] = values
    return out


def _zip_groups(grid: Mapping[str, Any], values: Mapping[str, list[Any]]) -> list[list[str]]:
    groups = grid.get("zip", [])
    used: dict[str, int] = {}
    for gi, group in enumerate(groups):
        for name in group:
            if name not in GRID_KEYS:
                raise ConfigError(f"grid.zip[{gi}]", name, "grid keys: " + ", ".join(GRID_KEYS))
            if name not in values:
                raise ConfigError(f"grid.zip[{gi}]", name, "axes that the grid sets",
                                  f"Add grid.{name} as a list, or remove it from the zip group.")
            if name in used:
                raise ConfigError(f"grid.zip[{gi}]", name, "each axis in at most one zip group",
                                  f"'{name}' is already in zip group {used[name]}.")
            used[name] = gi
        lengths = {name: len(values[name]) for name in group}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"grid.zip[{gi}]", group, "axes whose lists have equal lengths",
                              "Lengths: " + ", ".join(f"{k}={v}" for k, v in lengths.items()) + ".")
    return [list(g) for g in groups]


def expand(grid: Mapping[str, Any], points: list[Mapping[str, Any]],
           required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """All points of the sweep as ``{grid key: value}`` dicts (grid product first, then points).

    The grid product is part of the sweep unless explicit points are given and the grid alone
    does not make a complete point (it lacks one of ``required``): then the grid's values are
    only defaults for the points.

    Raises:
        ConfigError: duplicate values, bad zip groups, a point that leaves a swept axis unset.
    """
    values = axis_values(grid)
    groups = _zip_groups(grid, values)
    zipped = {name for g in groups for name in g}
    units: list[list[dict[str, Any]]] = []
    for key in GRID_KEYS:
        if key in values and key not in zipped:
            units.append([{key: v} for v in values[key]])
        group = next((g for g in groups if g[0] == key), None)
        if group is not None:
            units.append([dict(zip(group, combo)) for combo in zip(*(values[n] for n in group))])
    swept_lists = {k for k, v in values.items() if len(v) > 1}
    out: list[dict[str, Any]] = []
    if not points or swept_lists or all(k in values for k in required):
        for combo in itertools.product(*units):
            merged: dict[str, Any] = {}
            for part in combo:
                merged.update(part)
            out.append(merged)
    fixed = {k: v[0] for k, v in values.items() if len(v) == 1}
    for i, point in enumerate(points):
        for key in swept_lists:
            if key not in point:
                raise ConfigError(f"points[{i}]", dict(point), f"a value for '{key}'",
                                  f"The grid sweeps '{key}' as a list, so each explicit point must set it.")
        out.append({**fixed, **{k: coerce(k, v) for k, v in point.items()}})
    return out
