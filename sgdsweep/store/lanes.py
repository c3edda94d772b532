"""Stored lanes: the raw per-replica accumulators of a point that a later round may extend.

A point of a sweep with ``precision:`` keeps, beside its point store, the lanes it was computed
from (:func:`sgdsweep.sim.engine.run_lanes`'s output: one row per replica), in *parts*: the
replicas ``start … stop − 1`` of one point are ``points/lanes/<key>.<start>-<stop>.npz``, a
point store (:func:`sgdsweep.store.points.write_point`: atomic, checksummed, read without
pickle). ``key`` (:func:`lanes_key`) is the point's identity without its number of replicas, so
the parts of every round of one point share it. Replica r depends on nothing but the point and r
(:func:`sgdsweep.core.identity.replica_stream_key`), so the first R rows of the parts are
exactly the lanes a run of R replicas from the start would give: an extended point is computed
from them and the new replicas alone, never from a recomputation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sgdsweep.core.identity import content_hash
from sgdsweep.errors import StoreError
from sgdsweep.store import points as point_store

#: Subdirectory of the points directory that holds the parts.
LANES_DIR = "lanes"
#: Largest size of one part, bytes: a round's new replicas are written in as many parts as that
#: needs, each well below what a point store may hold.
PART_BYTES = point_store.MAX_POINT_BYTES // 4
_PART = re.compile(r"^([0-9a-f]{16})\.([0-9]+)-([0-9]+)\.npz$")


def lanes_key(params: Mapping[str, object]) -> str:
    """The key of a point's stored lanes: :func:`sgdsweep.core.identity.content_hash` of its
    parameters without ``replicas``."""
    return content_hash({k: v for k, v in params.items() if k != "replicas"})


def part_path(points_dir: str | Path, key: str, start: int, stop: int) -> Path:
    """Path of the part holding replicas ``start … stop − 1`` of the lanes ``key``."""
    return Path(points_dir) / LANES_DIR / f"{key}.{start}-{stop}.npz"


def write_part(points_dir: str | Path, key: str, start: int, lanes: Mapping[str, np.ndarray]) -> list[Path]:
    """Store ``lanes`` (name → array whose first axis is the replica) as replicas ``start …``, in
    parts of at most :data:`PART_BYTES` each (a point store larger than
    :data:`sgdsweep.store.points.MAX_POINT_BYTES` would be refused when read); return their paths.

    Raises: as :func:`sgdsweep.store.points.write_point`.
    """
    sizes = {int(np.shape(v)[0]) for v in lanes.values()}
    if len(sizes) != 1:
        raise ValueError(f"lanes of unequal length {sorted(sizes)}: give one row per replica in every array")
    rows = sizes.pop()
    row_bytes = max(1, sum(np.asarray(v).nbytes for v in lanes.values()) // max(1, rows))
    step = max(1, PART_BYTES // row_bytes)
    paths = []
    for a in range(0, rows, step):
        b = min(rows, a + step)
        path = part_path(points_dir, key, start + a, start + b)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {name: (("replica", *(f"{name}_{i}" for i in range(1, np.ndim(v)))), np.asarray(v)[a:b])
                  for name, v in lanes.items()}
        point_store.write_point(path, arrays, {"lanes_key": key, "start": start + a, "stop": start + b})
        paths.append(path)
    return paths


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


def stored_bytes(points_dir: str | Path) -> int:
    """Bytes that the stored lanes (every file under ``points_dir/lanes``) take now."""
    total = 0
    try:
        with os.scandir(Path(points_dir) / LANES_DIR) as it:
            for entry in it:
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except OSError:  # removed meanwhile
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return 0
    return total


def _checked(store: point_store.PointStore, key: str, start: int, stop: int,
             like: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The arrays of one part, after checking that it is what its name says: its attributes
    name ``key``, ``start`` and ``stop``, every array has ``stop − start`` rows, and its arrays
    have the names, dtypes and row shapes of ``like`` (the parts read before)."""
    attrs = store.attrs
    problem = None
    if (attrs.get("lanes_key"), attrs.get("start"), attrs.get("stop")) != (key, start, stop):
        problem = (f"it says it holds replicas {attrs.get('start')} … of lanes {attrs.get('lanes_key')}, "
                   f"its name replicas {start} … {stop - 1} of {key}")
    arrays = store.read_many(list(store.arrays)) if problem is None else {}
    for name, a in arrays.items():
        if a.ndim == 0 or a.shape[0] != stop - start:
            problem = f"array {name!r} has shape {a.shape}, not {stop - start} rows"
        elif like is not None and (name not in like or like[name].dtype != a.dtype
                                   or like[name].shape[1:] != a.shape[1:]):
            problem = f"array {name!r} ({a.dtype}, rows of shape {a.shape[1:]}) is not like the other parts'"
    if like is not None and problem is None and set(arrays) != set(like):
        problem = f"its arrays {sorted(arrays)} are not the other parts' {sorted(like)}"
    if problem is not None:
        raise StoreError(f"stored lanes {store.path} are not what their name says: {problem}. Delete the file "
                         "and rerun: the replicas it should hold are simulated again")
    return arrays


def read_lanes(points_dir: str | Path, key: str, replicas: int) -> tuple[dict[str, np.ndarray], int]:
    """The stored lanes of replicas ``0 … n − 1`` for the largest ``n ≤ replicas`` that the
    parts cover without a gap, as one array per name; and ``n`` (0 and ``{}`` when none).

    Raises:
        StoreError: a part that is not what its name says (another point's, other rows, other
            arrays or dtypes than the other parts), naming it; or one damaged between listing and
            reading.
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
            arrays = _checked(store, key, start, stop, pieces[0] if pieces else None)
        take = slice(covered - start, min(stop, replicas) - start)
        pieces.append({name: a[take] for name, a in arrays.items()})
        covered = min(stop, replicas)
    if not pieces:
        return {}, 0
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}, covered
