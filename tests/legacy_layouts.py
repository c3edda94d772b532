"""Point stores and exports in the layouts sgdsweep wrote before, written by the tests to check
that sgdsweep still reads them as carefully as before: a point store as a Zarr (format 3) group
(:func:`write_zarr_group` into a directory, :func:`zarr_group_keys` in memory, byte for byte the
same), and an export of schema 1 (:func:`as_schema1`, its point stores such groups)."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.share.archive import COMMENT_PREFIX, MANIFEST
from sgdsweep.store.points import PointStore


def _write_group(store: PointStore, target: Any) -> None:
    """Write the open point store ``store`` as a Zarr (format 3) group into ``target`` (a
    directory path or a Zarr store): one array per array of the store, with its dimension names
    and attributes and every chunk written (also one holding only the fill value, so that a
    missing chunk file means a lost one), then the group's attributes (so an interrupted write
    is not marked complete)."""
    import zarr

    group = zarr.open_group(target, mode="w-", zarr_format=3)
    for name in sorted(store.arrays):
        dims, attributes = store.arrays[name]
        data = store.read(name)
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=tuple(max(s, 1) for s in data.shape) or "auto",
                                 dimension_names=list(dims), compressors=None, attributes=attributes,
                                 config={"write_empty_chunks": True})
        arr[...] = data
    group.attrs.update(store.attrs)


def write_zarr_group(path: str | Path, directory: str | Path) -> None:
    """Write the point store at ``path`` (``.npz``, single or packed) as a Zarr (format 3) group in the new
    directory ``directory``, through Zarr's public API: one array per array of the store, with
    its dimension names and attributes and every chunk written (also one holding only the fill
    value, so that a missing chunk file means a lost one), then the group's attributes (so an
    interrupted write is not marked complete).
    :class:`~sgdsweep.store.point_copies.ZarrPointGroup` reads such a directory back.

    Raises: StoreError if the store is missing, damaged or incomplete; zarr's errors if
    ``directory`` exists.
    """
    with PointStore(path) as store:
        _write_group(store, str(directory))


#: (data type, number of dimensions) → the metadata Zarr writes for such an array (one written
#: through Zarr's API per kind, in memory), the template :func:`zarr_group_keys` fills in.
_TEMPLATES: dict[tuple[str, int], dict[str, Any]] = {}
_GROUP_TEMPLATE: dict[str, Any] = {}


def _template(dtype: np.dtype, ndim: int) -> dict[str, Any]:
    """Zarr's metadata (``zarr.json``, parsed) of an array of ``dtype`` with ``ndim`` dimensions,
    created through Zarr's public API as :func:`_write_group` creates one; and of a group."""
    key = (dtype.str, ndim)
    if key not in _TEMPLATES:
        import zarr
        from zarr.storage import MemoryStore

        memory: dict[str, Any] = {}
        group = zarr.open_group(MemoryStore(memory), mode="w-", zarr_format=3)
        group.create_array("a", shape=(1,) * ndim, dtype=dtype, chunks=(1,) * ndim or "auto",
                           dimension_names=["d"] * ndim, compressors=None, attributes={},
                           config={"write_empty_chunks": True})
        _TEMPLATES[key] = json.loads(memory["a/zarr.json"].to_bytes())
        _GROUP_TEMPLATE.update(json.loads(memory["zarr.json"].to_bytes()))
    return _TEMPLATES[key]


def _json(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, indent=2, allow_nan=True).encode()  # as Zarr writes its metadata


@functools.lru_cache(maxsize=4096)
def _array_metadata(dtype: str, shape: tuple[int, ...], dims: tuple[str, ...], attributes: str) -> bytes:
    """The ``zarr.json`` of an array of NumPy data type ``dtype`` (its ``str``), ``shape`` and
    dimension names ``dims``, one chunk, attributes ``attributes`` (JSON): :func:`_template` filled
    in. Cached: a sweep's point stores repeat the same few arrays, and encoding with Zarr's
    indentation is pure Python."""
    meta = copy.deepcopy(_template(np.dtype(dtype), len(shape)))
    meta["shape"] = list(shape)
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [max(s, 1) for s in shape]
    meta["attributes"] = json.loads(attributes)
    meta["dimension_names"] = list(dims)
    return _json(meta)


def zarr_group_keys(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The keys and values of the point store at ``path`` (single or packed) written as a Zarr
    (format 3) group, byte for byte what :func:`write_zarr_group` writes into a directory, in
    key order, without writing a file: each array's metadata is the one Zarr's own API writes for
    an array of its data type and rank (:func:`_template`, made once per kind) with its shape,
    chunks (one, the whole array), dimension names and attributes filled in, and its one chunk
    ``c/0/…`` its bytes in C order, little-endian, uncompressed (Zarr's ``bytes`` codec); an
    array with a zero-length dimension has no chunk."""
    keys: dict[str, bytes] = {}
    with PointStore(path) as store:
        for name in sorted(store.arrays):
            dims, attributes = store.arrays[name]
            data = store.read(name)
            keys[f"{name}/zarr.json"] = _array_metadata(data.dtype.str, data.shape, tuple(dims),
                                                        json.dumps(attributes, allow_nan=True))
            if data.size:
                little = data.astype(data.dtype.newbyteorder("<"), copy=False)
                keys[f"{name}/" + "/".join(["c", *("0" * data.ndim)])] = np.ascontiguousarray(little).tobytes()
        group = dict(_GROUP_TEMPLATE) if _GROUP_TEMPLATE else json.loads(_json(
            {"attributes": {}, "zarr_format": 3, "node_type": "group"}))
        group["attributes"] = store.attrs
        keys["zarr.json"] = _json(group)
    yield from sorted(keys.items())


def as_schema1(src: Path, dest: Path) -> Path:
    """``src`` (schema 2) rewritten as schema 1 exporters wrote it: every ``points/<hash>.npz``
    member replaced by its store's Zarr group keys, the manifest listing them, the schema version
    ``sgdsweep-export/1`` and the zip comment's checksum recomputed."""
    work = dest.with_name(f"{dest.stem}-stores")
    work.mkdir()
    with zipfile.ZipFile(src) as zin:
        manifest = json.loads(zin.read(MANIFEST))
        members = {n: zin.read(n) for n in zin.namelist() if n != MANIFEST}
    for h in manifest["points"]:
        store = work / f"{h}.npz"
        store.write_bytes(members.pop(f"points/{h}.npz"))
        manifest["members"].pop(f"points/{h}.npz")
        for key, data in zarr_group_keys(store):
            members[f"points/{h}.zarr/{key}"] = data
            manifest["members"][f"points/{h}.zarr/{key}"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                              "size": len(data)}
    manifest["schema_version"] = "sgdsweep-export/1"
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zout:
        for name, data in members.items():
            zout.writestr(name, data)
        zout.writestr(MANIFEST, text)
        zout.comment = COMMENT_PREFIX + hashlib.sha256(text).hexdigest().encode()
    return dest
