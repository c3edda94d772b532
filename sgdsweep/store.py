"""Per-point result stores: one Zarr (format 3) group per point, written atomically.

A point store is written into a temporary directory next to its final path and renamed into
place only when complete, so a killed run leaves either a complete store or nothing under the
final name. The group's attributes hold the point's identity (hash, parameters) and its scalar
summary; arrays hold per-replica values and matrices, with ``dimension_names`` so that
``xarray.open_zarr`` opens a point store too.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import zarr
import zarr.api.asynchronous
from zarr.storage import MemoryStore

from .errors import StoreError

#: Attribute that marks a store as complete (set last, before the rename).
COMPLETE_ATTR = "sgdsweep_complete"
#: Version of the point-store layout.
STORE_VERSION = 1
#: Chunk keys ``c.0.0`` beside the array's ``zarr.json``: one directory per array, where the
#: default ``c/0/0`` makes three (a point store is ~18 arrays of one chunk each, and a sweep
#: writes thousands of stores: directories are most of their file-system cost).
CHUNK_KEY_ENCODING = {"name": "default", "separator": "."}


def point_path(points_dir: str | Path, point_hash: str) -> Path:
    """Final path of a point's store."""
    return Path(points_dir) / f"{point_hash}.zarr"


def failed_marker(points_dir: str | Path, point_hash: str) -> Path:
    """File recording that simulating a point failed (removed when it succeeds)."""
    return Path(points_dir) / f"{point_hash}.failed.json"


def write_point(path: str | Path, arrays: Mapping[str, tuple[tuple[str, ...], np.ndarray]],
                attrs: Mapping[str, Any]) -> bool:
    """Write a point store atomically.

    Args:
        path: final path (``<hash>.zarr``).
        arrays: name → (dimension names, array) or (dimension names, array, attributes).
        attrs: JSON-serialisable group attributes (identity and summary).

    Returns:
        True if this call placed the store, False if a complete store was already there (it is
        kept: results are content-addressed, so an existing complete store is the same point).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_complete(path):
        return False
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    group_attrs = {**json.loads(json.dumps(dict(attrs))), "store_version": STORE_VERSION, COMPLETE_ATTR: True}
    try:
        files = _point_files(arrays, group_attrs)
        tmp.mkdir()
        for folder in sorted({os.path.dirname(k) for k in files} - {""}):  # parents sort first
            (tmp / folder).mkdir(exist_ok=True)
        for key in sorted(files, key=lambda k: k == "zarr.json"):  # the group's metadata last
            _write_file(tmp / key, files[key])
        if path.exists() and not is_complete(path):  # an incomplete leftover of a killed run
            shutil.rmtree(path)
        try:
            os.rename(tmp, path)
        except OSError:
            if is_complete(path):  # another task placed the same point meanwhile
                return False
            raise
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_file(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data`` (``os`` calls: a store is ~40 small files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


#: Array signature (name, dims, dtype, shape, attributes) → (its ``zarr.json`` bytes, chunk key,
#: or None for an empty array, which has no chunk), learnt from what Zarr wrote for the first
#: array of that signature in this process.
_TEMPLATES: dict[tuple, tuple[bytes, str | None]] = {}
#: Whether :func:`_group_json` rendered a group's ``zarr.json`` exactly as Zarr wrote it in this
#: process (checked on the first store Zarr builds).
_GROUP_JSON_CHECKED = [False]


def _group_json(group_attrs: Mapping[str, Any]) -> bytes:
    """A Zarr 3 group's ``zarr.json`` with ``group_attrs`` (JSON types only), as Zarr renders it."""
    return json.dumps({"attributes": group_attrs, "zarr_format": 3, "node_type": "group"}, indent=2,
                      allow_nan=True).encode()


