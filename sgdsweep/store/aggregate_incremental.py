"""Incremental aggregation: an ensemble grown by the points a sweep added, reading only their stores.

:func:`update_ensemble` is what the workflow's aggregate job runs. When the sweep spec lists the
points of the existing ensemble first, in the same order, followed by k new ones, it *appends*
the k rows: only the k new point stores are read (plus the first old one, for the swept axes),
the rows are built exactly as :func:`sgdsweep.store.aggregate.build_ensemble` builds them, and
written through Zarr's public API (``Array.append`` along ``point``). Otherwise it rebuilds the
ensemble from every point store, and says why.

Equality: an appended ensemble holds exactly what a full rebuild from the same sweep spec holds,
bit for bit: every array (values, data type, fill value, chunks, codecs with each chunk's CRC-32C)
and every attribute, but the time of writing (the provenance's ``created_utc``, and ``history``,
which names it). Chunks along ``point`` do not depend on the number of points
(:func:`sgdsweep.store.aggregate.ensemble_chunks`), so the rows appended fill the last chunk and
new ones, as a full write would.

When it rebuilds instead (the reason is returned and logged): no ensemble yet; the ensemble fails
its integrity check (:func:`sgdsweep.store.integrity.check_ensemble`) or a chunk its CRC-32C;
another sweep, or a simulation config changed in more than its ``grid`` and ``points`` (seed,
model, dynamics: which would change every point's identity too); points removed, reordered or
changed (the
old points are not the first of the spec, in order); nothing to add; the new points' variables,
data types, attributes or widths (replicas, modes, lags…) beyond the ensemble's, or the
ensemble's chunks or codecs not what this version writes (an ensemble written by an earlier one).
A point recomputed under the same identity (a damaged store simulated again) keeps its row: the
same numbers, its first ``simulation_seconds``.

Atomicity: the ensemble in place is never written to. The grown one is made in a temporary
directory beside it, ``.<name>.tmp-*`` (the chunk files that the append leaves alone hard-linked
from the old ensemble, the others copied: Zarr writes only copies), checked, its metadata digests
recorded (:func:`sgdsweep.store.integrity.record_metadata`), and renamed into place as
:func:`sgdsweep.store.aggregate.write_ensemble` does. A failed or killed append leaves the old
ensemble as it was; what it left beside it is removed by the next write.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from sgdsweep.core.identity import points_digest
from sgdsweep.errors import StoreError
from sgdsweep.store import aggregate
from sgdsweep.store import points as point_store
from sgdsweep.store.integrity import METADATA_ATTR, check_ensemble, record_metadata

log = logging.getLogger(__name__)

#: Variable attributes that gather values over all points, " | "-joined (merged when appending).
JOINED_ATTRS = ("formula", "missing_because")
#: Root attributes of the time of writing: the appended ensemble has those of the append.
TIME_ATTRS = ("created_utc", "history")
#: Root attributes of the machine that writes (host, devices, Python): those of the append, as a
#: full rebuild now would have.
PROVENANCE_ATTRS = ("host", "devices", "python")
#: Sections of the simulation config that adding points changes (and with them ``sweep_hash``).
GRID_SECTIONS = ("grid", "points")
#: Root attributes of the sweep spec as a whole (its ``sweep_hash`` and simulation config, grid
#: included): the spec's, as a full rebuild has them.
SPEC_ATTRS = ("sweep_hash", "config")
#: Root attributes naming the code that wrote the ensemble: another version rebuilds it.
VERSION_ATTRS = ("code_version", "package_versions")


class _Rebuild(Exception):
    """The ensemble cannot be appended to; the message says why."""


def update_ensemble(sweep_spec: dict[str, Any], path: str | Path) -> tuple[int, str]:
    """Make ``path`` the ensemble of ``sweep_spec`` (``plan/sweep.json``): append the new points'
    rows to the ensemble there when it holds the spec's first points, else rebuild it whole
    (module docstring). Returns the number of points and what was done (``appended k points``
    or ``rebuilt: <why>``).

    Raises:
        StoreError: a point store to read is missing, damaged or not its point's own (as
            :func:`sgdsweep.store.aggregate.build_ensemble`).
    """
    path = Path(path)
    n = len(sweep_spec["points"])
    try:
        k = append_points(sweep_spec, path)
        return n, f"appended {k} point{'s' if k != 1 else ''}"
    except _Rebuild as why:
        aggregate.write_ensemble(aggregate.build_ensemble(sweep_spec), path)
        return n, f"rebuilt: {why}"


def _old_points(sweep_spec: dict[str, Any], path: Path) -> tuple[zarr.Group, list[str]]:
    """The ensemble's group and its point hashes, once it is found fit to append to.

    Raises: _Rebuild saying why it is not."""
    if not path.exists():
        raise _Rebuild(f"no ensemble at {path} yet")
    try:
        check_ensemble(path)
        group = zarr.open_group(str(path), mode="r")
        attrs = group.attrs.asdict()
        if METADATA_ATTR not in attrs:
            raise _Rebuild("the ensemble carries no record of its metadata (written by an earlier sgdsweep)")
        if (attrs.get("sweep") != sweep_spec["sweep"]
                or _fixed(json.loads(attrs.get("config", "null"))) != _fixed(sweep_spec["simulation_config"])):
            raise _Rebuild("the sweep or its simulation config other than the grid (seed, model, dynamics) changed")
        for name, arr in group.arrays():  # every chunk's CRC-32C: a damaged one is not carried over
            arr[...]
        old = [str(h) for h in group["point"][...]]
    except _Rebuild:
        raise
    except zarr.errors.NodeNotFoundError:
        raise _Rebuild(f"{path} is no ensemble") from None
    except (StoreError, OSError, ValueError, KeyError, TypeError) as exc:
        raise _Rebuild(f"the ensemble is damaged ({str(exc).splitlines()[0]})") from None
    hashes = [e["hash"] for e in sweep_spec["points"]]
    if hashes[: len(old)] != old:
        raise _Rebuild("points were removed, reordered or changed")
    if len(hashes) == len(old):
        raise _Rebuild("no point to add")
    return group, old


def _fixed(config: Any) -> Any:
    """A simulation config (the ensemble's ``config`` attribute) without what adding points
    changes: its ``grid`` and ``points``."""
    return {k: v for k, v in config.items() if k not in GRID_SECTIONS} if isinstance(config, dict) else config


def append_points(sweep_spec: dict[str, Any], path: Path) -> int:
    """Append the rows of the points ``sweep_spec`` lists after those of the ensemble at ``path``
    (module docstring); return how many.

    Raises:
        _Rebuild: the ensemble cannot be appended to (why).
        StoreError: a new point's store is missing, damaged or not its own.
    """
    group, old = _old_points(sweep_spec, path)
    n_old, entries = len(old), sweep_spec["points"]
    k = len(entries) - n_old
    rows_store = zarr.storage.MemoryStore()  # the new rows, written as a whole ensemble is
    aggregate.write_zarr(aggregate.build_ensemble({**sweep_spec, "points": entries[n_old:]}), rows_store)
    rows = zarr.open_group(rows_store, mode="r")
    plan = _plan(group, rows, n_old, k)
    root_attrs = _root_attributes(sweep_spec, group, rows, n_old, k)
    aggregate.remove_orphan_temporaries(path, older_than=point_store.STALE_TEMPORARY_SECONDS)
    work = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        _replicate(path, work, group, n_old, rewrite={"shard"})
        with zarr.config.set({"array.write_empty_chunks": True}):
            grown = zarr.open_group(str(work), mode="r+", use_consolidated=False)
            for name, (axis, data, attrs) in plan.items():
                arr = grown[name]
                arr.append(data, axis=axis)
                if attrs != arr.attrs.asdict():
                    arr.attrs.put(attrs)
            shards = np.array([e["shard"] for e in entries], dtype=object)
            if "shard" in plan and not np.array_equal(grown["shard"][...].astype(object), shards):
                grown["shard"][...] = shards  # the plan may move old points to other shards
            grown.attrs.put(root_attrs)
        zarr.consolidate_metadata(str(work))
        record_metadata(work)
        check_ensemble(work)
        _replace(work, path)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    aggregate.remove_orphan_temporaries(path, older_than=0.0)
    return k


def _plan(group: zarr.Group, rows: zarr.Group, n_old: int, k: int) -> dict[str, tuple[int, np.ndarray, dict]]:
    """For each array along ``point``: its axis, the new rows as stored (padded to the ensemble's
    widths) and its attributes merged.

    Raises: _Rebuild when the rows differ from the ensemble in kind (variables, data types,
    fill values, codecs, chunks, attributes) or are wider."""
    old_arrays = dict(group.arrays())
    new_arrays = dict(rows.arrays())
    if set(old_arrays) != set(new_arrays):
        differ = sorted(set(old_arrays) ^ set(new_arrays))
        raise _Rebuild(f"the new points' variables differ from the ensemble's ({', '.join(differ[:5])})")
    plan = {}
    for name, new in new_arrays.items():
        arr = old_arrays[name]
        dims = tuple(arr.metadata.dimension_names or ())
        if dims != tuple(new.metadata.dimension_names or ()):
            raise _Rebuild(f"array '{name}' has other dimensions in the new points")
        if arr.dtype != new.dtype or not _same(arr.metadata.fill_value, new.metadata.fill_value):
            raise _Rebuild(f"array '{name}' has another data type or fill value in the new points")
        if [c.to_dict() for c in arr.compressors] != [c.to_dict() for c in new.compressors]:
            raise _Rebuild(f"array '{name}' has other codecs than this version writes")
        if "point" not in dims:
            if any(s < t for s, t in zip(arr.shape, new.shape)):
                raise _Rebuild(f"the new points are wider along {dims} than the ensemble ('{name}')")
            continue
        itemsize = 16 if arr.dtype.kind in "OUST" else arr.dtype.itemsize
        if tuple(arr.chunks) != aggregate.ensemble_chunks(dims, arr.shape, itemsize):
            raise _Rebuild(f"array '{name}' is chunked unlike what this version writes")
        axis = dims.index("point")
        data = new[...]
        widths = [(0, 0 if d == "point" else s - t) for d, s, t in zip(dims, arr.shape, new.shape)]
        if any(w < 0 for _, w in widths):
            raise _Rebuild(f"the new points are wider along {dims} than the ensemble ('{name}')")
        if any(w for _, w in widths):
            if data.dtype.kind not in "if":
                raise _Rebuild(f"array '{name}' of the new points is narrower and holds no numbers")
            data = np.pad(data, widths, constant_values=-1 if data.dtype.kind == "i" else np.nan)
        plan[name] = (axis, data, _merged_attributes(name, arr.attrs.asdict(), new.attrs.asdict()))
    return plan


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    except TypeError:
        return bool(np.asarray(a) == np.asarray(b))


def _merged_attributes(name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The attributes of array ``name`` over the old and the new points: each of
    :data:`JOINED_ATTRS` the sorted union of both; every other one the same in both.

    Raises: _Rebuild when another attribute differs."""
    merged = dict(old)
    for key in sorted(set(old) | set(new)):
        if key in JOINED_ATTRS:
            parts = {p for v in (old.get(key), new.get(key)) if v for p in str(v).split(" | ")}
            merged[key] = " | ".join(sorted(parts))
        elif old.get(key) != new.get(key):
            raise _Rebuild(f"attribute '{key}' of '{name}' differs in the new points")
    return merged


def _root_attributes(sweep_spec: dict[str, Any], group: zarr.Group, rows: zarr.Group, n_old: int,
                     k: int) -> dict[str, Any]:
    """The root attributes a full rebuild of ``sweep_spec`` writes, from the ensemble's and the
    new rows' (which :func:`sgdsweep.store.aggregate.build_ensemble` made of the new points alone).

    Raises: _Rebuild when an attribute differs in a way not merged here."""
    before, after = group.attrs.asdict(), rows.attrs.asdict()
    before.pop(METADATA_ATTR, None)
    after.pop(METADATA_ATTR, None)
    n = n_old + k
    for key in VERSION_ATTRS:
        if before.get(key) != after.get(key):
            raise _Rebuild(f"the ensemble was written by another version of sgdsweep or of its packages ('{key}')")
    merged: dict[str, Any] = {}
    for key in sorted(set(before) | set(after)):
        value = after.get(key)
        if key in PROVENANCE_ATTRS or key in TIME_ATTRS or key in SPEC_ATTRS:
            merged[key] = _recount(value, k, n) if isinstance(value, str) else value
        elif key == "points_digest":
            merged[key] = points_digest(e["hash"] for e in sweep_spec["points"])
        elif key == "swept_axes":
            merged[key] = json.dumps(_swept(sweep_spec, before, after, n_old))
        elif value == before.get(key):
            merged[key] = value
        elif isinstance(value, str) and _recount(value, k, n) == _recount(str(before.get(key)), n_old, n):
            merged[key] = _recount(value, k, n)
        else:
            raise _Rebuild(f"the ensemble's attribute '{key}' differs from the new points'")
    return merged


def _recount(text: str, count: int, total: int) -> str:
    """``text`` with each ``<count> point`` (as in a title, ``(12 points, …``) saying ``<total> point``."""
    return re.sub(rf"(?<![\d.]){count}( point)", rf"{total}\1", text)


def _swept(sweep_spec: dict[str, Any], before: dict[str, Any], after: dict[str, Any], n_old: int) -> list[str]:
    """The axes with more than one value over the old and the new points (``swept_axes``): those
    of either, and those whose one value differs between them (compared as
    :func:`~sgdsweep.store.aggregate.build_ensemble` compares them, as text, read from the first
    old and the first new point's store)."""
    swept = set(json.loads(before.get("swept_axes", "[]"))) | set(json.loads(after.get("swept_axes", "[]")))
    points_dir, entries = sweep_spec["points_dir"], sweep_spec["points"]
    one_old, one_new = (point_store.read_attrs(point_store.point_path(points_dir, entries[i]["hash"]))["params"]
                        for i in (0, n_old))
    return [c for c in sweep_spec["coords"] if c in swept or str(one_old.get(c)) != str(one_new.get(c))]


def _replicate(path: Path, work: Path, group: zarr.Group, n_old: int, rewrite: set[str]) -> None:
    """``work``: a copy of the ensemble at ``path`` in which appending rows writes only copies.
    The chunk files of an array along ``point`` that lie wholly before row ``n_old`` (which an
    append leaves alone) are hard links to the ensemble's, but those of the arrays in ``rewrite``;
    every other file is copied (all of them where the file system has no hard links)."""
    linked: set[str] = set()
    for name, arr in group.arrays():
        dims = tuple(arr.metadata.dimension_names or ())
        if "point" not in dims or name in rewrite:
            continue
        axis, rows = dims.index("point"), arr.chunks[dims.index("point")]
        for coords in np.ndindex(*arr.cdata_shape):
            if (coords[axis] + 1) * rows <= n_old:
                linked.add(f"{name}/{arr.metadata.encode_chunk_key(coords)}")
    can_link = True
    for directory, _, files in os.walk(path):
        rel = Path(directory).relative_to(path)
        (work / rel).mkdir(parents=True, exist_ok=True)
        for file in files:
            source, target = Path(directory) / file, work / rel / file
            if can_link and (rel / file).as_posix() in linked:
                try:
                    os.link(source, target)
                    continue
                except OSError:  # no hard links here: copy
                    can_link = False
            shutil.copy2(source, target)


def _replace(work: Path, path: Path) -> None:
    """Rename ``work`` to ``path``, the ensemble there moved aside first and removed after."""
    old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(path, old)
    os.rename(work, path)
    shutil.rmtree(old, ignore_errors=True)
