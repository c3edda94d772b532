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


def point_path(points_dir: str | Path, point_hash: str) -> Path:
    """Final path of a point's store."""
    return Path(points_dir) / f"{point_hash}.zarr"


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
        files = asyncio.run(_encode(arrays, group_attrs))
        for key in sorted(files, key=lambda k: k == "zarr.json"):  # the group's metadata last
            target = tmp / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[key])
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


async def _encode(arrays: Mapping[str, tuple], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files (Zarr key → bytes) of a point store, built by Zarr in memory.

    Zarr 3 spends milliseconds of Python per array and per synchronous call; building the whole
    group in a :class:`zarr.storage.MemoryStore` in one event loop and writing its keys as files
    (what :class:`zarr.storage.LocalStore` would do key by key) makes a point store about twice
    as fast to write (``benchmarks/pipeline.py``).
    """
    contents: dict = {}
    group = await zarr.api.asynchronous.open_group(store=MemoryStore(contents), mode="w", zarr_format=3)
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)
        arr = await group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=data.shape or "auto",
                                       dimension_names=list(dims), compressors=None,
                                       attributes=dict(extra[0]) if extra else None)
        await arr.setitem(Ellipsis, data)
    await group.update_attributes(group_attrs)
    return {key: buf.to_bytes() for key, buf in contents.items()}


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