def _point_files(arrays: Mapping[str, tuple], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files (Zarr key → bytes) of a point store.

    Once Zarr has written every array's signature in this process and its group metadata matched
    :func:`_group_json`, the store is assembled from those templates without Zarr: a sweep's
    point stores repeat the same arrays, and Zarr's event loop and metadata objects cost ~1 ms
    per store. Otherwise Zarr builds it (:func:`_encode`).
    """
    files: dict[str, bytes] = {}
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)
        template = _TEMPLATES.get(_signature(name, dims, data, dict(extra[0]) if extra else None))
        if template is None or not _GROUP_JSON_CHECKED[0] or data.dtype.byteorder not in "=<|":
            return asyncio.run(_encode(arrays, group_attrs))
        meta, chunk = template
        files[f"{name}/zarr.json"] = meta
        if chunk is not None:
            files[f"{name}/{chunk}"] = data.tobytes()  # C order whatever the layout
    files["zarr.json"] = _group_json(group_attrs)
    return files


def _signature(name: str, dims: tuple[str, ...], data: np.ndarray, attributes: Mapping[str, Any] | None) -> tuple:
    return (name, tuple(dims), data.dtype.str, data.shape, json.dumps(attributes, sort_keys=True, default=str))


async def _encode(arrays: Mapping[str, tuple], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files (Zarr key → bytes) of a point store, built by Zarr in memory.

    Zarr 3 spends milliseconds of Python per array and per synchronous call, and a sweep writes
    thousands of stores whose arrays repeat a few metadata documents. So the group is built by
    Zarr in a :class:`zarr.storage.MemoryStore` in one event loop, and an array whose signature
    (name, dimensions, dtype, shape, attributes) Zarr has already written in this process reuses
    that array's ``zarr.json`` with its one uncompressed chunk, ``data.tobytes()`` — a template
    is only kept after checking that Zarr's chunk for it was exactly those bytes. The keys are
    then written as files (what :class:`zarr.storage.LocalStore` does key by key).
    """
    contents: dict = {}
    group = await zarr.api.asynchronous.open_group(store=MemoryStore(contents), mode="w", zarr_format=3)
    files: dict[str, bytes] = {}
    built: list[tuple[str, tuple, np.ndarray]] = []
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)  # tobytes() is C order whatever the layout
        attributes = dict(extra[0]) if extra else None
        key = _signature(name, dims, data, attributes)
        if key in _TEMPLATES and data.dtype.byteorder in "=<|":
            meta, chunk = _TEMPLATES[key]
            files[f"{name}/zarr.json"] = meta
            if chunk is not None:
                files[f"{name}/{chunk}"] = data.tobytes()
            continue
        arr = await group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=data.shape or "auto",
                                       dimension_names=list(dims), compressors=None, attributes=attributes,
                                       chunk_key_encoding=CHUNK_KEY_ENCODING)
        await arr.setitem(Ellipsis, data)
        built.append((name, key, data))
    await group.update_attributes(group_attrs)
    files.update({k: buf.to_bytes() for k, buf in contents.items()})
    for name, key, data in built:  # learn templates from what Zarr wrote
        own = [k for k in contents if k.startswith(name + "/")]
        chunks = [k for k in own if k != f"{name}/zarr.json"]
        if len(own) == 2 and len(chunks) == 1 and files[chunks[0]] == data.tobytes():
            _TEMPLATES[key] = (files[f"{name}/zarr.json"], chunks[0][len(name) + 1:])
        elif own == [f"{name}/zarr.json"] and data.size == 0:
            _TEMPLATES[key] = (files[own[0]], None)
    _GROUP_JSON_CHECKED[0] = _GROUP_JSON_CHECKED[0] or files["zarr.json"] == _group_json(group_attrs)
    return files


def read_attrs(path: str | Path) -> dict[str, Any]:
    """The group attributes of a complete point store.

    Raises:
        StoreError: if the store is missing, unreadable or incomplete.
    """
    try:
        meta = json.loads((Path(path) / "zarr.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"point store {path} is missing or unreadable ({exc}); "
                         "rerun the workflow to recompute it") from None
    attrs = meta.get("attributes", {})
    if attrs.get(COMPLETE_ATTR) is not True:
        raise StoreError(f"point store {path} is incomplete; rerun the workflow to recompute it")
    return attrs


def read_array(path: str | Path, name: str) -> np.ndarray:
    """One array of a point store."""
    try:
        return zarr.open_array(str(Path(path) / name), mode="r")[...]
    except Exception as exc:  # zarr raises several types for missing/corrupt data
        raise StoreError(f"array {name!r} of point store {path} is unreadable ({exc}); "
                         "delete the store and rerun the workflow") from None


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` holds a complete point store (metadata readable and marked complete)."""
    try:
        read_attrs(path)
    except StoreError:
        return False
    return True


def complete_points(points_dir: str | Path, hashes: Iterable[str]) -> set[str]:
    """The hashes among ``hashes`` whose point store in ``points_dir`` is complete (one directory
    listing, then only the stores that exist are opened: planning 10⁴ points stays fast)."""
    try:
        present = set(os.listdir(points_dir))
    except FileNotFoundError:
        return set()
    return {h for h in hashes if f"{h}.zarr" in present and is_complete(point_path(points_dir, h))}


def has_array(path: str | Path, name: str) -> bool:
    """Whether the point store at ``path`` holds an array called ``name``."""
    return (Path(path) / name / "zarr.json").is_file()
