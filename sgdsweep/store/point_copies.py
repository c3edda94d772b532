"""Point stores copied to and from Zarr groups: what an export holds and an import reads back.

An export (:mod:`sgdsweep.store.share`) holds each point store as a Zarr (format 3) group,
written through Zarr's public API (:func:`write_zarr_group`, :func:`zarr_group_keys`); an import
writes such a group back as the point's ``.npz`` store (:func:`copy_point`). Any store layout is
read, single or packed (:class:`sgdsweep.store.points.PointStore`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.store.points import PointStore, write_point


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
    """Write the point store at ``path`` (any layout) as a Zarr (format 3) group in the new
    directory ``directory``, through Zarr's public API: one array per array of the store, with
    its dimension names and attributes and every chunk written (also one holding only the fill
    value, so that a missing chunk file means a lost one), then the group's attributes (so an
    interrupted write is not marked complete). :class:`PointStore` reads such a directory back
    (layout 1).

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


def zarr_group_keys(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The keys and values of the point store at ``path`` (any layout) written as a Zarr
    (format 3) group, byte for byte what :func:`write_zarr_group` writes into a directory, in
    key order, without writing a file: each array's metadata is the one Zarr's own API writes for
    an array of its data type and rank (:func:`_template`, made once per kind) with its shape,
    chunks (one, the whole array), dimension names and attributes filled in, and its one chunk
    ``c/0/…`` its bytes in C order, little-endian, uncompressed (Zarr's ``bytes`` codec); an
    array with a zero-length dimension has no chunk. A few milliseconds per point, where
    writing each array through Zarr took tens.

    Raises: StoreError if the store is missing, damaged or incomplete.
    """
    keys: dict[str, bytes] = {}
    with PointStore(path) as store:
        for name in sorted(store.arrays):
            dims, attributes = store.arrays[name]
            data = store.read(name)
            meta = copy.deepcopy(_template(data.dtype, data.ndim))
            meta["shape"] = list(data.shape)
            meta["chunk_grid"]["configuration"]["chunk_shape"] = [max(s, 1) for s in data.shape]
            meta["attributes"] = attributes
            meta["dimension_names"] = list(dims)
            keys[f"{name}/zarr.json"] = _json(meta)
            if data.size:
                little = data.astype(data.dtype.newbyteorder("<"), copy=False)
                keys[f"{name}/" + "/".join(["c", *("0" * data.ndim)])] = np.ascontiguousarray(little).tobytes()
        group = dict(_GROUP_TEMPLATE) if _GROUP_TEMPLATE else json.loads(_json(
            {"attributes": {}, "zarr_format": 3, "node_type": "group"}))
        group["attributes"] = store.attrs
        keys["zarr.json"] = _json(group)
    yield from sorted(keys.items())


def copy_point(source: str | Path, path: str | Path, require_chunks: bool = True) -> bool:
    """Write the point store at ``source`` (any layout; ``require_chunks`` as
    :class:`PointStore`) as the ``.npz`` store ``path`` (:func:`write_point`: atomic, a complete
    store there is kept). Returns what it returns.

    Raises: StoreError if ``source`` is missing, damaged or incomplete.
    """
    with PointStore(source, require_chunks=require_chunks) as store:
        arrays = {name: (dims, store.read(name), attributes) for name, (dims, attributes) in store.arrays.items()}
        return write_point(path, arrays, store.attrs)
