"""Stored lanes: the raw per-replica accumulators of a point that a later round may extend.

A point of a sweep with ``precision:`` keeps, beside its point store, the lanes it was computed
from (:func:`sgdsweep.sim.engine.run_lanes`'s output: one row per replica), in *parts*: the
replicas ``start … stop − 1`` of one point are ``points/lanes/<key>.<start>-<stop>.npz``, a
point store (:func:`sgdsweep.store.points.write_point`: atomic, checksummed, read without
pickle). ``key`` (:func:`lanes_key`) is the point's identity without its number of replicas, so
the parts of every round of one point share it. Replica r depends on nothing but the point and r
(:func:`sgdsweep.sweep.identity.replica_stream_key`), so the first R rows of the parts are
exactly the lanes a run of R replicas from the start would give: an extended point is computed
from them and the new replicas alone, never from a recomputation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sgdsweep.store import points as point_store
from sgdsweep.sweep.identity import content_hash

#: Subdirectory of the points directory that holds the parts.
LANES_DIR = "lanes"
_PART = re.compile(r"^([0-9a-f]{16})\.([0-9]+)-([0-9]+)\.npz$")


def lanes_key(params: Mapping[str, object]) -> str:
    """The key of a point's stored lanes: :func:`sgdsweep.sweep.identity.content_hash` of its
    parameters without ``replicas``."""
    return content_hash({k: v for k, v in params.items() if k != "replicas"})


def part_path(points_dir: str | Path, key: str, start: int, stop: int) -> Path:
    """Path of the part holding replicas ``start … stop − 1`` of the lanes ``key``."""
    return Path(points_dir) / LANES_DIR / f"{key}.{start}-{stop}.npz"


def write_part(points_dir: str | Path, key: str, start: int, lanes: Mapping[str, np.ndarray]) -> Path:
    """Store ``lanes`` (name → array whose first axis is the replica) as replicas ``start …``.

    Raises: as :func:`sgdsweep.store.points.write_point`.
    """
    sizes = {int(np.shape(v)[0]) for v in lanes.values()}
    if len(sizes) != 1:
        raise ValueError(f"lanes of unequal length {sorted(sizes)}: give one row per replica in every array")
    stop = start + sizes.pop()
    path = part_path(points_dir, key, start, stop)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: (("replica", *(f"{name}_{i}" for i in range(1, np.ndim(v)))), np.asarray(v))
              for name, v in lanes.items()}
    point_store.write_point(path, arrays, {"lanes_key": key, "start": start, "stop": stop})
    return path


def parts(points_dir: str | Path, key: str) -> list[tuple[int, int, Path]]:
    """The complete parts of the lanes ``key``, as (start, stop, path), by start."""
    directory = Path(points_dir) / LANES_DIR
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _PART.match(name)
        if m and m.group(1) == key and int(m.group(2)) < int(m.group(3)):
            path = directory / name
            if point_store.is_complete(path):
                found.append((int(m.group(2)), int(m.group(3)), path))
    return sorted(found)


def read_lanes(points_dir: str | Path, key: str, replicas: int) -> tuple[dict[str, np.ndarray], int]:
    """The stored lanes of replicas ``0 … n − 1`` for the largest ``n ≤ replicas`` that the
    parts cover without a gap, as one array per name; and ``n`` (0 and ``{}`` when none).

    Raises: StoreError if a part is damaged between listing and reading.
    """
    covered = 0
    pieces: list[dict[str, np.ndarray]] = []
    available = parts(points_dir, key)
    while covered < replicas:
        best = max((p for p in available if p[0] <= covered < p[1]), key=lambda p: p[1], default=None)
        if best is None:
            break
        start, stop, path = best
        with point_store.PointStore(path) as store:
            arrays = store.read_many(list(store.arrays))
        take = slice(covered - start, min(stop, replicas) - start)
        pieces.append({name: a[take] for name, a in arrays.items()})
        covered = min(stop, replicas)
    if not pieces:
        return {}, 0
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}, covered
